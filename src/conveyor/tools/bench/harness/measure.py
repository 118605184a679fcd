"""Runs one child (a run: ``child.py``) and measures, from outside, the CPU and
memory of it and of every process it starts (Linux: ``/proc``, ``prctl``, ``pidfd``).

- **CPU**: this process becomes a *child subreaper* (``PR_SET_CHILD_SUBREAPER``), so a
  descendant whose parent exits without reaping it (a loader's resource tracker, a
  daemon worker left behind) is re-parented here instead of to init. The child is reaped
  with ``os.wait4``, whose usage covers it and every descendant it (transitively) reaped;
  then every re-parented descendant is reaped here the same way. Each process's CPU is so
  counted exactly once, whichever start method the loader uses and whoever reaps its
  processes. The child reports its own CPU at its loader's creation (``cpu_before_s``);
  the run's CPU is the total less that (the child leaves with ``os._exit`` right after
  its shutdown, so nothing else follows).
- **memory**: the sum of ``Pss`` (and of ``Rss``) in ``/proc/<pid>/smaps_rollup`` over
  the child and all its descendants (found through ``/proc/<pid>/task/<tid>/children``),
  sampled every 20 ms, and the peak of that sum over the child's life; with it, the most
  processes seen at once. PSS splits each shared page between the processes that map
  it, so pages shared by forked workers count once in the sum (RSS counts them in each).
  Reading it makes the kernel walk each process's page tables, which takes milliseconds
  for a process that imported torch: sampling a torch loader's processes every 20 ms
  would take a large share of a core from the run it measures. The period therefore
  stretches to :data:`SAMPLE_DUTY` times the last sample's CPU, keeping the sampler near
  5% of a core; the number of samples is reported with each run.
- a descendant still running 10 s after the child exited is killed and reported.

Processes this one had before the run (a server the suite started) are neither sampled
nor reaped. Waiting is bounded: the child's exit is awaited on its pidfd with the
sampling period as the timeout, and the whole run has a deadline after which its
processes are killed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: Seconds between two samples of the memory of the run's processes, at least.
SAMPLE_S = 0.02
#: The period is at least this many times the CPU a sample took (the sampler's share of
#: a core stays near 1/SAMPLE_DUTY).
SAMPLE_DUTY = 20
#: Seconds a descendant may outlive the child before it is killed (and the run fails).
ORPHAN_GRACE_S = 10.0
_PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 36, 37
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
    peak_rss_bytes: int
    processes: int  # the most seen at once: the child and its descendants
    samples: int  # of the memory, while the child ran
    stdout: str
    stderr_tail: str
    problems: list[str] = field(default_factory=list)


@dataclass
class Peak:
    """The peaks of the samples of a run's processes."""

    pss: int = 0
    rss: int = 0
    processes: int = 0

    def sample(self, others: set[int]) -> None:
        """Sample the run's processes: every process below this one but ``others``."""
        pids = [pid for pid in children_of(os.getpid()) if pid not in others]
        pids += [below for pid in pids for below in descendants_of(pid)]
        pss = rss = 0
        for pid in pids:
            found = memory_bytes(pid)
            pss, rss = pss + found[0], rss + found[1]
        self.pss, self.rss, self.processes = max(self.pss, pss), max(self.rss, rss), max(self.processes, len(pids))


@contextlib.contextmanager
def subreaper() -> Iterator[None]:
    """This process as a child subreaper for the block, then as it was: a process that runs
    suites among other work (a test session) does not go on adopting orphans it never reaps."""
    libc = ctypes.CDLL(None, use_errno=True)
    was = ctypes.c_int(0)
    if libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(was), 0, 0, 0) != 0 or (
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0
    ):
        errno = ctypes.get_errno()
        raise MeasureError(f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(errno)}; CPU cannot be counted")
    try:
        yield
    finally:
        libc.prctl(_PR_SET_CHILD_SUBREAPER, was.value, 0, 0, 0)


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


