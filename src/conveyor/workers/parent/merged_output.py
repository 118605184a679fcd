"""The main-process pipe that stands where the workers' part of the graph was.

:class:`MergedWorkerOutput` is the graph node: the sharding point's stand-in for the ops
after it, its state's shape and checks. Each pass over it (:class:`MergedWorkerOutputPass`)
begins an epoch on the workers through its
:class:`~conveyor.workers.parent.worker_reader.WorkerReader` (which drives the pool), from
the per-worker states it is opened with, and hands out the runs of merged entries that
epoch yields. Items travel in runs (lists), so the per-item work in the user's thread is
an index and a ``yield``. The pass remembers, for each worker, the state that came with
the last item *handed to the user*: its state folds the current run up to that item into it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

from conveyor.core.base import IterDataPipe
from conveyor.core.error_budget import SkipLedger, SkippedItem
from conveyor.core.op_roles import ShardingPoint
from conveyor.core.passes import Pass, PassContext, Position, State
from conveyor.core.random import SeedGenerator
from conveyor.core.read_ahead import close_iterator
from conveyor.core.validation import require_position
from conveyor.errors import GraphError, StateError
from conveyor.observe.stats import StageTotals
from conveyor.workers.child.dispatch import check_dispatched_states
from conveyor.workers.parent.merge import INDEX, ITEM, LANE, POSITION, STATES, Entry, check_merge_state
from conveyor.workers.parent.worker_reader import WorkerReader
from conveyor.workers.transport.chunk_states import StateRef, resolve

#: In place of the state of a run's entry that was a skipped item's record.
_SKIPPED = object()
#: How long, of the consumer's time, may pass between two looks for dead workers.
DEATH_CHECK_S = 0.25


def _fold(run: list[Entry], taken: int, states: list[Any], bounds: list[Any]) -> int | None:
    """Record in ``states`` and ``bounds``, for each worker, where the last of its items
    among the first ``taken`` of ``run`` left it (skipped items' records aside); returns
    the worker of the last such item (None: none). Looks from the end, so it stops once
    every worker is found, and keeps a reference to a state, not the state itself."""
    last_lane = None
    left = len(states)
    found = [False] * left
    for at in range(taken - 1, -1, -1):
        entry = run[at]
        lane = entry[LANE]
        if entry[INDEX] is _SKIPPED or found[lane]:
            continue
        found[lane] = True
        states[lane], bounds[lane] = StateRef(entry[STATES], entry[INDEX]), entry[POSITION]  # type: ignore[arg-type]
        if last_lane is None:
            last_lane = lane
        left -= 1
        if not left:
            break
    return last_lane


class MergedWorkerOutputPass(Pass):
    """One epoch of the workers, from the start or from per-worker states."""

    pipe: MergedWorkerOutput

    def __init__(self, pipe: MergedWorkerOutput, state: State | None, context: PassContext):
        super().__init__(pipe, context)
        count = pipe.num_workers
        if state is None:
            self._states: list[Any] = [None] * count  # per worker: its state after its last item handed out
            self._bounds: list[Position | None] = [None] * count  # per worker: that item's position
            self._last_lane: int | None = None
        else:
            self._states = list(state["workers"])
            self._bounds = [tuple(b) if b is not None else None for b in state["merge"]["bounds"]]
            self._last_lane = state["merge"]["last_lane"]
        self._run: list[Entry] = []  # the run being handed out ...
        self._run_taken = 0  # ... and how much of it the user has
        self._handed = 0  # items of earlier runs handed out
        self._skips: SkipLedger | None = context.skips  # type: ignore[assignment]
        self._epoch = pipe.reader.begin(self._states, state["merge"] if state is not None else None, self._skips)
        self.items = self._read()

    def _read(self) -> Iterator[Any]:
        runs = self._epoch.runs()
        pool = self._epoch.pool
        # A worker that dies is raised at the first item after it is seen, whatever the
        # consumer's pace: the items already here wait (state_dict() names the last one
        # handed out). Looking costs a system call, so it happens at most every
        # DEATH_CHECK_S; reading the clock costs ~40 ns an item.
        clock, next_look = time.monotonic, 0.0
        skips = self._skips
        try:
            for run in runs:
                self._fold_run()
                self._run = run
                for index, entry in enumerate(run):
                    if clock() >= next_look:
                        if not pool.restarts.left:  # else the next wait replaces a dead worker
                            pool.check_alive()
                        next_look = clock() + DEATH_CHECK_S
                    self._run_taken = index + 1
                    item = entry[ITEM]
                    if skips is not None and item.__class__ is SkippedItem:
                        # An item a worker dropped, in its place in the order: recorded, not
                        # handed out, and no state kept from it (see conveyor.core.error_budget).
                        run[index] = (entry[LANE], None, _SKIPPED, None, None)  # no state
                        skips.report(item.record)
                        continue
                    yield item
                    # Keep only the bookkeeping: the item is the user's now, and a large one
                    # holds shared-memory pages its worker may reuse once the user drops it.
                    run[index] = (entry[LANE], None, entry[INDEX], entry[POSITION], entry[STATES])
        finally:
            # Raised here (a death seen between items, a skip budget spent) or closed, the
            # runs end now, with their read-ahead thread and wake pipe: the error's traceback
            # holds this frame, and so would keep them alive until it is collected.
            close_iterator(runs)
        self._fold_run()

    def _fold_run(self) -> None:
        """Record the handed-out part of the current run in the per-worker bookkeeping."""
        last_lane = _fold(self._run, self._run_taken, self._states, self._bounds)
        if last_lane is not None:
            self._last_lane = last_lane
        self._handed += self._run_taken
        self._run, self._run_taken = [], 0

    def state(self) -> State:
        states, bounds = list(self._states), list(self._bounds)
        last_lane = _fold(self._run, self._run_taken, states, bounds)
        return {
            "workers": [resolve(state) for state in states],
            "merge": {
                "last_lane": self._last_lane if last_lane is None else last_lane,
                "bounds": [list(b) if b is not None else None for b in bounds],
            },
        }

    def yielded(self) -> int:
        return self._handed + self._run_taken

    def position(self) -> Position | None:
        for entry in reversed(self._run[: self._run_taken]):
            if entry[INDEX] is not _SKIPPED:
                return entry[POSITION]
        return self._bounds[self._last_lane] if self._last_lane is not None else None


class MergedWorkerOutput(IterDataPipe, ShardingPoint):
    """Yields the merged output of the workers, one epoch per pass, read through
    ``reader``.

    For the main-process ops after it, it stands where the sharding point was: each item
    keeps its position, so their random draws match a single process's. Its state holds
    one state of ``worker_graph`` per worker and where the merge is. ``check_worker_states``
    False: a ``worker_init_fn`` changes the workers' graph, so their states are not
    checked against it; ``dispatch_upstreams``: the dispatchers' graphs (dispatched
    items' states are checked against them).
    """

    pass_type = MergedWorkerOutputPass
    state_fields = {"workers": list, "merge": dict}

    def __init__(
        self,
        worker_graph: IterDataPipe,
        reader: WorkerReader,
        check_worker_states: bool = True,
        dispatch_upstreams: list[IterDataPipe] | None = None,
    ):
        self._worker_graph = worker_graph  # the graph each worker runs (checks states)
        self.reader = reader
        self.num_workers = reader.num_workers
        self._check_worker_states = check_worker_states
        self._dispatch_upstreams = dispatch_upstreams or []

    @property
    def collect_stats(self) -> bool | str:
        """How the workers measure their stages."""
        return self.reader.collect_stats

    @collect_stats.setter
    def collect_stats(self, mode: bool | str) -> None:
        self.reader.collect_stats = mode

    def prepare_epoch(self, seeds: SeedGenerator) -> None:
        """The seeds of the epoch the next pass starts."""
        self.reader.prepare_epoch(seeds)

    def apply_sharding(self, num_of_instances: int, instance_id: int, sharding_group: Any = 0) -> None:
        """The workers sharded what they send, so a further split cannot reach them: the
        service that asks (distributed, after the workers were set up) came too late."""
        if num_of_instances > 1:
            raise GraphError(
                f"{self!r} stands where the sharding point was, and its workers already split the graph: "
                f"sharding it again {num_of_instances} ways cannot reach them. In a SequentialReadingService, put "
                "DistributedReadingService before MultiProcessingReadingService."
            )

    def helper_thread_ids(self) -> list[int]:
        """The thread merging ahead for this reader, if running (for statistics)."""
        return self.reader.helper_thread_ids()

    def stage_totals(self) -> list[StageTotals] | None:
        """The workers' latest stage reports of this epoch, summed stage by stage."""
        return self.reader.stage_totals()

    def check_own_state(self, state: Mapping[str, Any], where: str) -> None:
        if len(state["workers"]) != self.num_workers:
            raise StateError(f"{where}: expected {self.num_workers} worker states, got {len(state['workers'])}")
        check_merge_state(state["merge"], self.num_workers, f"{where} merge")
        for worker_id, worker_state in enumerate(state["workers"]):
            if worker_state is not None and self._check_worker_states:
                self._worker_graph.check_state(worker_state, f"{where} worker {worker_id}")
        if self._dispatch_upstreams and self._check_worker_states:
            check_dispatched_states(self._worker_graph, self._dispatch_upstreams, state["workers"], where)
        for bound in state["merge"]["bounds"]:
            if bound is not None:
                require_position(bound, where)

    def __repr__(self) -> str:
        return f"MergedWorkerOutput(num_workers={self.num_workers}, in_order={self.reader.order.in_order})"
