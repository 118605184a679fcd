"""What a run's process needs to account for the worker processes a loader started: their
CPU, and ending the ones a loader left behind.

Standard library only: it runs inside every peer's virtual environment too.
"""

from __future__ import annotations

import multiprocessing
import resource
from typing import Any

#: Seconds each step of ending a stray process (join, terminate, kill) waits for it.
STRAY_JOIN_S = 5.0


def cpu_seconds() -> float:
    """User + system CPU of this process and of its reaped children (the workers) so far."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def end_new_processes(before: set[Any]) -> int:
    """Join (then terminate, then kill) the child processes started since ``before`` that
    are still running; how many there were. ``active_children()`` also reaps the children
    that have exited, so that their CPU time is counted."""
    stray = [p for p in multiprocessing.active_children() if p not in before]
    for process in stray:
        process.join(STRAY_JOIN_S)
        if process.is_alive():
            process.terminate()
            process.join(STRAY_JOIN_S)
        if process.is_alive():
            process.kill()
            process.join(STRAY_JOIN_S)
    return len(stray)
