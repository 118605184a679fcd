"""Driving a :class:`~conveyor.workers.parent.pool.WorkerPool` for the main-process graph.

A :class:`WorkerReader` holds what lasts across epochs: the pool, how outputs merge, the
credits and read-ahead, the generation of the pass that owns the workers now, the next
epoch's seeds, the workers' statistics. Each pass over the graph node
(:class:`~conveyor.workers.parent.merged_output.MergedWorkerOutput`) begins a
:class:`WorkerEpoch` through it: the epoch started on the workers, whose runs of merged
entries the pass hands out. The epoch receives the workers' frames, decodes them (the
pool moves frames only), merges them, grants credits back, and replaces a dead worker
while restarts are left. With ``read_ahead > 0`` a background thread receives and
merges ahead of the user while the user spends time elsewhere (training) and the workers
are ahead; while the user keeps waiting for the workers anyway, the user's own thread
receives, which saves a thread hand-off per run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from conveyor.core.error_budget import SkipLedger
from conveyor.core.random import SeedGenerator
from conveyor.core.read_ahead import HAND_BACK_REQUEST, adaptive_read_ahead
from conveyor.errors import WorkerDeathError, WorkerError
from conveyor.observe.stats import StageTotals, merge_totals, spread_unsampled
from conveyor.workers.parent.descriptors import WakePipe
from conveyor.workers.parent.dispatcher import Dispatcher, DispatchRun
from conveyor.workers.parent.merge import Entry, Merge
from conveyor.workers.parent.pool import WorkerPool
from conveyor.workers.transport.protocol import Chunk, EpochEnd, Failure, Progress, Ready, StageReport

_THREAD = "conveyor-worker-reader"
#: How long closing the reader waits for its read-ahead thread to end. Woken (its wake
#: pipe, its buffer closed), the thread ends within milliseconds, as it runs no user code
#: but a dispatcher's upstream; this bounds a machine short of CPU. One still inside that
#: upstream is left to end on its own, with its wake pipe (see WakePipe).
READER_STOP_S = 1.0


@dataclass(frozen=True)
class MergeOrder:
    """How the workers' outputs merge (see :class:`~conveyor.workers.parent.merge.Merge`)."""

    in_order: bool
    positional: bool  # by position at the sharding point (every op after it keeps their order)
    sub_positions: bool = True  # whether an op after the sharding point expands items


@dataclass(frozen=True)
class DispatchSetup:
    """Dispatch mode: the dispatcher, and how a worker's state says, per channel, its next
    position and upstream state."""

    dispatcher: Dispatcher
    worker_state: Callable[[Any], list[tuple[int, Any]]]
    channels: int


class WorkerReader:
    """Reads a :class:`WorkerPool` for the graph node, one :class:`WorkerEpoch` per pass;
    ``pool`` is None in a preview, which only checks states."""

    def __init__(
        self,
        num_workers: int,
        pool: WorkerPool | None,
        order: MergeOrder,
        credits: int,
        read_ahead: int,
        dispatch: DispatchSetup | None = None,
    ):
        self.num_workers = num_workers
        self.pool = pool
        self.order = order
        self.credits = credits
        self.read_ahead = read_ahead  # runs merged ahead
        self.dispatch = dispatch
        self.generation = 0  # of the pass that owns the workers now
        self._seeds: SeedGenerator | None = None
        self.thread_name = f"{_THREAD}-{id(self):x}"
        self.collect_stats: bool | str = False  # how the workers measure their stages (StageReports)
        self.stage_reports: dict[int, list[StageTotals]] = {}  # by worker, the epoch's latest

    def prepare_epoch(self, seeds: SeedGenerator) -> None:
        """The seeds of the epoch the next pass starts."""
        self._seeds = seeds

    def begin(self, states: list[Any], merge_state: Mapping[str, Any] | None, skips: SkipLedger | None) -> WorkerEpoch:
        """Start an epoch on the workers for a new pass, from per-worker ``states`` and
        where the merge was. From here on an older pass's reading ends at its next look.
        ``skips``: the epoch's skip ledger, when stages drop the items they fail on."""
        if self.pool is None or self._seeds is None:
            raise RuntimeError("the workers' epoch was not prepared; iterate through DataLoader2")
        self.generation = generation = self.generation + 1
        order = self.order
        merge = Merge(self.num_workers, order.in_order, order.positional, order.sub_positions)
        if merge_state is not None:
            merge.restore(merge_state["bounds"], merge_state["last_lane"])
        for lane, state in zip(merge.lanes, states, strict=True):
            lane.received = state  # where a replaced worker resumes until it sends an item
        run = None
        if self.dispatch is not None:
            channels = self.dispatch.channels
            by_worker = [
                self.dispatch.worker_state(state) if state is not None else [(0, None)] * channels for state in states
            ]
            lanes = [[worker[channel] for worker in by_worker] for channel in range(channels)]
            run = self.dispatch.dispatcher.start(generation, self._seeds, lanes, skips)
        self.stage_reports = {}
        spec = None
        if skips is not None:
            bounds = merge_state["bounds"] if merge_state is not None else [None] * self.num_workers
            spec = skips.worker_spec(list(bounds))
        self.pool.start_epoch(generation, self._seeds, states, self.credits, self.collect_stats, spec)
        return WorkerEpoch(self, self.pool, generation, merge, run, skips)

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


