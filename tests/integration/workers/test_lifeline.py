"""The lifeline ends a worker process when its main process is gone: the kernel's
``SIGKILL`` (Linux) in the middle of a C call that holds the GIL, and the watchdog
thread where the kernel cannot be asked. Each test plays the main process: it holds
the write end of a pipe and closes it, as the kernel does when the main process dies.

Bounds are liveness bounds (a generous wait for the child to end), never timings.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from conveyor.workers.child.lifeline import ORPHANED_EXIT, lifeline_cut

pytestmark = [pytest.mark.timeout(120), pytest.mark.timing]

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="F_SETSIG is Linux's")

CHILD = """
import fcntl, os, sys, threading, time
from conveyor.workers.child.lifeline import arm_kernel_kill, watch_lifeline

fd, how = int(sys.argv[1]), sys.argv[2]
if how == "kernel only":
    assert arm_kernel_kill(fd)  # no watchdog: nothing of ours could end this process
elif how == "as a worker does":
    assert watch_lifeline(fd)  # armed: so no thread was started
    assert threading.active_count() == 1, threading.enumerate()
else:
    del fcntl.F_SETSIG  # as on a system without it
    assert not watch_lifeline(fd)
print("watching", flush=True)
if how != "watchdog only":
    sum(range(10**12))  # one C call that never lets the GIL go (hours)
time.sleep(300)
"""


def run_child(how: str) -> int:
    """Start a child watching a lifeline, cut the lifeline once it watches; its exit status."""
    reader, writer = os.pipe()
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(reader), how], pass_fds=[reader], stdout=subprocess.PIPE, text=True
    )
    os.close(reader)
    try:
        assert child.stdout.readline() == "watching\n"  # type: ignore[union-attr]
        assert child.poll() is None
        os.close(writer)  # what the main process's death does
        writer = -1
        return child.wait(30)
    finally:
        if writer >= 0:
            os.close(writer)
        if child.poll() is None:
            child.kill()
            child.wait(30)


@linux_only
def test_the_kernel_kills_a_worker_inside_a_call_that_holds_the_gil() -> None:
    """The child has no watchdog and runs one C call that never lets the GIL go (no
    signal handler of Python's could run either): only the kernel can end it."""
    assert run_child("kernel only") == -signal.SIGKILL


@linux_only
def test_a_worker_starts_no_watchdog_thread_where_the_kernel_is_armed() -> None:
    """What a worker calls: armed, the kernel ends it (inside a call that holds the GIL
    too), and no thread of ours runs in it."""
    assert run_child("as a worker does") == -signal.SIGKILL


def test_the_watchdog_ends_the_worker_where_the_kernel_cannot_be_asked() -> None:
    assert run_child("watchdog only") == ORPHANED_EXIT


def test_a_lifeline_is_cut_once_its_last_writer_is_closed() -> None:
    reader, writer = os.pipe()
    spare = os.dup(writer)  # a second writer, as a forked worker holds one until it closes it
    try:
        assert not lifeline_cut(reader)
        os.close(writer)
        assert not lifeline_cut(reader)
        os.close(spare)
        assert lifeline_cut(reader)
    finally:
        os.close(reader)


@linux_only
def test_the_c_functions_a_worker_calls_are_resolved_before_it_forks() -> None:
    """Resolved on import, in the main process: a forked worker finds them resolved."""
    from conveyor.workers.transport.libc import LIBC

    assert LIBC is not None
    for name in ("prctl", "mallopt", "mmap", "munmap", "madvise"):
        assert name in vars(LIBC) and vars(LIBC)[name] is not None, name
