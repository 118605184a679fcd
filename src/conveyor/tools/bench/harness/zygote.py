"""For tests: a clean process that imports the heavy libraries once and forks each run
from there, so that a suite's quick run does not pay a fresh interpreter's imports
(torch's take seconds) for every run.

A :class:`Zygote` is this module run as a script in a fresh interpreter. It imports the
modules it is given and nothing runs in it after that: no thread of its own, no torch
operation (whose OpenMP pool would hang a forked child), no test. For each request (one
JSON line on its stdin: the run's ``child.py`` arguments, environment, folder and
deadline) it forks a child that runs :func:`child.run <conveyor.tools.bench.harness.child.run>`
and measures it from outside (``measure.measure``, with this process as the subreaper),
then answers with the :class:`~conveyor.tools.bench.harness.measure.Measured` as one JSON
line. The figures leave out the run's own start-up, which is what a fresh process per
run is for outside the tests.

The zygote ends when its stdin closes (:meth:`Zygote.close`, or the orchestrator's death).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import json
import os
import select
import subprocess
import sys
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from conveyor.tools.bench.harness.child import run
from conveyor.tools.bench.harness.measure import Measured, forked, measure

#: Seconds a zygote has to import what it preloads and say it is ready.
READY_S = 120.0
#: Seconds beyond a run's own deadline its answer may take (the orphans' grace, the reaping).
ANSWER_GRACE_S = 60.0
#: Seconds a zygote has to exit once its stdin is closed, before it is killed.
EXIT_S = 10.0


class ZygoteError(RuntimeError):
    """The zygote did not answer as it should (it died, or said something else)."""


class Zygote:
    """A zygote process importing ``preload`` (the ones this interpreter finds), owned by
    this object: :meth:`close` (or leaving the ``with`` block) ends it."""

    def __init__(self, preload: Sequence[str] = ("numpy", "torch", "conveyor")) -> None:
        found = [name for name in preload if importlib.util.find_spec(name) is not None]
        self._process = subprocess.Popen(
            [sys.executable, "-m", "conveyor.tools.bench.harness.zygote", *found],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._answer(READY_S)  # {"ready": true} once the imports are done

    def measure(self, argv: list[str], env: dict[str, str], timeout_s: float) -> Measured:
        """One run of ``child.py`` with ``argv``, forked from the zygote with ``env`` in
        this process's folder, measured as ``measure.measure`` does."""
        assert self._process.stdin is not None
        request = {"argv": argv, "env": env, "cwd": os.getcwd(), "timeout_s": timeout_s}
        self._process.stdin.write(json.dumps(request) + "\n")
        self._process.stdin.flush()
        return Measured(**self._answer(timeout_s + ANSWER_GRACE_S))

    def _answer(self, timeout_s: float) -> dict[str, Any]:
        assert self._process.stdout is not None
        ready, _, _ = select.select([self._process.stdout], [], [], timeout_s)
        line = self._process.stdout.readline() if ready else ""
        if not line:
            code = self._process.poll()
            self.close()
            raise ZygoteError(f"the benchmark zygote (pid {self._process.pid}) gave no answer (exit code {code})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        """End the zygote: its stdin closed, it exits; killed if it does not in time."""
        if self._process.stdin is not None and not self._process.stdin.closed:
            self._process.stdin.close()
        try:
            self._process.wait(EXIT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        if self._process.stdout is not None:
            self._process.stdout.close()

    def __enter__(self) -> Zygote:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()


def serve(preload: Sequence[str]) -> None:
    """The zygote's side: import ``preload``, then answer requests until stdin closes."""
    for name in preload:
        importlib.import_module(name)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        start = forked(functools.partial(_run_in, request["cwd"], request["argv"]), request["env"])
        measured = measure(start, request["timeout_s"])
        print(json.dumps(dataclasses.asdict(measured)), flush=True)


def _run_in(cwd: str, argv: list[str]) -> int:
    """A forked run: ``child.run`` in the orchestrator's folder."""
    os.chdir(cwd)
    return run(argv)


if __name__ == "__main__":
    serve(sys.argv[1:])
