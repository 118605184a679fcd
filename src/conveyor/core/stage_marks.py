"""Marks that statistics read: functions in which a stage waits for its upstream, and
threads that never run a stage.

Statistics (:mod:`conveyor.observe.pull_profiler`, :mod:`conveyor.observe.stack_sampler`) see a thread's
Python frames, not whether the thread is blocked in a system call: a frame of a function
marked :func:`waits_for_upstream` means the stage around it is waiting, not working.
Kept free of imports so that any module can use the marks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

#: Code objects of the marked functions ...
WAIT_CODES: set[Any] = set()
#: ... and their ids, which the sampler looks up: hashing a code object hashes its
#: contents, a cost on every frame of every sample (the set above keeps them alive).
WAIT_CODE_IDS: set[int] = set()


#: Threads that never run pipeline work (a worker's watchdog): the sampler skips them.
IDLE_THREAD_IDS: set[int] = set()


def waits_for_upstream(function: F) -> F:
    """Decorator: time spent in ``function`` counts as its stage waiting on upstream."""
    WAIT_CODES.add(function.__code__)
    WAIT_CODE_IDS.add(id(function.__code__))
    return function