def memory_bytes(pid: int) -> tuple[int, int]:
    """``(Pss, Rss)`` of ``pid``; zeros once it is gone (or a zombie)."""
    pss = rss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as rollup:
            for line in rollup:
                if line.startswith(b"Pss:"):
                    pss = int(line.split()[1]) * 1024
                elif line.startswith(b"Rss:"):
                    rss = int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        return 0, 0  # exited between the listing and this read
    return pss, rss  # a zombie's rollup is empty: zeros


def _cpu(rusage: object) -> float:
    return rusage.ru_utime + rusage.ru_stime  # type: ignore[attr-defined]


def _kill(pid: int) -> None:
    """SIGKILL ``pid``; one that ended (and was reaped) meanwhile needs nothing more."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _reap_orphans(peak: Peak, deadline: float, others: set[int]) -> tuple[float, list[str]]:
    """Reap the descendants re-parented here once the child exited (this process's
    children but ``others``, which it had before the run): their CPU, and what still ran
    at ``deadline`` (then killed); their memory goes on being sampled into ``peak``."""
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
        peak.sample(others)
        for pid in orphans:
            reaped, _, rusage = os.wait4(pid, os.WNOHANG)
            if reaped:
                cpu += _cpu(rusage)
    return cpu, problems


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except (FileNotFoundError, ProcessLookupError):
        return f"pid {pid}"  # gone meanwhile: its number is all there is


#: Starts a run as a child of this process, its standard output and error going to the
#: two file descriptors given; returns the child's pid.
Start = Callable[[int, int], int]


def spawned(command: Sequence[str], env: dict[str, str]) -> Start:
    """A run that is ``command`` in a fresh process, with ``env``."""

    def start(out: int, err: int) -> int:
        actions = [(os.POSIX_SPAWN_DUP2, out, 1), (os.POSIX_SPAWN_DUP2, err, 2)]
        return os.posix_spawn(command[0], list(command), env, file_actions=actions)

    return start


def forked(run: Callable[[], int], env: dict[str, str]) -> Start:
    """A run that is ``run()`` in a fork of this process, with ``env`` as its environment
    (read by what the run imports or starts; what this process imported already read its
    own): its return value is the child's exit status. For the tests' zygote
    (``zygote``), where the run's own start-up is not what is measured: the child has
    this process's imports and no thread but the one that forked, and leaves with
    ``os._exit`` (nothing of this process's teardown or ``atexit`` runs in it)."""

    def start(out: int, err: int) -> int:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid:
            return pid
        code = 1
        try:
            os.dup2(out, 1)
            os.dup2(err, 2)
            sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - the child's to its os._exit
            sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
            os.environ.clear()
            os.environ.update(env)
            code = run()
        except BaseException:  # whatever the run raised: its trace is the run's stderr
            traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):  # a stream that cannot be flushed has nothing more to say
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)

    return start


def measure_child(command: Sequence[str], env: dict[str, str], timeout_s: float) -> Measured:
    """Run ``command`` to its end in a fresh process with ``env``; see :func:`measure`."""
    return measure(spawned(command, env), timeout_s)


def measure(start: Start, timeout_s: float) -> Measured:
    """Start a run (``spawned`` or ``forked``) and follow it to its end, sampling its
    process tree's memory; see the module. The processes this one already had are left
    alone, and not sampled."""
    others = set(children_of(os.getpid()))
    with subreaper(), tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = start(out.fileno(), err.fileno())
        pidfd = os.pidfd_open(pid)
        peak, problems, samples, period = Peak(), [], 0, SAMPLE_S
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                ready, _, _ = select.select([pidfd], [], [], period)
                cost = time.thread_time()
                peak.sample(others)
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
        orphan_cpu, orphan_problems = _reap_orphans(peak, time.monotonic() + ORPHAN_GRACE_S, others)
        problems.extend(orphan_problems)
        out.seek(0)
        err.seek(0)
        stderr = err.read().decode(errors="replace")
        return Measured(
            exit_code=os.waitstatus_to_exitcode(status),
            cpu_s=_cpu(rusage) + orphan_cpu,
            peak_pss_bytes=peak.pss,
            peak_rss_bytes=peak.rss,
            processes=peak.processes,
            samples=samples,
            stdout=out.read().decode(errors="replace"),
            stderr_tail=stderr[-STDERR_TAIL:],
            problems=problems,
        )
