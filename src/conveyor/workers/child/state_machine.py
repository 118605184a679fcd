"""A worker's epoch lifecycle as a state machine, free of I/O.

States: ``IDLE`` (no epoch yet), ``RUNNING`` (an epoch is being read), ``EXHAUSTED`` (its
share of the epoch is done), ``FAILED`` (the pipeline raised; waits for a new epoch).
The event loop (:mod:`conveyor.workers.child.event_loop`) feeds it requests and sends what it
returns; it decides nothing about sockets, and this module nothing about timing.
"""

from __future__ import annotations

import enum
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from conveyor.core.base import IterDataPipe
from conveyor.core.error_budget import WorkerSkips
from conveyor.core.exception_parts import pickled_parts
from conveyor.core.graph import apply_random_seed
from conveyor.core.passes import Pass, PassContext
from conveyor.core.random import SeedGenerator, seed_global_rngs
from conveyor.core.worker_info import WorkerInfo
from conveyor.observe.pull_profiler import LONG_INTERVAL_S
from conveyor.observe.run_delay import run_delay_ns
from conveyor.observe.stack_sampler import StageSampler
from conveyor.observe.stats import WORKER_RUNTIME, EpochStats
from conveyor.workers.child.dispatch import FeedQueue, Interrupted, dispatched_sources
from conveyor.workers.transport.chunk_states import ChunkStates
from conveyor.workers.transport.codec import EncodedFrame, Encoder
from conveyor.workers.transport.protocol import Chunk, EpochEnd, Failure, StageReport, StartEpoch

if TYPE_CHECKING:
    from conveyor.workers.transport.thread_channels import HandOff

ResetFn = Callable[[IterDataPipe, WorkerInfo, SeedGenerator], IterDataPipe]

#: A chunk is sent when it holds this many items, or this many bytes of large buffers, or
#: once this long has passed since it was begun (so slow pipelines still flow). An
#: epoch's first chunk holds one item and each next one twice as many, up to the maximum,
#: so the first item arrives as early as possible. Each chunk wakes the main process,
#: which then runs with caches its workers' items have filled: the longer a chunk may
#: wait, the fewer wake-ups slow items cost it (the measurements behind 20 ms:
#: benchmarks/results/history.md).
CHUNK_MAX_ITEMS = 64
CHUNK_MAX_BYTES = 2 * 1024 * 1024
CHUNK_MAX_SECONDS = 0.02
#: Bytes of large buffers a worker may have sent and not yet seen merged: besides its
#: credits, this bounds its read-ahead of big items and so the part of its ring it
#: touches; a smaller ring footprint stays in cache.
IN_FLIGHT_MAX_BYTES = 4 * 1024 * 1024
#: Below this rate of making large buffers, a worker's items cost more to make than to
#: move, and the cache no longer matters: it may have up to half its ring in flight. An
#: in-order merge can need a long run of items from one worker (a shard's batches) while
#: another waits with its next ones made; with the cap above, two workers making large
#: batches of decoded images took turns.
SLOW_BYTES_PER_S = 1 << 30
#: Chunks a worker may always have in flight, whatever their bytes: with one, items larger
#: than IN_FLIGHT_MAX_BYTES make the workers take turns (an in-order merge hands out item
#: k once the next worker has sent item k+1, which it makes only once its item k-1 was
#: merged), leaving a worker idle.
IN_FLIGHT_MIN_CHUNKS = 2
#: Seconds between a worker's stage reports while statistics are collected.
STAGE_REPORT_S = 1.0


class Phase(enum.Enum):
    IDLE = "idle"
    RUNNING = "running"
    EXHAUSTED = "exhausted"
    FAILED = "failed"


