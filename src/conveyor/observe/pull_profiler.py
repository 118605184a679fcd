"""Where an item's time goes, stage by stage, measured on a sample of items.

Default statistics install no signal handler, no timer and no thread. The thread that
pulls items from a pass tree (the consumer's, or a worker's loop) times a sample of its
own pulls: for one pull now and then it sets a trace function (``sys.settrace``, for that
one pull, on that thread only, and never while a tracer or profiler is set, so a user's
debugger, coverage or profiler is never displaced), which sees every stage's generator
resume and yield; calls of C functions and lines are not traced, and a Python call that
is neither a stage nor a wait costs a count.

The time between two events is charged to the innermost stage running, as its *busy*
time (its own code and the functions it calls), unless it runs a function marked
:func:`~conveyor.core.stage_marks.waits_for_upstream` (a buffer, the pipes from the workers); a
stage's time from resuming to yielding that is not busy is its time *waiting on
upstream*. A puller that times its own pulls (a worker's loop) gets them split between
the stages by the samples' shares; the consumer, which cannot afford a clock per item,
gets its share of time in pulls from the gap after each sample (a ratio: steadier than
adding sampled pulls up); failing both, each sampled pull stands for the pulls since the
last sample, and the last one for the pulls after it.

Samples are spaced so that they cost about 1%: :data:`MIN_INTERVAL_S` apart on average, or
more, :data:`COST_RATIO` times what tracing costs (:data:`TOGGLE_COST_S` a sample, and
:data:`EVENT_COST_S` per trace event, counted as they go). The gaps vary at random by up
to half (a generator of the profiler's own): pulls that cost more every n-th time (a
batch, a file opened every thousand lines) are neither always sampled nor never. The
first sample comes a few pulls in (the first pays for the epoch's start). Deciding costs
the puller one decrement per item.

Time the puller spent waiting to run (preempted by other processes, or woken and waiting
for a CPU: its *run delay*, :mod:`conveyor.observe.run_delay`) is nobody's work: it is taken out
of the interval it fell in, read after every interval longer than
:data:`LONG_INTERVAL_S` (a shorter one cannot hide a delay that matters). Without it, on
a loaded machine one preempted sample outweighed a hundred others. The pull's own
duration stays wall time: the consumer did wait through it.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Iterator
from typing import Any

from conveyor.core.passes import Pass
from conveyor.core.stage_marks import WAIT_CODE_IDS
from conveyor.observe.run_delay import run_delay_ns
from conveyor.observe.trace_cost import TraceFunction, call_cost

#: Seconds between two sampled pulls, on average, at least.
MIN_INTERVAL_S = 0.005
#: What turning tracing on and off costs, besides the events (measured here: ~15 us on
#: Python 3.11; 0.25-0.4 ms from 3.12 on, where it instruments and later restores the code
#: that ran).
TOGGLE_COST_S = 2e-5 if sys.version_info < (3, 12) else 4e-4
#: What tracing adds to a sampled pull, per trace event (a Python call of the trace
#: function that mostly just counts; measured ~0.5 us here, taken high).
EVENT_COST_S = 1e-6
#: What profiling added to a sample, times this, is the least time to the next: ~1%.
COST_RATIO = 100
#: Pulls between two samples, at most (a sample every few seconds even for tiny items).
MOST_PULLS_APART = 1 << 20
#: Pulls after a sample whose pace (one look at the clock at their end) places the next.
PROBE_PULLS = 8
#: What a gap's seconds and pulls keep of their weight, per later gap, in the pace.
PACE_DECAY = 0.75
#: Intervals between two trace events longer than this are checked for run delay.
LONG_INTERVAL_S = 50e-6


class PullProfiler:
    """Per-stage busy and waiting seconds of a pass tree, estimated from sampled pulls.

    ``stage_of`` maps ``id(pipe)`` to a stage index (``stages`` of them); ``first_sample``
    is the pull to time first (by default one of the 2nd to 4th). The puller decrements
    :attr:`countdown` per pull and calls :meth:`pull` instead of ``next(items)`` when it
    reaches zero.
    """

    def __init__(self, stage_of: dict[int, int], stages: int, first_sample: int | None = None) -> None:
        self._stage_of = stage_of
        self._stages = stages
        self._busy = [0.0] * stages  # estimates for the pulls the samples stand for ...
        self._waiting = [0.0] * stages
        self._pull_s = 0.0
        self._work_s = 0.0  # the same, less the run delay in them (what the stages' shares are of)
        self.covered = 0  # ... which are this many
        self._last = ([0.0] * stages, [0.0] * stages, 0.0, 0.0)  # the last sample's
        # Plain sums over the samples, and over the gaps the puller spent away right after
        # some of them (the puller reports when it comes back: :meth:`back`).
        self._sums = ([0.0] * stages, [0.0] * stages, [0.0, 0.0, 0])  # busy, waiting, [pull, away, pairs]
        self._sampled_s = 0.0  # the samples' own durations less their run delay, summed
        self._earlier: tuple[Any, float] | None = None  # the last epoch's sums, when it had some
        self._ended_at: float | None = None
        self._last_pull = 0.0
        self.samples = 0
        self._random = random.Random(0x5EED)  # its own: the user's global RNG is left alone
        # The consumer's first pull pays for the epoch's start (and, in process, may be a
        # long one to trace): its first sample comes a few pulls in. A worker's first
        # pull, traced, delayed the first item: it runs what stages import at first use
        # (numpy.fft: ~1 ms more traced, up to 5 ms in a loaded run), so a worker's
        # first sample is its second pull (see EpochStats).
        first = first_sample if first_sample is not None else self._random.randint(2, 4)
        self.countdown = self._apart = first  # pulls until the next sample
        self._probe: tuple[float, int, float] | None = None  # (since, pulls, seconds wanted to the next sample)
        self._gap: tuple[float, int] | None = None  # (since, pulls) of the gap to the next sample
        self._paced = [0.0, 0.0]  # seconds and pulls of the gaps so far, older ones fading
        # During one sampled pull:
        self._frames: dict[int, int] = {}  # id(frame) -> stage, for each pass's own generator
        self._codes: dict[int, int] = {}  # id(code) -> stage, for work a pass does outside it
        self._stack: list[tuple[Any, int, bool, float, float]] = []  # (frame, stage, a wait?, since, lost by then)
        self._delay_ns: int | None = None  # the puller's run delay at the last look, when known
        self.lost_s = 0.0  # run delay taken out of this sample's intervals so far
        self._inclusive = [0.0] * stages
        self._traced: list[Any] = []
        self._sample_busy = [0.0] * stages
        self._sample_waiting = [0.0] * stages
        self._waited = 0.0  # this sample's time in waits (a marked wait on top)
        self._passed = 0  # calls of functions that are neither a stage nor a wait since the last charge
        self._events = 0
        self._last_event = 0.0

    def new_epoch(self) -> None:
        """Start the next epoch's numbers. The schedule goes on, so that samples stay ~1%
        of the run even when an epoch is shorter than the gap between two samples; an
        epoch with no sample yet takes the last sample and the earlier shares instead."""
        stages = self._stages
        self._busy, self._waiting, self._pull_s, self.covered = [0.0] * stages, [0.0] * stages, 0.0, 0
        self._work_s = 0.0
        if self._sums[2][2]:
            self._earlier = (self._sums, self._sampled_s)
        self._sums = ([0.0] * stages, [0.0] * stages, [0.0, 0.0, 0])
        self._sampled_s = 0.0
        self._ended_at = None
        self.samples = 0
        self._apart = self.countdown
        if self._probe is not None:  # its pulls spanned the epoch's end: start one afresh
            _, _pulls, wanted = self._probe
            self._probe = (time.perf_counter(), self.countdown, wanted)
        self._gap = None  # it spans the time between the epochs

    def estimates(self, pulls: int, pull_s: float | None = None) -> tuple[list[float], list[float], float]:
        """``(busy per stage, waiting per stage, seconds in pulls)`` for the first ``pulls``
        pulls of the epoch. With ``pull_s``, the puller's own measure of its time in
        pulls, the samples only split that time between the stages."""
        rest = max(0, pulls - self.covered)
        last_busy, last_waiting, last_pull, last_work = self._last
        busy = [b + x * rest for b, x in zip(self._busy, last_busy, strict=True)]
        waiting = [w + x * rest for w, x in zip(self._waiting, last_waiting, strict=True)]
        estimated = self._pull_s + last_pull * rest
        if pull_s is None:
            return busy, waiting, estimated
        worked = self._work_s + last_work * rest
        if worked <= 0:  # no sample yet: the time in pulls is known, not how it was spent
            return busy, waiting, pull_s
        scale = pull_s / worked
        return [b * scale for b in busy], [w * scale for w in waiting], pull_s

    def back(self, now: float) -> None:
        """The puller came back for a pull right after a sampled one: the gap is what it
        spends away from the pulls (for :meth:`shares`)."""
        if self._ended_at is not None:
            pair = self._sums[2]
            pair[0] += self._last_pull
            pair[1] += now - self._ended_at
            pair[2] += 1
            self._ended_at = None

    @property
    def wants_back(self) -> bool:
        """Whether the next pull should report when it starts (:meth:`back`)."""
        return self._ended_at is not None

    def shares(self) -> tuple[float, list[float], list[float]] | None:
        """``(share of the puller's time spent in pulls, each stage's share of the pulls'
        time busy, and waiting)`` from the samples; None before a gap was seen."""
        sums, sampled = self._sums, self._sampled_s
        if not sums[2][2] and self._earlier is not None:
            sums, sampled = self._earlier
        busy, waiting, (pull, away, pairs) = sums
        if not pairs or pull + away <= 0 or sampled <= 0:
            return None
        return pull / (pull + away), [b / sampled for b in busy], [w / sampled for w in waiting]

    def pull(self, items: Iterator[Any], root: Pass | None) -> Any:
        """``next(items)``, timed stage by stage when no other profiler is set (``root``:
        the pass tree whose stages to charge), or, after a few pulls that follow a sample,
        only looking at the clock to learn their pace. Raises what ``next`` raises."""
        if self._probe is not None:  # the pace of the pulls since the last sample
            started, pulls, wanted = self._probe
            self._probe = None
            now = time.perf_counter()
            # Once whole gaps have been seen, their pace places the next sample: a probe's
            # few pulls may all come out of one burst (a run of items already received),
            # or catch the one slow pull between bursts.
            seconds, paced = self._paced
            per_pull = max(seconds / paced if paced else (now - started) / pulls, 1e-9)
            gap = max(1, round(wanted / per_pull * self._random.uniform(0.5, 1.5)))
            self.countdown = min(MOST_PULLS_APART, gap)
            self._apart += self.countdown
            self._gap = (now, self.countdown)
            return next(items)
        if sys.gettrace() is not None or sys.getprofile() is not None or root is None:
            self._schedule(time.perf_counter(), 0)
            return next(items)
        if self._gap is not None:
            since, pulls = self._gap
            seconds, paced = self._paced
            self._paced = [seconds * PACE_DECAY + time.perf_counter() - since, paced * PACE_DECAY + pulls]
            self._gap = None
        self._frames, self._codes = self._stage_frames(root)
        self._events = 0
        sample_busy, inclusive = self._sample_busy, self._inclusive
        for stage in range(self._stages):
            sample_busy[stage] = inclusive[stage] = 0.0
        self._delay_ns, self.lost_s, self._waited, self._passed = run_delay_ns(), 0.0, 0.0, 0
        start = self._last_event = time.perf_counter()
        sys.settrace(self._on_call)
        try:
            return next(items)
        finally:
            sys.settrace(None)
            end = time.perf_counter()
            self._elapsed(end)
            for frame in self._traced:
                frame.f_trace = None  # no reference to this profiler stays on a live frame
            self._traced.clear()
            for _, stage, waiting, since, lost in self._stack:  # still open (not seen to yield)
                if not waiting:
                    inclusive[stage] += end - since - (self.lost_s - lost)
            self._stack.clear()
            self._frames, self._codes = {}, {}
            for stage in range(self._stages):
                self._sample_waiting[stage] = max(0.0, inclusive[stage] - sample_busy[stage])
            self._record(end - start, self.lost_s)
            self._ended_at = end if self.samples > 1 else None
            self._schedule(end, self._events)

    def _record(self, pull_s: float, lost_s: float) -> None:
        """Add the sample (``pull_s`` long, ``lost_s`` of it run delay), standing for the
        pulls since the last one. The stages' shares are of the time charged to a stage or
        a wait: not of a run delay (no stage's; one preempted sample must not shrink every
        share), nor of tracing's own time between events (from Python 3.12 on, turning
        tracing on re-instruments each function as it next runs)."""
        weight = self._apart
        charged = sum(self._sample_busy) + self._waited
        work_s = charged if charged > 0 else max(pull_s - lost_s, 0.0)
        # The pull as it would have run untraced: its work and the run delay the puller
        # waited through. From Python 3.12 on, tracing can cost more than a cheap pull's
        # own work: counted, a loop the loader kept up with looked like one waiting on it.
        pull_s = min(pull_s, work_s + lost_s)
        for stage in range(self._stages):
            self._busy[stage] += self._sample_busy[stage] * weight
            self._waiting[stage] += self._sample_waiting[stage] * weight
        self._pull_s += pull_s * weight
        self._work_s += work_s * weight
        self._last = (list(self._sample_busy), list(self._sample_waiting), pull_s, work_s)
        if self.samples:  # the first pull pays the epoch's start (threads, workers): not typical
            sum_busy, sum_waiting, _ = self._sums
            for stage in range(self._stages):
                sum_busy[stage] += self._sample_busy[stage]
                sum_waiting[stage] += self._sample_waiting[stage]
            self._sampled_s += work_s
        self._last_pull = pull_s
        self.covered += weight
        self.samples += 1

    def _schedule(self, now: float, events: int) -> None:
        """Time the next :data:`PROBE_PULLS` pulls (the clock at their start and end) and
        place the next sample after about the larger of :data:`MIN_INTERVAL_S` and what
        this one's tracing cost times :data:`COST_RATIO`, at their pace."""
        cost = TOGGLE_COST_S + EVENT_COST_S * events if events else 0.0
        self._probe = (now, PROBE_PULLS, max(MIN_INTERVAL_S, COST_RATIO * cost))
        self._apart = self.countdown = PROBE_PULLS

    def _stage_frames(self, root: Pass) -> tuple[dict[int, int], dict[int, int]]:
        """``(id(frame) -> stage, id(code) -> stage)``: each pass's own generator frame in
        the tree, and the code it runs its work in outside it (a read by position)."""
        frames: dict[int, int] = {}
        codes: dict[int, int] = {}
        stack = [root]
        stage_of = self._stage_of
        while stack:
            opened = stack.pop()
            stage = stage_of.get(id(opened.pipe))
            if stage is not None:
                frame = getattr(_own_generator(opened), "gi_frame", None)
                if frame is not None:
                    frames[id(frame)] = stage
                for code in opened.work_codes():
                    codes[id(code)] = stage
            stack.extend(opened.inputs())
        return frames, codes

    def _elapsed(self, now: float) -> float:
        """The time since the last event, less the run delay that fell in it and what
        tracing the calls that passed meanwhile cost."""
        spent = now - self._last_event
        if self._passed:
            spent = max(0.0, spent - self._passed * call_cost(_probe_trace))
            self._passed = 0
        if spent > LONG_INTERVAL_S and self._delay_ns is not None:
            delay_ns = run_delay_ns()
            if delay_ns is not None:
                self._events += 1
                lost = min(spent, (delay_ns - self._delay_ns) / 1e9)
                self._delay_ns = delay_ns
                self.lost_s += lost
                spent -= lost
        return spent

    def _charge(self) -> float:
        """Charge the time since the last event to the stage on top of the stack (a wait on
        top charges nothing: it is the stage's waiting)."""
        now = time.perf_counter()
        self._events += 1
        spent = self._elapsed(now)
        stack = self._stack
        if stack:
            if stack[-1][2]:
                self._waited += spent
            else:
                self._sample_busy[stack[-1][1]] += spent
        return now

    def _on_call(self, frame: Any, event: str, arg: Any) -> Any:
        """The global trace function: a Python frame starts or resumes. Most are neither a
        stage nor a wait: they cost a count and two lookups (their time goes, at the next
        event that matters, to the stage running them)."""
        self._events += 1
        stage = self._frames.get(id(frame))
        if stage is None:
            stage = self._codes.get(id(frame.f_code))
        stack = self._stack
        if stage is None and not (stack and id(frame.f_code) in WAIT_CODE_IDS):
            self._passed += 1
            return None  # no further events from this frame
        now = time.perf_counter()
        spent = self._elapsed(now)
        if stack:
            if stack[-1][2]:
                self._waited += spent
            else:
                self._sample_busy[stack[-1][1]] += spent
        if stage is not None:
            stack.append((frame, stage, False, now, self.lost_s))
        else:
            stack.append((frame, stack[-1][1], True, now, self.lost_s))
        frame.f_trace_lines = False
        self._traced.append(frame)
        self._last_event = time.perf_counter()  # the trace function's own time is no stage's
        return self._on_local

    def _on_local(self, frame: Any, event: str, arg: Any) -> Any:
        """A stage's (or a wait's) frame returns or yields."""
        if event == "return":
            now = self._charge()
            stack = self._stack
            if stack and stack[-1][0] is frame:
                _, stage, waiting, since, lost = stack.pop()
                if not waiting:
                    self._inclusive[stage] += now - since - (self.lost_s - lost)
            self._last_event = time.perf_counter()
        return self._on_local


def _own_generator(opened: Pass) -> Any:
    """The generator a pass runs its own code in (under any counting wrapper). Read as an
    attribute: touching a pass's ``__dict__`` would turn its attributes into a plain dict,
    and every attribute the pass sets per item would cost more from then on."""
    return opened._own_items or opened.items


def _probe_trace() -> TraceFunction:
    """A profiler's trace function as inside a pull (the wait check runs too), that
    charges no stage: what :func:`~conveyor.observe.trace_cost.call_cost` times."""
    probe = PullProfiler({}, 0, first_sample=1 << 30)
    probe._stack = [(None, 0, False, 0.0, 0.0)]
    return probe._on_call
