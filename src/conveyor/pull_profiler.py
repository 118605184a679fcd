"""Where an item's time goes, stage by stage, measured on a sample of items.

Default statistics install no signal handler, no timer and no thread. The thread that
pulls items from a pass tree (the consumer's, or a worker's loop) times a sample of its
own pulls: for one pull now and then it sets a trace function (``sys.settrace``, for that
one pull, on that thread only, and never while a tracer or profiler is set, so a user's
debugger, coverage or profiler is never displaced), which sees every stage's generator
resume and yield (calls of C functions and lines are not traced: a sampled pull costs
about a microsecond per Python call in it). The time between two events is charged to the innermost stage running: to its
*busy* time (its own code and the functions it calls), or, inside a function marked
:func:`~conveyor.waiting.waits_for_upstream` (a buffer, the pipes from the workers), to
its time *waiting on upstream*. A sampled pull stands for the pulls since the sample
before it (the first, which pays the epoch's start, for itself alone), and the last one
for the pulls after it too, up to the pulls made (which the passes count exactly).

Samples are spaced so that they cost little: :data:`MIN_INTERVAL_S` apart on average, or
more, :data:`COST_RATIO` times what tracing added to them (about :data:`EVENT_COST_S` per
trace event, counted as they go). The gaps are random (geometric, with a generator of the
profiler's own): pulls that cost more every n-th time (a batch, a file opened every
thousand lines) are neither always sampled nor never. Deciding costs the puller one
decrement per item.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Iterator
from typing import Any

from conveyor.pipes.passes import Pass
from conveyor.waiting import WAIT_CODE_IDS

#: Seconds between two sampled pulls, on average, at least: 200 a second at most, each a
#: few microseconds for a short pipeline.
MIN_INTERVAL_S = 0.005
#: What tracing adds to a sampled pull, per trace event (a Python call of the trace
#: function; measured ~0.5-1 us here, taken high).
EVENT_COST_S = 2e-6
#: What profiling added to a sample, times this, is the least time to the next: ~1%.
COST_RATIO = 100
#: Pulls between two samples, at most (a sample every few seconds even for tiny items).
MOST_PULLS_APART = 1 << 20


class PullProfiler:
    """Per-stage busy and waiting seconds of a pass tree, estimated from sampled pulls.

    ``stage_of`` maps ``id(pipe)`` to a stage index (``stages`` of them). The puller
    decrements :attr:`countdown` per pull and calls :meth:`pull` instead of
    ``next(items)`` when it reaches zero.
    """

    def __init__(self, stage_of: dict[int, int], stages: int) -> None:
        self._stage_of = stage_of
        self._stages = stages
        self._busy = [0.0] * stages  # estimates for the pulls the samples stand for ...
        self._waiting = [0.0] * stages
        self._pull_s = 0.0
        self.covered = 0  # ... which are this many
        self._last = ([0.0] * stages, [0.0] * stages, 0.0)  # the last sample's
        self.samples = 0
        self.countdown = 1  # pulls until the next sample (the puller decrements it)
        self._apart = 1  # pulls the next sample stands for
        self._random = random.Random(0x5EED)  # its own: the user's global RNG is left alone
        self._last_sample = time.perf_counter()
        # During one sampled pull:
        self._frames: dict[int, int] = {}
        self._stack: list[tuple[Any, int, bool]] = []
        self._traced: list[Any] = []
        self._sample_busy = [0.0] * stages
        self._sample_waiting = [0.0] * stages
        self._events = 0
        self._last_event = 0.0

    def estimates(self, pulls: int, pull_s: float | None = None) -> tuple[list[float], list[float], float]:
        """``(busy per stage, waiting per stage, seconds in pulls)`` for the first ``pulls``
        pulls of the epoch. With ``pull_s``, the puller's own measure of its time in
        pulls, the samples only split that time between the stages."""
        rest = max(0, pulls - self.covered)
        last_busy, last_waiting, last_pull = self._last
        busy = [b + x * rest for b, x in zip(self._busy, last_busy, strict=True)]
        waiting = [w + x * rest for w, x in zip(self._waiting, last_waiting, strict=True)]
        estimated = self._pull_s + last_pull * rest
        if pull_s is None or estimated <= 0:
            return busy, waiting, estimated
        scale = pull_s / estimated
        return [b * scale for b in busy], [w * scale for w in waiting], pull_s

    def pull(self, items: Iterator[Any], root: Pass | None) -> Any:
        """``next(items)``, timed stage by stage when no other profiler is set (``root``:
        the pass tree whose stages to charge). Raises what ``next`` raises."""
        if sys.gettrace() is not None or sys.getprofile() is not None or root is None:
            self._schedule(time.perf_counter(), 0)
            return next(items)
        self._frames = self._stage_frames(root)
        self._events = 0
        sample_busy, sample_waiting = self._sample_busy, self._sample_waiting
        for stage in range(self._stages):
            sample_busy[stage] = sample_waiting[stage] = 0.0
        start = self._last_event = time.perf_counter()
        sys.settrace(self._on_call)
        try:
            return next(items)
        finally:
            sys.settrace(None)
            end = time.perf_counter()
            for frame in self._traced:
                frame.f_trace = None  # no reference to this profiler stays on a live frame
            self._traced.clear()
            self._stack.clear()
            self._frames = {}
            self._record(end - start)
            self._schedule(end, self._events)

    def _record(self, pull_s: float) -> None:
        """Add the sample, standing for the pulls since the last one."""
        weight = self._apart
        for stage in range(self._stages):
            self._busy[stage] += self._sample_busy[stage] * weight
            self._waiting[stage] += self._sample_waiting[stage] * weight
        self._pull_s += pull_s * weight
        self._last = (list(self._sample_busy), list(self._sample_waiting), pull_s)
        self.covered += weight
        self.samples += 1

    def _schedule(self, now: float, events: int) -> None:
        """The pulls until the next sample: about the larger of the interval and what this
        one's profiling cost times :data:`COST_RATIO`, at the pace of the pulls since the
        last."""
        per_pull = max((now - self._last_sample) / self._apart, 1e-9)
        mean = max(MIN_INTERVAL_S, COST_RATIO * EVENT_COST_S * events) / per_pull
        gap = 1 + int(self._random.expovariate(1.0 / mean)) if mean > 1 else 1
        self._apart = self.countdown = min(MOST_PULLS_APART, gap)
        self._last_sample = now

    def _stage_frames(self, root: Pass) -> dict[int, int]:
        """``id(frame) -> stage`` for each pass's own generator frame in the tree."""
        frames: dict[int, int] = {}
        stack = [root]
        stage_of = self._stage_of
        while stack:
            opened = stack.pop()
            stage = stage_of.get(id(opened.pipe))
            frame = getattr(_own_generator(opened), "gi_frame", None)
            if stage is not None and frame is not None:
                frames[id(frame)] = stage
            stack.extend(opened.inputs())
        return frames

    def _charge(self) -> float:
        """Charge the time since the last event to the stage on top of the stack."""
        now = time.perf_counter()
        self._events += 1
        stack = self._stack
        if stack:
            _, stage, waiting = stack[-1]
            (self._sample_waiting if waiting else self._sample_busy)[stage] += now - self._last_event
        return now

    def _on_call(self, frame: Any, event: str, arg: Any) -> Any:
        """The global trace function: a Python frame starts or resumes."""
        self._charge()
        stage = self._frames.get(id(frame))
        stack = self._stack
        if stage is not None:
            stack.append((frame, stage, False))
        elif stack and id(frame.f_code) in WAIT_CODE_IDS:
            stack.append((frame, stack[-1][1], True))
        else:
            self._last_event = time.perf_counter()
            return None  # no further events from this frame
        frame.f_trace_lines = False
        self._traced.append(frame)
        self._last_event = time.perf_counter()  # the trace function's own time is no stage's
        return self._on_local

    def _on_local(self, frame: Any, event: str, arg: Any) -> Any:
        """A stage's (or a wait's) frame returns or yields."""
        if event == "return":
            self._charge()
            stack = self._stack
            if stack and stack[-1][0] is frame:
                stack.pop()
            self._last_event = time.perf_counter()
        return self._on_local


def _own_generator(opened: Pass) -> Any:
    """The generator a pass runs its own code in (under any counting wrapper)."""
    return opened.__dict__.get("_own_items", opened.items)
