"""How long the calling thread has waited to run: its *run delay*, from Linux's
``/proc/thread-self/schedstat``.

A thread that is runnable but not running (preempted by another process, or woken and
waiting for a CPU) loses wall time that is nobody's work. On a loaded machine a sampled
pull that was preempted once can last a thousand times longer than the others, and
without this correction its stage would look like the bottleneck. Reading the counter
costs about a microsecond (one ``pread`` of a descriptor kept per thread), so the
profiler reads it only after intervals long enough to hide a delay.

Where the file does not exist (not Linux, no ``CONFIG_SCHED_INFO``), :func:`run_delay_ns`
returns None and time is taken as it is.
"""

from __future__ import annotations

import os
import threading

_PATH = "/proc/thread-self/schedstat"


class _ThreadCounter:
    """One thread's open ``schedstat`` file; closed when the thread's locals go (its end),
    or when a forked child finds it opened by its parent."""

    __slots__ = ("fd", "pid")

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.fd = os.open(_PATH, os.O_RDONLY | os.O_CLOEXEC)

    def read(self) -> int:
        return int(os.pread(self.fd, 96, 0).split()[1])

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        self.close()


class _PerThread(threading.local):
    counter: _ThreadCounter | None = None
    unavailable = False


_local = _PerThread()


def run_delay_ns() -> int | None:
    """Nanoseconds this thread has spent runnable but not running since it started, or
    None where the system does not say."""
    local = _local
    counter = local.counter
    if counter is None or counter.pid != os.getpid():
        if local.unavailable:
            return None
        if counter is not None:  # the parent's thread's file, inherited through fork
            counter.close()
            local.counter = None
        try:
            counter = local.counter = _ThreadCounter()
        except OSError:
            local.unavailable = True
            return None
    try:
        return counter.read()
    except (OSError, ValueError, IndexError):
        local.unavailable = True
        counter.close()
        local.counter = None
        return None
