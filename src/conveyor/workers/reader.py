"""The main-process pipe that reads the workers: request, receive, merge, hand out.

With ``main_prefetch_cnt > 0`` a background thread receives and merges ahead of the user
(about that many items) while the user spends time elsewhere (training) and the workers
are ahead; while the user keeps waiting for the workers anyway, the user's own thread
receives, which saves a thread hand-off per run. With 0 the user's thread always does. Items travel in runs
(lists), so the per-item work in the user's thread is an index and a ``yield``. The pipe
remembers, for each worker, the state that came with the last item *handed to the
user*: a checkpoint folds the current run up to that item into it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any

from conveyor.errors import GraphError, StateError, WorkerError
from conveyor.pipes.base import IterDataPipe, Position, ShardingPoint
from conveyor.random import SeedGenerator
from conveyor.read_ahead import adaptive_read_ahead
from conveyor.state import require_keys
from conveyor.stats import StageTotals, merge_totals
from conveyor.workers.dispatch import Dispatcher
from conveyor.workers.merge import Entry, Merge, check_merge_state
from conveyor.workers.pool import WorkerPool
from conveyor.workers.protocol import EpochEnd, Failure, Progress, StageReport

_THREAD = "conveyor-worker-reader"


class WorkerReader(IterDataPipe, ShardingPoint):
    """Yields the merged output of a :class:`WorkerPool` for the epoch it was started on.

    For the main-process ops after it, it stands where the sharding point was: each item
    keeps its position, so their random draws match a single process's.
    """

    def __init__(
        self,
        pool: WorkerPool,
        in_order: bool,
        positional: bool,
        credits: int,
        prefetch: int,
        dispatcher: Dispatcher | None = None,
        dispatch_state: Callable[[Any], tuple[int, Any]] | None = None,
    ):
        self._pool = pool
        self._dispatcher = dispatcher
        self._dispatch_state = dispatch_state  # a worker's compact state -> (position, upstream)
        self._in_order = in_order
        self._positional = positional
        self._credits = credits
        self._prefetch = prefetch
        self._generation = 0
        self._seeds: SeedGenerator | None = None  # the running epoch's, to restart it
        self._thread_name = f"{_THREAD}-{id(self):x}"
        self.collect_stats = False  # ask the workers for StageReports
        self._stage_reports: dict[int, list[StageTotals]] = {}  # by worker, the epoch's latest
        self._epoch_started = False
        self._clear_bookkeeping([None] * pool.num_workers, [None] * pool.num_workers, None)

    def _clear_bookkeeping(self, states: list[Any], bounds: list[Position | None], last_lane: int | None) -> None:
        self._states = states  # per worker: compact state after its last item handed out
        self._bounds = bounds  # per worker: that item's position
        self._last_lane = last_lane
        self._run: list[Entry] = []  # the run being handed out ...
        self._run_taken = 0  # ... and how much of it the user has

    # --- epochs --------------------------------------------------------------------------

    def start_epoch(self, seeds: SeedGenerator, resumes: list[Any], merge_state: Mapping[str, Any] | None) -> None:
        """Send the epoch's start to every worker; the next ``iter()`` reads it."""
        count = self._pool.num_workers
        self._seeds = seeds
        self._generation += 1
        self._merge = Merge(count, self._in_order, self._positional)
        if merge_state is None:
            self._clear_bookkeeping([None] * count, [None] * count, None)
        else:
            bounds = [tuple(b) if b is not None else None for b in merge_state["bounds"]]
            self._clear_bookkeeping(list(resumes), bounds, merge_state["last_lane"])
            self._merge.restore(merge_state["bounds"], merge_state["last_lane"])
        if self._dispatcher is not None:
            assert self._dispatch_state is not None
            lanes = [self._dispatch_state(state) if state is not None else (-1, None) for state in resumes]
            self._dispatcher.start_epoch(self._generation, seeds, lanes)
        self._stage_reports: dict[int, list[StageTotals]] = {}
        self._pool.start_epoch(self._generation, seeds, resumes, self._credits, self.collect_stats)
        self._epoch_started = True

    def __iter__(self) -> Iterator[Any]:
        if not self._epoch_started:
            raise RuntimeError("the workers' epoch was not started; iterate through DataLoader2")
        rewound = self._take_restored()
        if rewound is not None:
            # A main-process op after this one (prefetch, fullsync) resumes from a snapshot
            # taken behind its own read-ahead, older than the state the epoch was started
            # from: start the workers again from there.
            self.start_epoch(self._seeds, rewound["workers"], rewound["merge"])
        self._epoch_started = False
        runs = self._prefetched() if self._prefetch else self._runs(self._generation, None)
        for run in runs:
            self._fold_run()
            self._run = run
            for index, entry in enumerate(run):
                self._run_taken = index + 1
                yield entry[1]
                # Keep only the bookkeeping: the item is the user's now, and a large one
                # holds shared-memory pages its worker may reuse once the user drops it.
                run[index] = (entry[0], None, entry[2], entry[3])
        self._fold_run()

    def apply_sharding(self, num_shards: int, shard_index: int, priority: Any) -> None:
        """The workers sharded what they send, so a further split cannot reach them: the
        service that asks (distributed, after the workers were set up) came too late."""
        if num_shards > 1:
            raise GraphError(
                f"{self!r} stands where the sharding point was, and its workers already split the graph: "
                f"sharding it again {num_shards} ways cannot reach them. In a SequentialReadingService, put "
                "DistributedReadingService before MultiProcessingReadingService."
            )

    def item_position(self) -> Position | None:
        if self._run_taken:
            return self._run[self._run_taken - 1][3]
        return self._bounds[self._last_lane] if self._last_lane is not None else None

    def _fold_run(self) -> None:
        """Record the handed-out part of the current run in the per-worker bookkeeping."""
        for lane, _, state, position in self._run[: self._run_taken]:
            self._states[lane], self._bounds[lane], self._last_lane = state, position, lane
        self._run, self._run_taken = [], 0

    # --- producing runs ------------------------------------------------------------------

    def _runs(self, generation: int, wake: Any) -> Iterator[list[Entry]]:
        """Runs of merged entries until the epoch ends (or ``wake`` is signalled)."""
        merge, pool, dispatcher = self._merge, self._pool, self._dispatcher
        while True:
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
                return
            # Listen only to the workers the merge waits for: a chunk from another would wake
            # this thread for nothing (and its worker would pay for the wake-up). A dispatcher
            # needs every worker's progress to feed the next items.
            awaited = merge.awaited() if dispatcher is None else None
            messages = pool.receive(None, wake, awaited)
            if messages is None:
                return  # woken: the consumer is gone
            for worker_id, message in messages:
                self._accept(merge, worker_id, message, generation)

    def _accept(self, merge: Merge, worker_id: int, message: Any, generation: int) -> None:
        if isinstance(message, tuple):  # a decoded chunk: (generation, entries)
            chunk_generation, entries = message
            if chunk_generation == generation:
                merge.add_chunk(worker_id, entries)
        elif isinstance(message, EpochEnd):
            if message.generation == generation:
                merge.end_lane(worker_id)
        elif isinstance(message, StageReport):
            if message.generation == generation:
                self._stage_reports[worker_id] = [StageTotals(*stage) for stage in message.stages]
        elif isinstance(message, Progress):
            if message.generation == generation and self._dispatcher is not None:
                self._dispatcher.progress(worker_id, message.taken)
                if merge.positional:
                    merge.raise_floor(worker_id, message.position)
        elif isinstance(message, Failure):
            if message.generation == generation:
                raise self._pool.failure_error(message)
        else:
            raise WorkerError(f"worker {worker_id} sent an unexpected message {type(message).__name__}")

    def _prefetched(self) -> Iterator[list[Entry]]:
        """Runs merged ahead by a thread while that pays (the consumer is busy elsewhere
        and the workers are ahead), by the consumer's thread otherwise; closing this wakes
        the thread if it is waiting."""
        wake_reader, wake_writer = os.pipe()
        try:
            runs = self._runs(self._generation, wake_reader)
            # The thread may be waiting on the workers when the consumer leaves: wake it.
            yield from adaptive_read_ahead(
                runs,
                self._prefetch,
                self._thread_name,
                len,
                interrupt=lambda: os.write(wake_writer, b"x"),
                # Workers start as the waiting goes on; the thread must not start any (a
                # worker forked by another thread would not die with the main process).
                before_thread=self._pool.start_remaining,
            )
        finally:
            os.close(wake_reader)
            os.close(wake_writer)

    def helper_thread_ids(self) -> list[int]:
        """The thread merging ahead for this reader, if running (for statistics)."""
        return [t.ident for t in threading.enumerate() if t.name == self._thread_name and t.ident is not None]

    def stage_totals(self) -> list[StageTotals] | None:
        """The workers' latest stage reports of this epoch, summed stage by stage. A worker
        whose graph differs (a ``worker_init_fn`` changed it) gets rows of its own."""
        merged: list[StageTotals] | None = None
        own_rows: list[StageTotals] = []
        for worker_id, report in sorted(self._stage_reports.items()):
            if merged is None or [t.label for t in merged] == [t.label for t in report]:
                merged = merge_totals(merged, report)
            else:
                own_rows.extend(replace(t, label=f"{t.label} [worker {worker_id}]") for t in report)
        return None if merged is None else merged + own_rows

    # --- state ---------------------------------------------------------------------------

    def _current_state(self) -> dict[str, Any]:
        states, bounds, last_lane = list(self._states), list(self._bounds), self._last_lane
        for lane, _, state, position in self._run[: self._run_taken]:
            states[lane], bounds[lane], last_lane = state, position, lane
        return {
            "workers": states,
            "merge": {"last_lane": last_lane, "bounds": [list(b) if b is not None else None for b in bounds]},
        }

    def _check_state(self, state: Mapping[str, Any]) -> None:
        require_keys(state, {"workers": list, "merge": Mapping}, repr(self))
        if len(state["workers"]) != self._pool.num_workers:
            raise StateError(f"{self!r}: expected {self._pool.num_workers} worker states")
        check_merge_state(state["merge"], self._pool.num_workers, f"{self!r} merge")

    def __repr__(self) -> str:
        return f"WorkerReader(num_workers={self._pool.num_workers}, in_order={self._in_order})"
