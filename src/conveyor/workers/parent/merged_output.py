"""The main-process pipe that reads the workers: request, receive, merge, hand out.

:class:`MergedWorkerOutput` stands in the main-process graph where the workers' part was; each
pass over it (:class:`MergedWorkerOutputPass`) starts an epoch on the workers, from the
per-worker states it is opened with, and reads it. With ``main_prefetch_cnt > 0`` a
background thread receives and merges ahead of the user while the user spends time
elsewhere (training) and the workers are ahead; while the user keeps waiting for the
workers anyway, the user's own thread receives, which saves a thread hand-off per run.
Items travel in runs (lists), so the per-item work in the user's thread is an index and
a ``yield``. The pass remembers, for each worker, the state that came with the last item
*handed to the user*: its state folds the current run up to that item into it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any

from conveyor.core.base import IterDataPipe
from conveyor.core.error_budget import SkipLedger, SkippedItem
from conveyor.core.op_roles import ShardingPoint
from conveyor.core.passes import Pass, PassContext, Position, State
from conveyor.core.random import SeedGenerator
from conveyor.core.read_ahead import HAND_BACK_REQUEST, adaptive_read_ahead, close_iterator
from conveyor.core.validation import require_position
from conveyor.errors import GraphError, StateError, WorkerDeathError, WorkerError
from conveyor.observe.stats import StageTotals, merge_totals, spread_unsampled
from conveyor.workers.child.dispatch import check_dispatched_states
from conveyor.workers.parent.descriptors import WakePipe
from conveyor.workers.parent.dispatcher import Dispatcher, DispatchRun
from conveyor.workers.parent.merge import Entry, Merge, check_merge_state, make_entry
from conveyor.workers.parent.pool import WorkerPool
from conveyor.workers.transport.chunk_states import StateRef, resolve
from conveyor.workers.transport.protocol import Chunk, EpochEnd, Failure, Progress, Ready, StageReport

_THREAD = "conveyor-worker-reader"
#: In place of the state of a run's entry that was a skipped item's record.
_SKIPPED = object()
#: How long, of the consumer's time, may pass between two looks for dead workers.
DEATH_CHECK_S = 0.25
#: How long closing the reader waits for its read-ahead thread to end. Woken (its wake
#: pipe, its buffer closed), the thread ends within milliseconds, as it runs no user code
#: but a dispatcher's upstream; this bounds a machine short of CPU. One still inside that
#: upstream is left to end on its own, with its wake pipe (see WakePipe).
READER_STOP_S = 1.0


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
        lane = entry.lane
        if entry.index is _SKIPPED or found[lane]:
            continue
        found[lane] = True
        states[lane], bounds[lane] = StateRef(entry.states, entry.index), entry.position
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
        self._generation, self._merge, self._dispatch = pipe._begin(
            self._states, state["merge"] if state is not None else None, self._skips
        )
        self.items = self._read()

    def _read(self) -> Iterator[Any]:
        pipe = self.pipe
        runs = self._prefetched(pipe) if pipe.read_ahead else self._runs(None)
        pool = pipe.pool
        assert pool is not None
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
                    item = entry.item
                    if skips is not None and item.__class__ is SkippedItem:
                        # An item a worker dropped, in its place in the order: recorded, not
                        # handed out, and no state kept from it (see conveyor.core.error_budget).
                        run[index] = make_entry((entry.lane, None, _SKIPPED, None, None))  # no state
                        skips.report(item.record)
                        continue
                    yield item
                    # Keep only the bookkeeping: the item is the user's now, and a large one
                    # holds shared-memory pages its worker may reuse once the user drops it.
                    run[index] = make_entry((entry.lane, None, entry.index, entry.position, entry.states))
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

    def _runs(self, wake: WakePipe | None) -> Iterator[Any]:
        """Runs of merged entries (``list[Entry]``) until the epoch ends (or ``wake`` is
        woken), and in the read-ahead thread ``HAND_BACK_REQUEST`` when the consumer's thread
        is to go on reading (``adaptive_read_ahead`` takes it). The runs own
        the wake pipe: whichever thread ends them, the consumer's or a read-ahead thread
        that outlived it, closes it."""
        pipe = self.pipe
        merge, pool, dispatcher, generation = self._merge, pipe.pool, self._dispatch, self._generation
        try:
            wake_fd = wake.open() if wake is not None else None
            yield from self._merged_runs(pipe, merge, pool, dispatcher, generation, wake_fd)
        finally:
            if wake is not None:
                wake.close()
            if dispatcher is not None:
                dispatcher.close()  # here, in the thread that read it

    def _merged_runs(
        self,
        pipe: MergedWorkerOutput,
        merge: Merge,
        pool: Any,
        dispatcher: DispatchRun | None,
        generation: int,
        wake: Any,
    ) -> Iterator[Any]:  # runs (list[Entry]), and HAND_BACK_REQUEST (see _runs)
        while pipe.generation == generation:  # a newer pass took the workers over: this one is over
            if dispatcher is not None:
                dispatcher.pump()
            run, freed = merge.take_run()
            for lane in freed:
                if not merge.lanes[lane].ended:
                    pool.grant(lane, generation)
            if run:
                yield run
                if dispatcher is not None:
                    continue  # the items fed meanwhile may let more leave
                # A run takes every entry that may leave: until a message arrives there is
                # no other, and merge.awaited() still names the lanes to wait for.
            if merge.finished:
                if dispatcher is not None and dispatcher.failure is not None:
                    raise dispatcher.failure  # every item read before it has been handed out
                return
            # Listen only to the workers the merge waits for: a chunk from another would wake
            # this thread for nothing (and its worker would pay for the wake-up). A dispatcher
            # needs every worker's progress to feed the next items.
            awaited = merge.awaited() if dispatcher is None else None
            try:
                messages = pool.receive(None, wake, awaited, merge)
            except WorkerDeathError as death:
                if not pool.restarts.left or dispatcher is not None:
                    raise
                if threading.current_thread().name == pipe.thread_name:
                    yield HAND_BACK_REQUEST  # the loader's own thread goes on from here
                self._replace(pipe, death.worker_id)
                continue
            if messages is None:
                return  # woken: the consumer is gone
            for worker_id, frame in messages:
                self._accept(pipe, worker_id, frame)

    def _accept(self, pipe: MergedWorkerOutput, worker_id: int, frame: Any) -> None:
        """Decode a frame worker ``worker_id`` sent, and take what it says."""
        merge, generation, pool = self._merge, self._generation, pipe.pool
        assert pool is not None
        message = pool.decoder(worker_id)(frame)
        if message.__class__ is Chunk:
            if message.generation == generation:
                merge.add_chunk(worker_id, message.items, message.positions, message.states)
        elif isinstance(message, Ready):
            pool.ready(worker_id)
        elif isinstance(message, Failure) and message.generation < 0:
            raise pool.failure_error(message)  # it could not start
        elif isinstance(message, EpochEnd):
            if message.generation == generation:
                merge.end_lane(worker_id)
        elif isinstance(message, StageReport):
            if message.generation == generation:
                pipe.stage_reports[worker_id] = [StageTotals(*stage) for stage in message.stages]
        elif isinstance(message, Progress):
            if message.generation == generation and self._dispatch is not None:
                self._dispatch.progress(worker_id, message.taken, message.channel)
                if merge.positional:
                    merge.raise_floor(worker_id, message.position)
        elif isinstance(message, Failure):
            if message.generation == generation:  # raised when the items before it have left
                merge.fail_lane(worker_id, pool.failure_error(message), message.position)
        else:
            raise WorkerError(f"worker {worker_id} sent an unexpected message {type(message).__name__}")

    def _replace(self, pipe: MergedWorkerOutput, worker_id: int) -> None:
        """Start a new process for dead worker ``worker_id`` from its state after the last
        item received from it (see :mod:`conveyor.workers.parent.healing`)."""
        pool = pipe.pool
        assert pool is not None
        for frame in pool.drain(worker_id):  # what it sent before it died comes first
            self._accept(pipe, worker_id, frame)
        resume, position = self._merge.rewind(worker_id)
        spec = None
        if self._skips is not None:
            bounds: list[Any] = [None] * pipe.num_workers
            bounds[worker_id] = list(position) if position is not None else None
            spec = self._skips.worker_spec(bounds)
        death = pool.replace(worker_id, resume, spec)
        pool.restarts.record(worker_id, death)

    def _prefetched(self, pipe: MergedWorkerOutput) -> Iterator[list[Entry]]:
        """Runs merged ahead by a thread while that pays (the consumer is busy elsewhere
        and the workers are ahead), by the consumer's thread otherwise; closing this wakes
        the thread if it is waiting."""
        pool = pipe.pool
        assert pool is not None  # a pass over the workers' output has them
        wake = WakePipe()  # the thread may be waiting on the workers when the consumer leaves
        yield from adaptive_read_ahead(
            self._runs(wake),
            pipe.read_ahead,
            pipe.thread_name,
            len,
            interrupt=wake.wake,
            # Workers start as the waiting goes on; the thread must not start any (a
            # worker forked by another thread would not die with the main process).
            before_thread=pool.start_remaining,
            stop_wait=READER_STOP_S,
        )

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
            if entry.index is not _SKIPPED:
                return entry.position
        return self._bounds[self._last_lane] if self._last_lane is not None else None


class MergedWorkerOutput(IterDataPipe, ShardingPoint):
    """Yields the merged output of a :class:`WorkerPool`, one epoch per pass.

    For the main-process ops after it, it stands where the sharding point was: each item
    keeps its position, so their random draws match a single process's. Its state holds
    one state of ``worker_graph`` per worker and where the merge is.
    """

    pass_type = MergedWorkerOutputPass
    state_fields = {"workers": list, "merge": dict}

    def __init__(
        self,
        worker_graph: IterDataPipe,
        num_workers: int,
        pool: WorkerPool | None,
        in_order: bool,
        positional: bool,
        credits: int,
        prefetch: int,
        dispatcher: Dispatcher | None = None,
        dispatch_state: Callable[[Any], list[tuple[int, Any]]] | None = None,
        check_worker_states: bool = True,
        dispatch_upstreams: list[IterDataPipe] | None = None,
        sub_positions: bool = True,
    ):
        self._worker_graph = worker_graph  # the graph each worker runs (checks states)
        self.num_workers = num_workers
        self.pool = pool  # None in a preview, which only checks states
        self.dispatcher = dispatcher
        self._dispatch_state = dispatch_state  # a worker's state -> per channel (next position, upstream state)
        self._check_worker_states = check_worker_states  # False: a worker_init_fn changes the graph
        self._dispatch_upstreams = dispatch_upstreams or []  # the dispatchers' graphs (check fed items' states)
        self._in_order = in_order
        self._positional = positional
        self._sub_positions = sub_positions  # whether an op after the sharding point expands items
        self._credits = credits
        self.read_ahead = prefetch  # runs merged ahead (not `prefetch`: that is every pipe's method)
        self.generation = 0  # of the pass that owns the workers now
        self._seeds: SeedGenerator | None = None
        self.thread_name = f"{_THREAD}-{id(self):x}"
        self.collect_stats: bool | str = False  # how the workers measure their stages (StageReports)
        self.stage_reports: dict[int, list[StageTotals]] = {}  # by worker, the epoch's latest

    def prepare_epoch(self, seeds: SeedGenerator) -> None:
        """The seeds of the epoch the next pass starts."""
        self._seeds = seeds

    def _begin(
        self, states: list[Any], merge_state: Mapping[str, Any] | None, skips: SkipLedger | None
    ) -> tuple[int, Merge, DispatchRun | None]:
        """Start an epoch on the workers for a new pass: ``(its generation, its merge, its
        dispatch run)``. From here on an older pass's reading ends at its next look.
        ``skips``: the epoch's skip ledger, when stages drop the items they fail on."""
        if self.pool is None or self._seeds is None:
            raise RuntimeError("the workers' epoch was not prepared; iterate through DataLoader2")
        self.generation = generation = self.generation + 1
        merge = Merge(self.num_workers, self._in_order, self._positional, self._sub_positions)
        if merge_state is not None:
            merge.restore(merge_state["bounds"], merge_state["last_lane"])
        for lane, state in zip(merge.lanes, states, strict=True):
            lane.received = state  # where a replaced worker resumes until it sends an item
        run = None
        if self.dispatcher is not None:
            assert self._dispatch_state is not None
            channels = len(self._dispatch_upstreams)
            by_worker = [
                self._dispatch_state(state) if state is not None else [(0, None)] * channels for state in states
            ]
            lanes = [[worker[channel] for worker in by_worker] for channel in range(channels)]
            run = self.dispatcher.start(generation, self._seeds, lanes, skips)
        self.stage_reports = {}
        spec = None
        if skips is not None:
            bounds = merge_state["bounds"] if merge_state is not None else [None] * self.num_workers
            spec = skips.worker_spec(list(bounds))
        self.pool.start_epoch(generation, self._seeds, states, self._credits, self.collect_stats, spec)
        return generation, merge, run

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
        return [t.ident for t in threading.enumerate() if t.name == self.thread_name and t.ident is not None]

    def stage_totals(self) -> list[StageTotals] | None:
        """The workers' latest stage reports of this epoch, summed stage by stage. A worker
        whose graph differs (a ``worker_init_fn`` changed it) gets rows of its own."""
        merged: list[StageTotals] | None = None
        own_rows: list[StageTotals] = []
        for worker_id, report in sorted(self.stage_reports.items()):
            if merged is None or [t.label for t in merged] == [t.label for t in report]:
                merged = merge_totals(merged, report)
            else:
                own = spread_unsampled(merge_totals(None, report))
                own_rows.extend(replace(t, label=f"{t.label} [worker {worker_id}]") for t in own)
        return None if merged is None else spread_unsampled(merged) + own_rows

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
        return f"MergedWorkerOutput(num_workers={self.num_workers}, in_order={self._in_order})"
