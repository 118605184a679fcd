"""Per-stage statistics: where a pipeline spends its time, and which stage holds it back.

Two cheap mechanisms, so the numbers can stay on:

* **Items** are counted exactly: every pipe's iterator is wrapped in a counting generator
  while its stage is metered (a Python frame per item and stage, nothing when off).
* **Time** is sampled: a thread looks at every thread's stack every few milliseconds and
  charges the interval to the innermost stage on it (*busy*: its own code and the user
  functions it calls) while every stage further out *waits on upstream*. A stage inside
  a function marked :func:`conveyor.waiting.waits_for_upstream` (a prefetch buffer, the
  pipes from the workers) waits too. Sampling costs tens of microseconds per tick and
  nothing per item.

Worker processes meter their own copy of the graph and send their numbers along with
their output; the main process adds them up per stage. The *bottleneck* is the stage
with the most busy time per process that runs it; when the training loop hardly waits
for the loader, the bottleneck is the consumer.
"""

from __future__ import annotations

import itertools
import signal
import sys
import threading
import time
import types
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from conveyor.graph import list_dps
from conveyor.pipes.base import DataPipe, IterDataPipe, close_iterator
from conveyor.waiting import IDLE_THREAD_IDS, WAIT_CODE_IDS

#: Seconds between stack samples.
SAMPLE_INTERVAL_S = 0.01
#: Seconds between a worker's looks for blocked time: each look takes the GIL, which a
#: computing worker must hand over, so they are rarer than CPU samples.
BLOCKED_INTERVAL_S = 0.05
#: What a worker's busy samples outside every stage are charged to: its event loop,
#: capturing each item's state and moving items to the main process.
WORKER_RUNTIME = "worker loop (state, transport)"
#: Consumer wait below this share of the epoch's wall time: the loader keeps up.
KEEPS_UP_BELOW = 0.05

CONSUMER = "consumer (the loop reading the loader)"


def _count_items(meter: StageMeter, items: Iterator[Any]) -> Iterator[Any]:
    """The template of every stage's counting generator (see :class:`StageMeter`)."""
    try:
        for item in items:
            meter.items += 1
            yield item
    finally:
        close_iterator(items)


class StageMeter:
    """Counts the items one stage yields.

    Its counting generator runs a code object of its own (a renamed copy of the
    template's), so a sampled stack tells which stage a frame belongs to by its code
    alone: reading a frame's locals instead would snapshot them onto the frame and keep
    the items they refer to (and their shared memory) alive.
    """

    _serials = itertools.count()

    __slots__ = ("_count", "code", "items")

    def __init__(self, stage: int, sampler: int) -> None:
        self.items = 0
        # The sampler finds it by identity; the name tells the stage in a traceback or a
        # profile (and stays unique per sampler, so two loaders' frames never look alike).
        name = f"conveyor_stage_{sampler}_{stage}"
        self.code = _count_items.__code__.replace(co_name=name, co_qualname=name)
        self._count = types.FunctionType(self.code, _count_items.__globals__, name)

    def count(self, items: Iterator[Any]) -> Iterator[Any]:
        return self._count(self, items)


@dataclass
class StageTotals:
    """Raw numbers for one stage in one or more processes (plain data: it crosses pipes)."""

    label: str
    items: int = 0
    busy_s: float = 0.0
    waiting_s: float = 0.0
    processes: int = 1

    def add(self, other: StageTotals) -> None:
        self.items += other.items
        self.busy_s += other.busy_s
        self.waiting_s += other.waiting_s


