"""What tracing costs a call that is neither a stage nor a wait, measured once per process.

A sampled pull charges that cost to no stage: a stage that calls many small functions
would otherwise look busier than it is (see :mod:`conveyor.observe.pull_profiler`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

#: Calls of a function traced to measure what tracing one call costs, and rounds of them.
CALIBRATION_CALLS, CALIBRATION_ROUNDS = 200, 3

TraceFunction = Callable[[Any, str, Any], Any]

_call_cost_s: float | None = None


def call_cost(probe: Callable[[], TraceFunction]) -> float:
    """Seconds that tracing adds to a call of a plain function, under the trace function
    ``probe()`` makes, measured at the first call in the process: the least over
    :data:`CALIBRATION_ROUNDS` of timing :data:`CALIBRATION_CALLS` calls traced and not.
    Zero while another tracer or profiler is set (it is not displaced to measure)."""
    global _call_cost_s
    if _call_cost_s is None:
        _call_cost_s = _measure(probe()) if sys.gettrace() is None and sys.getprofile() is None else 0.0
    return _call_cost_s


def _nothing() -> None:
    return None


def _measure(trace: TraceFunction) -> float:
    clock, calls, best = time.perf_counter, range(CALIBRATION_CALLS), float("inf")
    for _ in range(CALIBRATION_ROUNDS):
        started = clock()
        for _ in calls:
            _nothing()
        plain = clock() - started
        sys.settrace(trace)
        try:
            _nothing()  # from Python 3.12 on, the first traced call instruments the function
            started = clock()
            for _ in calls:
                _nothing()
            traced = clock() - started
        finally:
            sys.settrace(None)
        best = min(best, (traced - plain) / CALIBRATION_CALLS)
    return max(0.0, best)
