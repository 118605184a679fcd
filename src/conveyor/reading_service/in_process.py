"""``InProcessReadingService``: run the graph in the calling process."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from conveyor.core.base import DataPipe, IterDataPipe
from conveyor.core.graph import apply_random_seed
from conveyor.core.passes import State
from conveyor.core.random import SeedGenerator
from conveyor.core.validation import check_int, require_keys, require_non_negative
from conveyor.core.worker_info import WorkerInfo
from conveyor.pipes.prefetch import Prefetcher
from conveyor.reading_service.elastic import check_elastic_part, is_elastic, resumed_pipeline
from conveyor.reading_service.interface import CheckpointableReadingServiceInterface, IterResetFn

InitFn = Callable[[DataPipe, WorkerInfo], DataPipe]
ResetFn = Callable[[DataPipe, WorkerInfo, SeedGenerator], DataPipe]

_IN_PROCESS = WorkerInfo(num_workers=1, worker_id=0)
_WHERE = "InProcessReadingService state"


class InProcessReadingService(CheckpointableReadingServiceInterface):
    """Reads the graph in this process, optionally ``prefetch_cnt`` items ahead in a thread.

    ``init_fn(graph, worker_info)`` runs once and ``reset_fn(graph, worker_info,
    seed_generator)`` at each epoch, with ``WorkerInfo(1, 0)``; each returns the graph.
    Global RNGs (``random``, numpy, torch) are left alone.

    Args:
        prefetch_cnt: Items a thread reads ahead of the consumer; 0: no thread, items are read on
            ``next()``.
        init_fn: Called as ``init_fn(graph, worker_info)`` once; returns the graph to read.
        reset_fn: Called as ``reset_fn(graph, worker_info, seed_generator)`` at each epoch; returns
            the graph.
    """

    def __init__(
        self,
        prefetch_cnt: int = 0,
        init_fn: InitFn | None = None,
        reset_fn: ResetFn | None = None,
    ):
        check_int("prefetch_cnt", prefetch_cnt, 0)
        self.prefetch_cnt = prefetch_cnt
        self.init_fn = init_fn
        self.reset_fn = reset_fn
        self._graph: DataPipe | None = None  # the user's graph as adapted by init_fn

    def initialize(self, datapipe: DataPipe) -> DataPipe:
        graph = self.init_fn(datapipe, _IN_PROCESS) if self.init_fn else datapipe
        if not isinstance(graph, IterDataPipe):
            raise TypeError(f"init_fn must return an IterDataPipe, got {type(graph).__name__}")
        self._graph = graph
        return Prefetcher(graph, self.prefetch_cnt) if self.prefetch_cnt else graph

    def preview(self, datapipe: DataPipe) -> DataPipe | None:
        if self.init_fn is not None or not isinstance(datapipe, IterDataPipe):
            return None  # init_fn builds the graph: it is known once it ran
        graph = copy.deepcopy(datapipe)
        return Prefetcher(graph, self.prefetch_cnt) if self.prefetch_cnt else graph

    def initialize_iteration(
        self, seed_generator: SeedGenerator, iter_reset_fn: IterResetFn | None = None
    ) -> IterResetFn | None:
        graph = self._require_graph()
        apply_random_seed(graph, seed_generator)
        if self.reset_fn is not None:
            reset = self.reset_fn(graph, _IN_PROCESS, seed_generator)
            if reset is not graph:
                raise ValueError("reset_fn must return the graph it was given (changed in place)")
        return iter_reset_fn

    def checkpoint(self) -> dict[str, Any]:
        self._require_graph()
        return {"prefetch_cnt": self.prefetch_cnt}

    def validate_checkpoint(self, datapipe: DataPipe, state: Any) -> None:
        if is_elastic(state):  # merged from several ranks: this process reads what is left
            check_elastic_part(state, _WHERE)
            return
        require_keys(state, {"prefetch_cnt": int}, _WHERE)
        require_non_negative(state, "prefetch_cnt", _WHERE)

    def adapt_pipeline_state(
        self, datapipe: DataPipe, pipeline: State | None, position: list[int] | None, state: Any
    ) -> State | None:
        """A state saved with read-ahead resumes without it, and the other way round: the
        read-ahead's state is the graph's state behind the last item handed out. A state
        merged from several ranks resumes what they left, in one process."""
        if is_elastic(state):
            graph = datapipe.source if self.prefetch_cnt and isinstance(datapipe, Prefetcher) else datapipe
            if not isinstance(graph, IterDataPipe):
                raise TypeError(f"expected an IterDataPipe, got {type(graph).__name__}")
            pipeline = resumed_pipeline(graph, check_elastic_part(state, _WHERE), _WHERE)
            return {"source": pipeline} if self.prefetch_cnt and pipeline is not None else pipeline
        if pipeline is None or bool(state["prefetch_cnt"]) == bool(self.prefetch_cnt):
            return pipeline
        if self.prefetch_cnt:
            return {"source": pipeline}
        require_keys(pipeline, {"source": dict}, f"{_WHERE} (read-ahead)")
        return pipeline["source"]

    def restore(self, datapipe: DataPipe, state: Any) -> DataPipe:
        self.validate_checkpoint(datapipe, state)
        return self.initialize(datapipe)

    def finalize(self) -> None:
        self._graph = None

    def _require_graph(self) -> DataPipe:
        if self._graph is None:
            raise RuntimeError("InProcessReadingService is not initialized; iterate the loader first")
        return self._graph