class WorkerStateMachine:
    """One worker's epochs: seeding, resuming, and reading its graph into chunks."""

    def __init__(
        self,
        graph: IterDataPipe,
        info: WorkerInfo,
        encoder: Encoder | HandOff,
        reset_fn: ResetFn | None = None,
        thread_worker: bool = False,
        seed_epoch: Callable[[int, int], None] | None = None,
    ):
        self.graph = graph
        self.info = info
        # A thread of the main process: the global RNGs are the process's, shared with the
        # user and the other threads, so they are left alone; stack sampling looks at this
        # thread only.
        self._thread_worker = thread_worker
        # A worker_init_fn that seeds the global RNGs by a scheme of its own (torch's, for
        # conveyor.DataLoader) seeds them for each epoch: seed_epoch(base_seed, worker_id).
        self._seed_epoch = seed_epoch
        self.phase = Phase.IDLE
        self.generation = -1
        self.credits = 0
        self._encoder = encoder
        self._reset_fn = reset_fn
        self._pass: Pass | None = None
        self._chunk_items = 1
        self._sequence = 0  # chunks sent (the main process checks that none goes missing)
        self._sent_bytes: deque[int] = deque()  # large-buffer bytes of each chunk not yet merged
        self._in_flight_bytes = 0
        self._in_flight_cap = IN_FLIGHT_MAX_BYTES  # see SLOW_BYTES_PER_S
        self._chunk: list[tuple[Any, dict[str, Any], Any]] = []  # (item, state after it, position)
        #: Dispatch mode: a queue of fed items per dispatch point (channel), else empty.
        self.feeds: list[FeedQueue] = []
        for source in dispatched_sources(graph):
            while len(self.feeds) <= source.channel:
                self.feeds.append(FeedQueue(len(self.feeds)))
            source.connect(self.feeds[source.channel])
        self.interruption: Any = None  # a request that interrupted the pipeline mid-chunk
        self._sampler: EpochStats | StageSampler | None = None  # the epoch's, when statistics are collected
        self._gap_state = info.worker_id + 1  # for _timing_gap: the user's global RNG is left alone
        self._left = (1, 1)  # statistics: pulls until one is timed, out of how many
        self._earlier_stats: EpochStats | None = None  # the last epoch's (its schedule goes on)
        self._next_report = 0.0
        self._skips: WorkerSkips | None = None  # on_error="skip": records of items dropped, to send

    # --- requests ------------------------------------------------------------------------

    def start_epoch(self, request: StartEpoch) -> list[Any]:
        """Seed and position the graph for a new epoch; returns messages to send (a Failure)."""
        self._close_pass()
        self.generation, self.credits = request.generation, request.credits
        self._sent_bytes = deque()
        self._in_flight_bytes = 0
        for feed in self.feeds:
            feed.restart(request.generation)
        try:
            seeds = request.seeds.spawn(self.info.worker_id)
            apply_random_seed(self.graph, seeds)
            if self._seed_epoch is not None and not self._thread_worker:
                self._seed_epoch(request.seeds.base_seed, self.info.worker_id)
            elif not self._thread_worker:  # a thread worker's global RNGs are the user's
                global_seed = request.global_rng_seed
                seed_global_rngs(global_seed if global_seed is not None else seeds.global_rng_seed())
            if self._reset_fn is not None:
                returned = self._reset_fn(self.graph, self.info, seeds)
                if returned is not self.graph:
                    raise ValueError("worker_reset_fn must return the graph it was given (changed in place)")
            if request.resume is not None:
                self.graph.check_state(request.resume, f"worker {self.info.worker_id} state")
            context = PassContext()
            self._skips = WorkerSkips(request.skips, self.info.worker_id) if request.skips is not None else None
            if request.collect_stats == "sample":  # opted in: SIGPROF and threads, see stack_sampler
                sampler = StageSampler(
                    self.graph,
                    runtime_label=WORKER_RUNTIME,
                    cpu_clock=not self._thread_worker,
                    only_thread=threading.get_ident() if self._thread_worker else None,
                )
                sampler.start()
                self._sampler = sampler
            elif request.collect_stats:
                earlier = self._earlier_stats
                self._sampler = self._earlier_stats = EpochStats(self.graph, WORKER_RUNTIME, earlier)
            if self._sampler is not None:
                context = self._sampler.context()
                self._next_report = time.monotonic() + STAGE_REPORT_S
            if self._skips is not None:
                context = context.with_skips(self._skips)
            self._pass = context.open(self.graph, request.resume)
            if self._sampler is not None:
                self._sampler.attach(self._pass)
        except Exception as error:
            return [self._fail(error)]
        self.phase = Phase.RUNNING
        self._chunk_items = 1
        return []

    def grant(self, credits: int) -> None:
        """The main process merged ``credits`` more of this epoch's chunks, oldest first."""
        self.credits += credits
        for _ in range(min(credits, len(self._sent_bytes))):
            self._in_flight_bytes -= self._sent_bytes.popleft()

    def can_produce(self) -> bool:
        return (
            self.phase is Phase.RUNNING
            and self.credits > 0
            and (self._in_flight_bytes < self._in_flight_cap or len(self._sent_bytes) < IN_FLIGHT_MIN_CHUNKS)
        )

    # --- production ----------------------------------------------------------------------

    def produce(self) -> list[Any]:
        """Read the next chunk; returns the messages to send (Chunk, EpochEnd or Failure)."""
        assert self._pass is not None and self.phase is Phase.RUNNING
        opened = self._pass
        items, capture, position_of = opened.items, opened.state, opened.position
        prepare = self._encoder.prepare
        stats = self._sampler if isinstance(self._sampler, EpochStats) else None
        profiler = stats.profiler if stats is not None else None
        clock = time.perf_counter
        started = clock()
        delay_at_start = run_delay_ns() if stats is not None else None
        left, span = self._left  # pulls until the next timed one, out of span
        timed_pulls, timed_s = 0, 0.0
        chunk: list[tuple[Any, dict[str, Any], Any]] = []
        self._chunk = chunk
        deadline = started + CHUNK_MAX_SECONDS
        messages: list[Any] = []
        skips = self._skips
        try:
            limit, self._chunk_items = self._chunk_items, min(2 * self._chunk_items, CHUNK_MAX_ITEMS)
            large_bytes = 0
            while len(chunk) < limit:
                try:
                    left -= 1
                    if profiler is None or left > 0:
                        item = next(items)
                    else:  # statistics: one pull in several timed, and now and then traced
                        profiler.countdown -= span
                        delay, pulled = run_delay_ns(), clock()
                        try:
                            item = profiler.pull(items, opened) if profiler.countdown <= 0 else next(items)
                        finally:  # the pull that ends the epoch counts too: it may be the only one
                            spent = clock() - pulled
                            if delay is not None and spent > LONG_INTERVAL_S:  # time spent preempted is no stage's
                                spent -= min(spent, (run_delay_ns() - delay) / 1e9)  # type: ignore[operator]
                            timed_pulls, timed_s = timed_pulls + 1, timed_s + spent
                        span = left = min(self._timing_gap(), max(1, profiler.countdown))
                except StopIteration:
                    self.phase = Phase.EXHAUSTED
                    break
                if skips is not None and skips.pending:
                    skips.add_to(chunk, position_of())
                item, large = prepare(item)
                chunk.append((item, capture(), position_of()))
                if large:
                    large_bytes += large
                    if large_bytes >= CHUNK_MAX_BYTES:
                        break
                if clock() > deadline:
                    break
        except Interrupted:
            self.phase = Phase.IDLE  # the event loop now handles self.interruption
            self._close_pass()
            return []
        except Exception as error:
            if skips is not None and skips.pending:  # the items dropped before it come first
                skips.add_to(chunk, None)
            if chunk:
                messages.append(self._encode(chunk))
            messages.append(self._fail(error))
            return messages
        if skips is not None:
            if skips.pending:  # dropped after the last item: sent before the epoch's end
                skips.add_to(chunk, None)
            elif chunk:
                skips.last_position = chunk[-1][2]
        if large_bytes:
            self._pace(large_bytes, clock() - started)
        try:
            if chunk:
                messages.append(self._encode(chunk))
        except Exception as error:  # an item that cannot be pickled: say which and why
            note = "[conveyor] an item could not be sent to the main process; items must pickle"
            error.add_note(note)
            return [self._fail(error)]
        if stats is not None:
            self._left = (left, span)
            seconds = clock() - started
            if delay_at_start is not None:  # time spent preempted is nobody's, the loop's included
                seconds -= min(seconds, (run_delay_ns() - delay_at_start) / 1e9)  # type: ignore[operator]
            stats.add_runtime(seconds, len(chunk) + (self.phase is Phase.EXHAUSTED), timed_pulls, timed_s)
        if self._sampler is not None and (self.phase is Phase.EXHAUSTED or time.monotonic() >= self._next_report):
            messages.append(self._stage_report())
        if self.phase is Phase.EXHAUSTED:
            self._close_pass()
            messages.append(EpochEnd(self.generation))
        return messages

    def _pace(self, large_bytes: int, seconds: float) -> None:
        """Set the in-flight cap from how fast the last chunk's large buffers were made."""
        cap = IN_FLIGHT_MAX_BYTES
        if large_bytes < SLOW_BYTES_PER_S * seconds:
            cap = max(cap, self._encoder.ring_capacity // 2)
        self._in_flight_cap = cap

    def _timing_gap(self) -> int:
        """Pulls until the next one whose time is read (both clock reads of every pull
        would cost small items a few percent): 16 to 47, at random (a generator of its
        own, cheaper per call than ``random``'s: this runs every few dozen items)."""
        self._gap_state = (self._gap_state * 1103515245 + 12345) & 0x7FFFFFFF
        return 16 + (self._gap_state >> 16) % 32

    def _stage_report(self) -> StageReport:
        assert self._sampler is not None
        self._next_report = time.monotonic() + STAGE_REPORT_S
        totals = self._sampler.totals()
        return StageReport(self.generation, [(t.label, t.items, t.busy_s, t.waiting_s) for t in totals])

    def _stop_sampler(self) -> None:
        sampler, self._sampler = self._sampler, None
        if sampler is not None:
            sampler.stop()

    def flush(self) -> EncodedFrame | Chunk | None:
        """The items read so far in the chunk being built, as a chunk of their own (sent
        before a progress report, which must not overtake them)."""
        if not self._chunk:
            return None
        message = self._encode(list(self._chunk))
        self._chunk.clear()
        return message

    def _encode(self, entries: list[tuple[Any, Any, Any]]) -> EncodedFrame | Chunk:
        """``(item, state, position)`` entries as the chunk to send: its frame (a thread
        worker: the chunk itself, its states a snapshot)."""
        items, states, positions = zip(*entries, strict=True)
        chunk = Chunk(self.info.worker_id, self.generation, self._sequence, items, positions, ChunkStates.of(states))
        sent, size = self._encoder.encode_chunk(chunk)
        self._sequence += 1
        self.credits -= 1
        self._sent_bytes.append(size)
        self._in_flight_bytes += size
        return sent

    def _fail(self, error: BaseException) -> Failure:
        self.phase = Phase.FAILED
        position = self._pass.position() if self._pass is not None else None
        self._close_pass()
        return failure_message(self.generation, self.info.worker_id, error, position)

    def _close_pass(self) -> None:
        self._encoder.discard()  # a chunk left half built (an interrupted pipeline) is not sent
        self._stop_sampler()
        opened, self._pass = self._pass, None
        if opened is not None:
            opened.close()

    def idle(self) -> None:
        """Nothing happened for a while: let go of memory kept for reuse (spill files)."""
        self._encoder.idle()

    def close(self) -> None:
        self._close_pass()


def failure_message(
    generation: int, worker_id: int, error: BaseException, position: tuple[int, ...] | None = None
) -> Failure:
    text = "".join(traceback.format_exception(error))
    pickled = pickled_parts(error)
    at = list(position) if position is not None else None
    return Failure(generation, worker_id, type(error).__qualname__, str(error), text, pickled, at)
