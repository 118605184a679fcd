"""Opt-in statistics by stack sampling: ``DataLoader2(..., collect_stats="sample")``.

What it installs, and so why it is not the default: in the main process, a thread that
looks at every thread's stack every 10 ms of wall time; in each worker process, a
``SIGPROF`` handler with a 10 ms ``ITIMER_PROF`` (CPU time), handled in its main thread,
and a thread that charges the wall time the main thread spent blocked. Signals interrupt
blocking calls of C extensions (EINTR) and displace any profiler the user runs there;
counting every stage's items wraps each stage in a generator of its own. In exchange it
sees every thread (a stage behind a prefetch thread, the workers' own loop) and needs no
cooperation from the puller. The default (:mod:`conveyor.observe.stats`) installs nothing.

* **Items** are counted exactly: every stage's pass yields through a counting generator
  whose code object is its own (a renamed copy, unique per stage and per sampler), so a
  sampled stack names its stages by code alone, without reading frame locals (that would
  keep items alive).
* **Time** is sampled: each sample charges the interval to the innermost stage on a
  stack (*busy*) while every stage further out *waits on upstream*; a stage inside a
  function marked :func:`conveyor.core.stage_marks.waits_for_upstream` waits too.
"""

from __future__ import annotations

import itertools
import signal
import sys
import threading
import time
import types
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

from conveyor.core.base import DataPipe, IterDataPipe
from conveyor.core.graph import list_dps
from conveyor.core.passes import Pass, PassContext
from conveyor.core.read_ahead import close_iterator
from conveyor.core.stage_marks import IDLE_THREAD_IDS, WAIT_CODE_IDS
from conveyor.core.stages import stage_label
from conveyor.observe.stats import PipelineStats, StageTotals, build_report

#: Seconds between stack samples.
SAMPLE_INTERVAL_S = 0.01
#: Seconds between a worker's looks for blocked time: each look takes the GIL, which a
#: computing worker must hand over, so they are rarer than CPU samples.
BLOCKED_INTERVAL_S = 0.05


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

    ``only_thread`` samples that thread alone: a thread worker's stages all run in its
    thread, and the process's other threads (the consumer, other thread workers) are not
    its to charge.
    """

    def __init__(
        self,
        graph: DataPipe,
        watch_consumer: bool = False,
        runtime_label: str | None = None,
        interval_s: float = SAMPLE_INTERVAL_S,
        cpu_clock: bool = False,
        only_thread: int | None = None,
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
        # A thread worker's sampler: the other threads of the process are not its stages'.
        self._only_thread = only_thread
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
        end = self._stopped or time.perf_counter()
        with self._lock:
            waited = self._consumer_waiting
        wall = end - self._started if self._started else 0.0
        return build_report(self.totals(), worker_totals, wall, waited)

    def context(self) -> PassContext:
        """The context to open the epoch's pass in: its stages count through the meters."""
        return PassContext(meters=self.meters)

    def attach(self, root: Pass) -> None:
        """Nothing to keep: the meters count."""

    def _sample(self, weight: float, interrupted: Any = None, only: int | None = None) -> None:
        """Charge every other thread's stack, or only thread ``only``'s (and ``interrupted``,
        the frame a CPU tick interrupted in this thread).

        No frame object may outlive the sample: a frame object still referenced when its
        function returns takes a copy of its locals, and one in a cycle (this function's
        own frame holds the dict of frames) keeps them, items included, until the cyclic
        GC runs. So this thread's own entry is dropped and the dict emptied at once.
        """
        frames = sys._current_frames()
        only = self._only_thread if only is None else only
        try:
            del frames[threading.get_ident()]
            for idle in IDLE_THREAD_IDS:
                frames.pop(idle, None)
            watcher = self._thread  # the CPU clock's blocked-time thread: never a stage's work
            if watcher is not None and watcher.ident is not None and watcher.ident != threading.get_ident():
                frames.pop(watcher.ident, None)
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
    :func:`~conveyor.core.stage_marks.waits_for_upstream` charges no stage."""
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
