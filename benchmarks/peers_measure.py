"""Runs one ``peers_runner.py`` child and measures, from outside, the CPU and memory of it
and of every process it starts (Linux: ``/proc``, ``prctl``, ``pidfd``).

- **CPU**: this process becomes a *child subreaper* (``PR_SET_CHILD_SUBREAPER``), so a
  descendant whose parent exits without reaping it (a loader's resource tracker, a
  daemon worker left behind) is re-parented here instead of to init. The child is reaped
  with ``os.wait4``, whose usage covers it and every descendant it (transitively) reaped;
  then every re-parented descendant is reaped here the same way. Each process's CPU is so
  counted exactly once, whichever start method the loader uses and whoever reaps its
  processes. The child reports its own CPU at its loader's creation (``cpu_before_s``);
  the run's CPU is the total less that (the runner leaves with ``os._exit`` right after
  its shutdown, so nothing else follows).
- **memory**: the sum of ``Pss`` in ``/proc/<pid>/smaps_rollup`` over the child and all
  its descendants (found through ``/proc/<pid>/task/<tid>/children``), sampled every
  20 ms, and the peak of that sum over the child's life. PSS splits each shared page
  between the processes that map it, so pages shared by forked workers count once in
  the sum. Reading it makes the kernel walk each process's page tables: measured here,
  ~5 ms of CPU per process that imported torch (~0.3 ms for conveyor's), so a sample of
  a torch loader's three processes every 20 ms would take ~45% of a core from the run
  it measures on a 2-core machine. The period therefore stretches to
  :data:`SAMPLE_DUTY` times the last sample's CPU (~300 ms for those), keeping the
  sampler near 5% of a core; the number of samples is reported with each run.
- a descendant still running 10 s after the child exited is killed and reported.

Waiting is bounded: the child's exit is awaited on its pidfd with the sampling period as
the timeout, and the whole run has a deadline after which its processes are killed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: Seconds between two samples of the memory of the run's processes, at least.
SAMPLE_S = 0.02
#: The period is at least this many times the CPU a sample took (the sampler's share of
#: a core stays near 1/SAMPLE_DUTY).
SAMPLE_DUTY = 20
#: Seconds a descendant may outlive the child before it is killed (and the run fails).
ORPHAN_GRACE_S = 10.0
_PR_SET_CHILD_SUBREAPER = 36
#: Characters of the child's stderr kept for a failed run's report.
STDERR_TAIL = 2000


class MeasureError(RuntimeError):
    """A run could not be measured (no subreaper, no pidfd): the orchestrator stops."""


@dataclass
class Measured:
    """What the orchestrator saw of one child run."""

    exit_code: int  # the child's exit status, negative for a signal
    cpu_s: float  # user + system CPU of the child and all its descendants, whole life
    peak_pss_bytes: int
    samples: int  # of the memory, while the child ran
    stdout: str
    stderr_tail: str
    problems: list[str] = field(default_factory=list)


def become_subreaper() -> None:
    """Make orphaned descendants of this process its children (idempotent)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise MeasureError(f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(errno)}; CPU cannot be counted")


def children_of(pid: int) -> list[int]:
    """The live children of ``pid`` (of all its threads); none once it is gone."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except (FileNotFoundError, ProcessLookupError):
        return found  # it exited meanwhile: it has no children to list
    for tid in tasks:
        try:
            found.extend(int(p) for p in Path(f"/proc/{pid}/task/{tid}/children").read_text().split())
        except (FileNotFoundError, ProcessLookupError):
            continue  # that thread ended meanwhile
    return found


def descendants_of(pid: int) -> list[int]:
    """Every live process below ``pid``."""
    found, frontier = [], [pid]
    while frontier:
        below = [c for p in frontier for c in children_of(p)]
        found.extend(below)
        frontier = below
    return found


def pss_bytes(pid: int) -> int:
    """The proportional set size of ``pid``; 0 once it is gone (or a zombie)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as rollup:
            for line in rollup:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        return 0  # exited between the listing and this read
    return 0  # a zombie's rollup is empty