class WorkerEpoch:
    """One pass's epoch on the workers: its runs of merged entries (:meth:`runs`)."""

    def __init__(
        self,
        reader: WorkerReader,
        pool: WorkerPool,
        generation: int,
        merge: Merge,
        dispatch: DispatchRun | None,
        skips: SkipLedger | None,
    ):
        self.reader = reader
        self.pool = pool
        self.generation = generation
        self.merge = merge
        self._dispatch = dispatch
        self._skips = skips

    def runs(self) -> Iterator[list[Entry]]:
        """Runs of merged entries until the epoch ends, read ahead by a thread while that
        pays (see the module)."""
        return self._prefetched() if self.reader.read_ahead else self._runs(None)

    def _runs(self, wake: WakePipe | None) -> Iterator[Any]:
        """Runs of merged entries (``list[Entry]``) until the epoch ends (or ``wake`` is
        woken), and in the read-ahead thread ``HAND_BACK_REQUEST`` when the consumer's thread
        is to go on reading (``adaptive_read_ahead`` takes it). The runs own
        the wake pipe: whichever thread ends them, the consumer's or a read-ahead thread
        that outlived it, closes it."""
        dispatcher = self._dispatch
        try:
            wake_fd = wake.open() if wake is not None else None
            yield from self._merged_runs(wake_fd)
        finally:
            if wake is not None:
                wake.close()
            if dispatcher is not None:
                dispatcher.close()  # here, in the thread that read it

    def _merged_runs(self, wake: Any) -> Iterator[Any]:  # runs (list[Entry]), and HAND_BACK_REQUEST (see _runs)
        reader, merge, pool, dispatcher = self.reader, self.merge, self.pool, self._dispatch
        generation = self.generation
        while reader.generation == generation:  # a newer pass took the workers over: this one is over
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
                frames = pool.receive(None, wake, awaited, merge)
            except WorkerDeathError as death:
                if not pool.restarts.left or dispatcher is not None:
                    raise
                if threading.current_thread().name == reader.thread_name:
                    yield HAND_BACK_REQUEST  # the loader's own thread goes on from here
                self._replace(death.worker_id)
                continue
            if frames is None:
                return  # woken: the consumer is gone
            for worker_id, frame in frames:
                self._accept(worker_id, frame)

    def _accept(self, worker_id: int, frame: Any) -> None:
        """Decode a frame worker ``worker_id`` sent, and take what it says."""
        merge, generation, pool = self.merge, self.generation, self.pool
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
                self.reader.stage_reports[worker_id] = [StageTotals(*stage) for stage in message.stages]
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

    def _replace(self, worker_id: int) -> None:
        """Start a new process for dead worker ``worker_id`` from its state after the last
        item received from it (see :mod:`conveyor.workers.parent.healing`)."""
        pool = self.pool
        for frame in pool.drain(worker_id):  # what it sent before it died comes first
            self._accept(worker_id, frame)
        resume, position = self.merge.rewind(worker_id)
        spec = None
        if self._skips is not None:
            bounds: list[Any] = [None] * self.reader.num_workers
            bounds[worker_id] = list(position) if position is not None else None
            spec = self._skips.worker_spec(bounds)
        death = pool.replace(worker_id, resume, spec)
        pool.restarts.record(worker_id, death)

    def _prefetched(self) -> Iterator[list[Entry]]:
        """Runs merged ahead by a thread while that pays (the consumer is busy elsewhere
        and the workers are ahead), by the consumer's thread otherwise; closing this wakes
        the thread if it is waiting."""
        wake = WakePipe()  # the thread may be waiting on the workers when the consumer leaves
        yield from adaptive_read_ahead(
            self._runs(wake),
            self.reader.read_ahead,
            self.reader.thread_name,
            len,
            interrupt=wake.wake,
            # Workers start as the waiting goes on; the thread must not start any (a
            # worker forked by another thread would not die with the main process).
            before_thread=self.pool.start_remaining,
            stop_wait=READER_STOP_S,
        )
