"""``InProcessReadingService``: run the graph in the calling process."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from conveyor.graph import apply_random_seed
from conveyor.pipes.base import DataPipe, IterDataPipe, check_int
from conveyor.pipes.prefetch import Prefetcher
from conveyor.random import SeedGenerator
from conveyor.reading_service.interface import CheckpointableReadingServiceInterface, IterResetFn
from conveyor.state import capture_graph_state, load_graph_state, require_keys, validate_graph_state
from conveyor.worker_info import WorkerInfo

InitFn = Callable[[DataPipe, WorkerInfo], DataPipe]
ResetFn = Callable[[DataPipe, WorkerInfo, SeedGenerator], DataPipe]

_IN_PROCESS = WorkerInfo(num_workers=1, worker_id=0)


class InProcessReadingService(CheckpointableReadingServiceInterface):
    """Reads the graph in this process, optionally ``prefetch_cnt`` items ahead in a thread.

    ``init_fn(graph, worker_info)`` runs once and ``reset_fn(graph, worker_info,
    seed_generator)`` at each epoch, with ``WorkerInfo(1, 0)``; each returns the graph.
    Global RNGs (``random``, numpy, torch) are left alone.
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
        self._prefetcher: Prefetcher | None = None

    def initialize(self, datapipe: DataPipe) -> DataPipe:
        graph = self.init_fn(datapipe, _IN_PROCESS) if self.init_fn else datapipe
        if not isinstance(graph, IterDataPipe):
            raise TypeError(f"init_fn must return an IterDataPipe, got {type(graph).__name__}")
        self._graph = graph
        if self.prefetch_cnt:
            self._prefetcher = Prefetcher(graph, self.prefetch_cnt)
            return self._prefetcher
        return graph

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
        graph = self._require_graph()
        if self._prefetcher is not None:
            snapshot = self._prefetcher.state_dict()["upstream"]
            if snapshot is not None:
                return {"graph": snapshot}
        return {"graph": capture_graph_state(graph)}

    def validate_checkpoint(self, datapipe: DataPipe, state: Any) -> None:
        require_keys(state, {"graph": dict}, "InProcessReadingService state")
        if self.init_fn is None:  # otherwise the graph to check exists after init_fn only
            validate_graph_state(datapipe, state["graph"], "InProcessReadingService state")

    def restore(self, datapipe: DataPipe, state: Any) -> DataPipe:
        self.validate_checkpoint(datapipe, state)
        end = self.initialize(datapipe)
        graph = self._require_graph()
        if self._prefetcher is not None:
            self._prefetcher.load_state_dict({"upstream": state["graph"]})
        else:
            load_graph_state(graph, state["graph"], "InProcessReadingService state")
        return end

    def finalize(self) -> None:
        self._graph, self._prefetcher = None, None

    def _require_graph(self) -> DataPipe:
        if self._graph is None:
            raise RuntimeError("InProcessReadingService is not initialized; iterate the loader first")
        return self._graph
