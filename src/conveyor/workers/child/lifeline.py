"""How a worker process ends with the main process, whatever it is running.

Each worker holds the read end of a *lifeline*: a pipe whose only writer is the main
process, which never writes to it. The kernel closes the write end when the main process
ends, however it ends (``SIGKILL`` included), and the worker learns it three ways:

1. **The kernel kills the worker** (Linux): :func:`watch_lifeline` arms the read end for
   signal-driven I/O (``O_ASYNC``), owned by the worker, with ``SIGKILL`` as the signal
   (``F_SETSIG``). When the last write end closes, the kernel sends it in the same call
   that closes the pipe. Nothing of the worker's runs for this: no thread, no GIL, no
   signal handler. It ends a worker stuck in a long C call that holds the GIL (a loop
   inside the interpreter, a native library), whichever start method made it and
   whichever thread of the main process started it. The owner is a process, not a pid
   number: a pid reused after the worker's end is never signalled.
2. **A watchdog thread** waits on the lifeline and exits the worker
   (:data:`ORPHANED_EXIT`) when it reads EOF: started only on systems without
   ``F_SETSIG``, or where arming was refused. It needs the GIL, so a stage that holds it
   delays it.
3. **A parent-death signal** (Linux ``PR_SET_PDEATHSIG``, :func:`die_with_parent`), when
   the main thread started the worker (Linux sends it when the *thread* that made the
   process ends). It does not cover ``forkserver``: the worker's parent is the fork
   server, which lives on, since every worker it makes holds its liveness pipe.

A worker looks at the lifeline once after arming it (:func:`lifeline_cut`), so a main
process that died while the worker started is not missed either.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import threading
from typing import Any

from conveyor.core.stage_marks import IDLE_THREAD_IDS
from conveyor.workers.transport.libc import LIBC

#: Exit status of a worker whose watchdog thread saw the main process die (a worker the
#: kernel ended shows ``-SIGKILL``).
ORPHANED_EXIT = 70


class LifelineHandle:
    """The worker's end of its lifeline, on its way to the worker: inherited under ``fork``,
    passed as a duplicated descriptor under ``spawn`` and ``forkserver``."""

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, ...]:
        from multiprocessing import reduction

        return _rebuild_lifeline, (reduction.DupFd(self.fd),)


def _rebuild_lifeline(duplicate: Any) -> LifelineHandle:
    return LifelineHandle(duplicate.detach())


def watch_lifeline(fd: int) -> bool:
    """End this process when the lifeline's writer, the main process, is gone: arm the
    kernel's ``SIGKILL`` (:func:`arm_kernel_kill`), or, where it cannot be armed, start
    the watchdog thread; whether the kernel was armed. Then look once
    (:func:`lifeline_cut`, after closing any write end this process inherited): a main
    process that ended before arming is seen there.

    Armed, the kernel ends the worker in every case the thread would, and in more (a C
    call that holds the GIL): the thread would only cost the worker's start-up (starting
    it took ~0.5 ms of a forked worker's, before its first item) and a thread's memory."""
    if arm_kernel_kill(fd):
        return True
    _start_watchdog(fd)
    return False


def arm_kernel_kill(fd: int) -> bool:
    """Ask the kernel to ``SIGKILL`` this process when read end ``fd``'s last writer
    closes; whether it was armed (Linux only: elsewhere the watchdog thread acts)."""
    set_signal = getattr(fcntl, "F_SETSIG", None)
    if set_signal is None or not hasattr(os, "O_ASYNC"):
        return False
    try:
        fcntl.fcntl(fd, fcntl.F_SETOWN, os.getpid())
        fcntl.fcntl(fd, set_signal, signal.SIGKILL)
        # Last: the kernel signals only once the owner and the signal are in place.
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_ASYNC)
    except OSError:
        return False  # refused (a sandbox's filter): the watchdog thread still acts
    return True


def lifeline_cut(fd: int) -> bool:
    """Whether every write end of lifeline ``fd`` is closed: the main process is gone
    (looks, does not wait)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP)
    return any(event & (select.POLLHUP | select.POLLERR | select.POLLIN) for _, event in poller.poll(0))


def _start_watchdog(fd: int) -> None:
    """A thread that blocks until the lifeline's writer is gone, then ends this process at
    once (there is nobody to deliver to)."""

    def watch() -> None:
        IDLE_THREAD_IDS.add(threading.get_ident())
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLHUP)
        while True:
            with contextlib.suppress(InterruptedError):
                for _, event in poller.poll():
                    if event & (select.POLLHUP | select.POLLERR | select.POLLIN):
                        os._exit(ORPHANED_EXIT)

    threading.Thread(target=watch, name="conveyor-watchdog", daemon=True).start()


def die_with_parent() -> None:
    """Ask Linux to kill this worker when the thread that started it ends (call only when
    that thread is the main process's main thread)."""
    prctl = getattr(LIBC, "prctl", None)  # resolved in the main process, before the fork
    if prctl is None:
        return  # not Linux, or no prctl: the lifeline still ends the worker
    pr_set_pdeathsig = 1
    prctl(pr_set_pdeathsig, signal.SIGKILL)


def process_exists(pid: int) -> bool:
    """Whether process ``pid`` exists (for a worker started without a lifeline)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, owned by someone else
    return True