class StageSampler:
    """Meters every stage of a graph in this process while started.

    Passes opened with :attr:`meters` in their context count their items;
    ``start()`` starts sampling;
    ``stop()`` stops it (idempotent). Two clocks:

    * a sampling thread, every ``interval_s`` of wall time (the default). The thread holds
      the sampler weakly and ends by itself if the sampler is dropped without ``stop()``.
      A thread can only look while it holds the GIL, so it tends to look when another
      thread lets go of it: fine where the pipeline computes, skewed where the thread
      being watched releases the GIL often (a worker's loop, sending every few ms).
    * ``cpu_clock=True``, for processes that conveyor owns (workers), started from their
      main thread: ``SIGPROF`` every ``interval_s`` of the process's CPU time, handled in
      the main thread between two bytecodes, so unbiased by the GIL (the signal comes only
      while the process computes, so it rarely interrupts a blocking call); and, for the
      wall time the main thread spends blocked (a stage that sleeps or waits on I/O holds
      the pipeline back as much as one that computes), a thread that, after each
      :data:`BLOCKED_INTERVAL_S` in which the main thread mostly did not compute, charges
      its wall time minus its CPU time to where it stands.
    """

    def __init__(
        self,
        graph: DataPipe,
        watch_consumer: bool = False,
        runtime_label: str | None = None,
        interval_s: float = SAMPLE_INTERVAL_S,
        cpu_clock: bool = False,
    ):
        self._nodes = [node for node in list_dps(graph) if isinstance(node, IterDataPipe)]
        serial = next(StageMeter._serials)
        self._meters = [StageMeter(i, serial) for i in range(len(self._nodes))]
        #: For the passes: ``id(stage pipe) -> its meter`` (see PassContext).
        self.meters = {id(node): meter for node, meter in zip(self._nodes, self._meters, strict=True)}
        # By id: the meters hold their code objects for as long as this sampler lives.
        self._meter_stage = {id(meter.code): i for i, meter in enumerate(self._meters)}
        # Stages that read in threads of their own (the worker reader's merging thread).
        self._with_helpers = [(i, n) for i, n in enumerate(self._nodes) if hasattr(n, "helper_thread_ids")]
        self._busy = [0.0] * len(self._nodes)
        self._waiting = [0.0] * len(self._nodes)
        self._interval = interval_s
        # A frame of the last stage's counter: the consumer is inside next(), waiting.
        self._consumer_code = id(self._meters[0].code) if watch_consumer and self._meters else None
        self._consumer_waiting = 0.0
        self._runtime_label = runtime_label  # charge the rest of the busy samples to it
        self._runtime_busy = 0.0
        self._started = self._stopped = 0.0
        # Reentrant: with the CPU clock, the sample runs in the thread that may hold it.
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cpu_clock = cpu_clock and threading.current_thread() is threading.main_thread()
        self._previous_handler: Any = None
        self._running = False

    def start(self) -> None:
        if self._running:
            return
        self._running = True
        self._started, self._stopped = time.perf_counter(), 0.0
        self._stop.clear()
        if self._cpu_clock:
            self._previous_handler = signal.signal(signal.SIGPROF, self._on_cpu_tick)
            signal.setitimer(signal.ITIMER_PROF, self._interval, self._interval)
            target: Any = _charge_blocked_until_stopped
            args: tuple[Any, ...] = (weakref.ref(self), self._stop, threading.get_ident())
        else:
            target, args = _sample_until_stopped, (weakref.ref(self), self._stop)
        self._thread = threading.Thread(target=target, args=args, name="conveyor-stats", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if not self._running:
            return
        self._running = False
        self._stopped = time.perf_counter()
        if self._cpu_clock:
            signal.setitimer(signal.ITIMER_PROF, 0, 0)
            signal.signal(signal.SIGPROF, self._previous_handler)
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join(10 * self._interval + 1.0)

    def _on_cpu_tick(self, signum: int, frame: Any) -> None:
        self._sample(self._interval, interrupted=frame)

    def totals(self) -> list[StageTotals]:
        """Per stage, in graph order; then the runtime's busy time, when it has a label."""
        with self._lock:
            totals = [
                StageTotals(stage_label(node), meter.items, busy, waiting)
                for node, meter, busy, waiting in zip(self._nodes, self._meters, self._busy, self._waiting, strict=True)
            ]
            if self._runtime_label is not None:
                totals.append(StageTotals(self._runtime_label, 0, self._runtime_busy, 0.0))
            return totals

    def report(self, worker_totals: Sequence[StageTotals] | None = None) -> PipelineStats:
        """This process's stages (then the workers' ones, when given) as a report."""
        main = self.totals()
        stages = [StageStats(i, t.label, "main", t.items, t.busy_s, t.waiting_s, 1) for i, t in enumerate(main)]
        for t in worker_totals or ():
            stages.append(StageStats(len(stages), t.label, "workers", t.items, t.busy_s, t.waiting_s, t.processes))
        end = self._stopped or time.perf_counter()
        with self._lock:
            waited = self._consumer_waiting
        return PipelineStats(
            stages=stages,
            wall_s=end - self._started if self._started else 0.0,
            consumer_wait_s=waited,
            items=main[0].items if main else 0,
        )

    def _sample(self, weight: float, interrupted: Any = None, only: int | None = None) -> None:
        """Charge every other thread's stack, or only thread ``only``'s (and ``interrupted``,
        the frame a CPU tick interrupted in this thread).

        No frame object may outlive the sample: a frame object still referenced when its
        function returns takes a copy of its locals, and one in a cycle (this function's
        own frame holds the dict of frames) keeps them, items included, until the cyclic
        GC runs. So this thread's own entry is dropped and the dict emptied at once.
        """
        frames = sys._current_frames()
        try:
            del frames[threading.get_ident()]
            for idle in IDLE_THREAD_IDS:
                frames.pop(idle, None)
            watcher = self._thread  # the CPU clock's blocked-time thread: never a stage's work
            if watcher is not None and watcher.ident != threading.get_ident():
                frames.pop(watcher.ident, None)  # type: ignore[arg-type]
            helpers = {ident: stage for stage, node in self._with_helpers for ident in node.helper_thread_ids()}
            with self._lock:
                if interrupted is not None:
                    self._charge(interrupted, weight, None)
                for thread_id, frame in frames.items():
                    if only is None or thread_id == only:
                        self._charge(frame, weight, helpers.get(thread_id))
        finally:
            frames.clear()

    def _charge(self, frame: Any, weight: float, helper: int | None) -> None:
        """Charge one thread's sample. Walking outwards from the innermost frame, the first
        stage met is busy (unless a wait function came first) and every later one waits on
        upstream. A stage's own helper thread (``helper``: its stage), which runs no
        counting frame, is charged to that stage."""
        blocked, charged = False, False
        meter_stage = self._meter_stage
        while frame is not None:
            code = id(frame.f_code)
            if code in WAIT_CODE_IDS:
                blocked = True
            elif (stage := meter_stage.get(code)) is not None:
                if code == self._consumer_code:
                    self._consumer_waiting += weight
                (self._waiting if charged or blocked else self._busy)[stage] += weight
                charged = True
            frame = frame.f_back
        if not charged and helper is not None:
            (self._waiting if blocked else self._busy)[helper] += weight
        elif not charged and not blocked and self._runtime_label is not None:
            self._runtime_busy += weight


def _charge_blocked_until_stopped(sampler_ref: weakref.ref[StageSampler], stop: threading.Event, watched: int) -> None:
    """The CPU clock's other half: every :data:`BLOCKED_INTERVAL_S`, the wall time the
    ``watched`` thread did not compute (it slept, waited on I/O or for a worker's credits)
    is charged to where it stands; a wait marked
    :func:`~conveyor.waiting.waits_for_upstream` charges no stage."""
    clock = time.pthread_getcpuclockid(watched)
    last_wall, last_cpu = time.perf_counter(), time.clock_gettime(clock)
    while not stop.wait(BLOCKED_INTERVAL_S):
        sampler = sampler_ref()
        if sampler is None:
            return
        wall, cpu = time.perf_counter(), time.clock_gettime(clock)
        computed, elapsed = cpu - last_cpu, wall - last_wall
        last_wall, last_cpu = wall, cpu
        # Mostly blocked: it stands where it blocks. A thread that mostly computed was at
        # most preempted or briefly in a send; the CPU ticks charge it, and looking now
        # (when it lets go of the GIL) would favour its sends.
        if computed < elapsed / 2:
            sampler._sample(elapsed - computed, only=watched)
        del sampler


def _sample_until_stopped(sampler_ref: weakref.ref[StageSampler], stop: threading.Event) -> None:
    last = time.perf_counter()
    while True:
        sampler = sampler_ref()
        if sampler is None:
            return
        interval = sampler._interval
        del sampler  # hold it weakly while waiting
        if stop.wait(interval):
            return
        sampler = sampler_ref()
        if sampler is None:
            return
        now = time.perf_counter()
        sampler._sample(now - last)
        last = now
        del sampler


def stage_label(node: DataPipe) -> str:
    """A short name: the op's class and, for ops that call a function, its name."""
    fn = getattr(node, "fn", None)
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return f"{type(node).__name__}({name})" if name else type(node).__name__


# --- the report ---------------------------------------------------------------------------


@dataclass(frozen=True)
class StageStats:
    """One stage: where it runs, items it yielded, seconds busy and seconds waiting on
    upstream (summed over the processes that run it)."""

    index: int
    label: str
    where: str  # "main" or "workers"
    items: int
    busy_s: float
    waiting_s: float
    processes: int

    @property
    def busy_per_process_s(self) -> float:
        return self.busy_s / max(1, self.processes)


@dataclass(frozen=True)
class PipelineStats:
    """What ``DataLoader2.stats()`` returns: per-stage numbers, sources last, and the bottleneck.

    ``wall_s`` is the time since the epoch began; ``consumer_wait_s`` how much of it the
    loop reading the loader spent waiting for the next item.
    """

    stages: Sequence[StageStats]
    wall_s: float
    consumer_wait_s: float
    items: int
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def bottleneck(self) -> str:
        """The label of the stage holding the pipeline back, or :data:`CONSUMER`."""
        if self.wall_s <= 0 or self.consumer_wait_s < KEEPS_UP_BELOW * self.wall_s or not self.stages:
            return CONSUMER
        return max(self.stages, key=lambda s: s.busy_per_process_s).label

    def table(self) -> str:
        """A fixed-width table, one row per stage, ending with the bottleneck."""
        header = f"{'stage':<40} {'runs in':<12} {'items':>10} {'busy s':>9} {'waiting s':>10}"
        rows = [header, "-" * len(header)]
        for stage in reversed(self.stages):  # sources first, as data flows
            where = stage.where if stage.processes == 1 else f"{stage.processes} {stage.where}"
            rows.append(
                f"{stage.label[:40]:<40} {where:<12} {stage.items:>10,} {stage.busy_s:>9.2f} {stage.waiting_s:>10.2f}"
            )
        share = self.consumer_wait_s / self.wall_s if self.wall_s > 0 else 0.0
        rows.append(
            f"{self.items:,} items in {self.wall_s:.2f} s; the loop waited {self.consumer_wait_s:.2f} s "
            f"({share:.0%}) for items; bottleneck: {self.bottleneck}"
        )
        return "\n".join(rows)

    def __str__(self) -> str:
        return self.table()


def merge_totals(into: list[StageTotals] | None, more: Sequence[StageTotals]) -> list[StageTotals]:
    """Add one process's totals to another's, stage by stage (same graph)."""
    if into is None:
        return [StageTotals(t.label, t.items, t.busy_s, t.waiting_s, t.processes) for t in more]
    for mine, theirs in zip(into, more, strict=True):
        mine.add(theirs)
        mine.processes += theirs.processes
    return into
