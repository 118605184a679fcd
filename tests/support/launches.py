"""Runs of a whole process tree in a session of their own, for the system tests that start
training jobs (``torchrun``, Lightning's DDP launcher) and kill them: every process of a
run is found (``torchrun`` starts each rank in a session of its own, so the run's process
group alone does not reach the ranks or their loader workers), killed whatever way a test
ends, and none may be left behind."""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

DEADLINE_S = 300  # for one launch to start, reach a moment, or end


def torchrun() -> list[str]:
    """The ``torchrun`` of this interpreter's environment (or its module, where no script is installed)."""
    beside_python = Path(sys.executable).with_name("torchrun")
    found = beside_python if beside_python.exists() else shutil.which("torchrun")
    return [str(found)] if found else [sys.executable, "-m", "torch.distributed.run"]


def process_table() -> dict[int, tuple[int, int, int]]:
    """``pid -> (parent pid, session id, start time)`` of every live (not zombie) process."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if fields[0] != "Z":
            table[int(entry)] = (int(fields[1]), int(fields[3]), int(fields[19]))
    return table


def start_time(pid: int) -> int:
    """When ``pid`` started (clock ticks since boot); a child not yet reaped is in /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[19])


@dataclass
class Launch:
    """A run in a session of its own, and every process it has been seen to have.

    Process ids are reused (``pid_max`` may be 32768): a process counts as the run's only
    by its start time too, and a session only while no other process has its leader's id.
    """

    popen: subprocess.Popen[bytes]
    out: Path
    started: int  # the leader's start time (clock ticks since boot)
    sessions: dict[int, int] = field(default_factory=dict)  # session id -> its leader's start time
    seen: set[tuple[int, int]] = field(default_factory=set)  # (pid, start time)

    def survey(self) -> set[tuple[int, int]]:
        """The run's live processes: its leader's descendants, and every process of a
        session the run has had (where the orphans of a killed process go on)."""
        table = process_table()
        self.sessions.setdefault(self.popen.pid, self.started)
        for sid, start in list(self.sessions.items()):
            if sid in table and table[sid][2] != start:
                del self.sessions[sid]  # its leader's id is another process's now
        family = {pid for pid, (_, sid, start) in table.items() if sid in self.sessions and start >= self.started}
        if self.popen.returncode is None and self.popen.pid in table:  # not reaped: the id is the leader's
            family.add(self.popen.pid)
        while children := {pid for pid, (ppid, _, _) in table.items() if ppid in family} - family:
            family |= children
        family -= {os.getpid(), os.getppid()}
        for pid in family:
            sid = table[pid][1]
            if sid not in self.sessions and sid in table:
                self.sessions[sid] = table[sid][2]
        live = {(pid, table[pid][2]) for pid in family}
        self.seen |= live
        return live

    def alive(self) -> set[tuple[int, int]]:
        table = process_table()
        return {(pid, start) for pid, start in self.seen if pid in table and table[pid][2] == start}

    def kill(self) -> None:
        """Stop (SIGSTOP) the process group, then every other process of the run, until
        none is left running to start another; then SIGKILL the group and all of them."""
        group = self.popen.poll() is None  # until the leader is reaped, its id is the group's
        if group:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGSTOP)
        stopped: set[tuple[int, int]] = set()
        for _ in range(100):
            new = self.survey() - stopped
            if not new:
                break
            for pid, _ in new:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
            stopped |= new
        if group:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
        for pid, _ in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(30)

    def wait_gone(self, seconds: float) -> set[tuple[int, int]]:
        """The run's processes still alive after up to ``seconds``."""
        deadline = time.monotonic() + seconds
        while (left := self.alive()) and time.monotonic() < deadline:
            time.sleep(0.05)
        return left

    def output(self) -> str:
        return (self.out / "output.txt").read_text(errors="replace")[-4000:]

    def wait_until(self, condition: Callable[[], bool], what: str) -> None:
        """Poll ``condition`` every 10 ms (and the run's processes every 100 ms)."""
        start = time.monotonic()
        for polls in itertools.count():
            if condition():
                return
            if self.popen.poll() is not None:
                raise AssertionError(f"the run ended (exit {self.popen.returncode}) before {what}:\n{self.output()}")
            if time.monotonic() - start > DEADLINE_S:
                raise AssertionError(f"no {what} within {DEADLINE_S} s:\n{self.output()}")
            if polls % 10 == 0:
                self.survey()
            time.sleep(0.01)


@contextlib.contextmanager
def launched(command: list[str], out: Path, env: dict[str, str]) -> Iterator[Launch]:
    """Start ``command`` writing into ``out``; whatever way the block ends, every process of
    the run is killed, and none may be left."""
    out.mkdir(parents=True)
    with open(out / "output.txt", "wb") as output:
        popen = subprocess.Popen(
            command, cwd=out.parent, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
        )
    launch = Launch(popen, out, start_time(popen.pid))
    try:
        yield launch
    finally:
        launch.kill()
        left = launch.wait_gone(60)
    assert not left, f"processes left behind by {command}: {sorted(left)}"


def run_to_end(command: list[str], out: Path, env: dict[str, str]) -> None:
    with launched(command, out, env) as launch:
        launch.wait_until(lambda: launch.popen.poll() is not None, "its end")
        assert launch.popen.returncode == 0, launch.output()
        left = launch.wait_gone(60)  # a finished run's ranks and workers end by themselves
        assert not left, f"a finished run left processes running: {sorted(left)}"
