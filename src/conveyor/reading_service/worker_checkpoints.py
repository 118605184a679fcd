"""Checkpoints of :class:`~conveyor.reading_service.multiprocessing.MultiProcessingReadingService`:
its own part of a state, and a pipeline state saved with one worker count (or merged from
several ranks) laid out for another.

Every item carries its worker's state; the pipeline state holds, per worker, the state
after the last item handed to the user, plus where the merge is. It resumes exactly with
the same ``num_workers``, and with any other for per-item pipelines merged in order (see
:mod:`conveyor.reading_service.worker_states`).
"""

from __future__ import annotations

from typing import Any

from conveyor.core.base import DataPipe, IterDataPipe
from conveyor.core.dispatch import ShardingRoundRobinDispatcher
from conveyor.core.graph import list_dps
from conveyor.core.passes import State
from conveyor.core.validation import require_keys, require_position
from conveyor.errors import StateError
from conveyor.reading_service.elastic import ElasticPart, check_elastic_part, is_elastic, resumed_pipeline
from conveyor.reading_service.graph_split import adds_sub_positions, is_per_item, keeps_position_order, split_replicable
from conveyor.reading_service.worker_states import check_saved_workers, resplit
from conveyor.workers.child.dispatch import DispatchedSource
from conveyor.workers.parent.merged_output import MergedWorkerOutput


class WorkerCheckpoints:
    """The checkpoint methods of the multiprocessing service (a mixin: it reads the
    service's ``num_workers``, ``in_order`` and its worker graph)."""

    num_workers: Any
    in_order: bool
    _worker_graph: IterDataPipe | None

    def _require_end(self) -> IterDataPipe:
        raise NotImplementedError

    # Whether the worker graph is resplittable, and what it was worked out for: it walks the
    # graph several times, and a checkpoint may be taken after every item.
    _per_item_for: tuple[IterDataPipe, Any, bool, bool] | None = None

    def checkpoint(self) -> dict[str, Any]:
        self._require_end()
        graph = self._worker_graph
        assert graph is not None
        known = self._per_item_for
        if known is None or known[0] is not graph or known[1:3] != (self.num_workers, self.in_order):
            known = self._per_item_for = (graph, self.num_workers, self.in_order, self._resplittable(graph))
        return {"num_workers": self.num_workers, "per_item": known[3]}

    def _resplittable(self, worker_graph: IterDataPipe) -> bool:
        """Whether the workers hand items out in single-process order (so that another
        worker count can pick up from the last item): only a per-item graph merged in
        position order does. A state of this run resumes on another worker count when,
        besides, no main-process op holds the workers' part from an earlier point
        (fullsync's window start): that is a property of the state, checked on loading."""
        # A dispatched per-item graph qualifies too when no op expands an item into several:
        # every new worker's dispatched source then starts after the last item handed out,
        # where the dispatcher reopens its input. (One expanding an item holds it from
        # before, to replay it, and only one new worker is fed it again.)
        dispatching = self.num_workers > 0 and any(isinstance(n, DispatchedSource) for n in list_dps(worker_graph))
        return (
            is_per_item(worker_graph)
            and not (dispatching and adds_sub_positions(worker_graph))
            and (self.num_workers == 0 or (self.in_order and keeps_position_order(worker_graph)))
        )

    def validate_checkpoint(self, datapipe: DataPipe, state: Any) -> None:
        if is_elastic(state):  # merged from several ranks: any worker count resumes it
            check_elastic_part(state, "MultiProcessingReadingService state")
            return
        require_keys(state, {"num_workers": int, "per_item": bool}, "MultiProcessingReadingService state")
        if state["num_workers"] < 0:
            raise StateError("MultiProcessingReadingService state: num_workers must be >= 0")

    def adapt_pipeline_state(
        self, datapipe: DataPipe, pipeline: State | None, position: list[int] | None, state: Any
    ) -> State | None:
        """Re-split a per-item pipeline's state saved with another worker count (see
        :mod:`conveyor.reading_service.worker_states`); refuse any other. A state merged
        from several ranks is laid out for no workers, then re-split the same way."""
        where = "MultiProcessingReadingService state"
        if is_elastic(state):
            return self._adapt_merged(datapipe, pipeline, check_elastic_part(state, where), where)
        saved = state["num_workers"]
        if pipeline is None or saved == self.num_workers:
            return pipeline
        if not isinstance(datapipe, IterDataPipe):
            raise TypeError(f"expected an IterDataPipe, got {type(datapipe).__name__}")
        bottom, tail = split_replicable(datapipe)
        worker_graph = bottom._worker_graph if isinstance(bottom, MergedWorkerOutput) else bottom
        if not (state["per_item"] and self._resplittable(worker_graph)):
            raise StateError(
                f"{where}: saved with num_workers={saved}, now {self.num_workers}; only a per-item "
                "pipeline merged in order resumes on another worker count (this one groups items per "
                "worker after sharding_filter (batch, shuffle, header, ...), dispatches, or was read "
                f"with in_order=False), so resume it with num_workers={saved}"
            )
        if (saved == 0 or self.num_workers == 0) and any(
            isinstance(node, ShardingRoundRobinDispatcher | DispatchedSource)
            for node in [*list_dps(datapipe), *list_dps(worker_graph)]
        ):
            raise StateError(
                f"{where}: saved with num_workers={saved}, now {self.num_workers}; a dispatched pipeline "
                "(sharding_round_robin_dispatch) resumes on another worker count only between counts above 0"
            )
        try:
            check_saved_workers(tail, pipeline, saved, where)
        except StateError as error:
            raise StateError(f"{where}: saved with num_workers={saved}, now {self.num_workers}: {error}") from None
        if position is not None:
            require_position(position, where)
        return resplit(tail, worker_graph, pipeline, position, saved, self.num_workers)

    def _adapt_merged(
        self, datapipe: DataPipe, pipeline: State | None, merged: ElasticPart, where: str
    ) -> State | None:
        """A merged state: built for no workers (unless a service before this one built
        it), then given to every worker."""
        if not isinstance(datapipe, IterDataPipe):
            raise TypeError(f"expected an IterDataPipe, got {type(datapipe).__name__}")
        if pipeline is None:
            pipeline = resumed_pipeline(datapipe, merged, where)
        if pipeline is None or self.num_workers == 0:
            return pipeline
        bottom, tail = split_replicable(datapipe)
        worker_graph = bottom._worker_graph if isinstance(bottom, MergedWorkerOutput) else bottom
        if not self._resplittable(worker_graph):
            raise StateError(
                f"{where}: a state merged from several ranks resumes on workers that hand items out in "
                "single-process order only; read it with in_order=True"
            )
        return resplit(tail, worker_graph, pipeline, None, 0, self.num_workers)