def _cpu(rusage: object) -> float:
    return rusage.ru_utime + rusage.ru_stime  # type: ignore[attr-defined]


def _kill(pid: int) -> None:
    """SIGKILL ``pid``; one that ended (and was reaped) meanwhile needs nothing more."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def tree_pss_bytes() -> int:
    """The summed PSS of every process below this one: the run's child, its
    descendants, and those re-parented here."""
    return sum(pss_bytes(pid) for pid in descendants_of(os.getpid()))


def _reap_orphans(peak: int, deadline: float, others: set[int]) -> tuple[float, int, list[str]]:
    """Reap the descendants re-parented here once the child exited (this process's
    children but ``others``, which it had before the run): their CPU, the memory peak
    while they ran, and what still ran at ``deadline`` (then killed)."""
    cpu, problems = 0.0, []
    me = os.getpid()
    while orphans := [pid for pid in children_of(me) if pid not in others]:
        if time.monotonic() >= deadline:
            names = sorted({_name(pid) for pid in orphans})
            problems.append(
                f"{len(orphans)} process(es) ({', '.join(names)}) outlived the run by {ORPHAN_GRACE_S:.0f} s; killed"
            )
            for pid in orphans:
                _kill(pid)
        fds = [os.pidfd_open(pid) for pid in orphans]  # children stay until reaped here: they exist
        try:
            select.select(fds, [], [], max(0.0, min(SAMPLE_S, deadline - time.monotonic())))
        finally:
            for fd in fds:
                os.close(fd)
        peak = max(peak, tree_pss_bytes())
        for pid in orphans:
            reaped, _, rusage = os.wait4(pid, os.WNOHANG)
            if reaped:
                cpu += _cpu(rusage)
    return cpu, peak, problems


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except (FileNotFoundError, ProcessLookupError):
        return f"pid {pid}"  # gone meanwhile: its number is all there is


def measure_child(command: Sequence[str], env: dict[str, str], timeout_s: float) -> Measured:
    """Run ``command`` to its end, sampling its process tree's memory; see the module.
    The processes this one already had are left alone, but their memory counts in the
    samples: call it from a process with no other children (the orchestrator)."""
    become_subreaper()
    others = set(children_of(os.getpid()))
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        actions = [(os.POSIX_SPAWN_DUP2, out.fileno(), 1), (os.POSIX_SPAWN_DUP2, err.fileno(), 2)]
        pid = os.posix_spawn(command[0], list(command), env, file_actions=actions)
        pidfd = os.pidfd_open(pid)
        peak, problems, samples, period = 0, [], 0, SAMPLE_S
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                ready, _, _ = select.select([pidfd], [], [], period)
                cost = time.thread_time()
                peak = max(peak, tree_pss_bytes())
                samples += 1
                period = max(SAMPLE_S, (time.thread_time() - cost) * SAMPLE_DUTY)
                if ready:
                    break
                if time.monotonic() > deadline:
                    problems.append(f"no result within {timeout_s:.0f} s; its processes were killed")
                    for victim in [pid, *descendants_of(pid)]:
                        _kill(victim)
                    deadline = float("inf")
        finally:
            os.close(pidfd)
        _, status, rusage = os.wait4(pid, 0)  # its pidfd said it exited: this returns at once
        orphan_cpu, peak, orphan_problems = _reap_orphans(peak, time.monotonic() + ORPHAN_GRACE_S, others)
        problems.extend(orphan_problems)
        out.seek(0)
        err.seek(0)
        stderr = err.read().decode(errors="replace")
        return Measured(
            exit_code=os.waitstatus_to_exitcode(status),
            cpu_s=_cpu(rusage) + orphan_cpu,
            peak_pss_bytes=peak,
            samples=samples,
            stdout=out.read().decode(errors="replace"),
            stderr_tail=stderr[-STDERR_TAIL:],
            problems=problems,
        )
