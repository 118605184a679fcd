"""The ``--cpu-hogs`` option (tests/conftest.py) really loads the machine when asked, and the
README's test command runs the ``timing`` tests under load: beside the rest of the suite
(``.ci/full-tests``)."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
FULL_TESTS = README.parent / ".ci" / "full-tests"


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, in clock ticks (USER_HZ = 100)


@pytest.mark.timing
def test_the_hogs_asked_for_spin_while_the_tests_run(cpu_hogs: list[int], request: pytest.FixtureRequest) -> None:
    assert len(cpu_hogs) == request.config.getoption("--cpu-hogs")
    if not cpu_hogs:
        return
    before = [cpu_seconds(pid) for pid in cpu_hogs]
    time.sleep(1.0)
    assert all(cpu_seconds(pid) > start for pid, start in zip(cpu_hogs, before, strict=True))


def full_run() -> tuple[str, str]:
    """The README's test command, and the script it runs the tests with."""
    command = README.read_text().split("<!-- test-command -->", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    assert command.strip().endswith("&& .ci/full-tests"), command
    return command, FULL_TESTS.read_text()


def sessions(script: str) -> tuple[str, str]:
    """The script's two pytest sessions: the timing tests', then the rest's."""
    runs = [line for line in script.splitlines() if line.startswith(".venv/bin/python -m pytest")]
    assert len(runs) == 2, runs
    return runs[0], runs[1]


def test_the_full_run_starts_the_timing_tests_beside_the_rest_and_fails_when_either_fails() -> None:
    _, script = full_run()
    assert FULL_TESTS.stat().st_mode & 0o111, "the script must be executable"
    timing, rest = sessions(script)
    assert " -m timing " in timing and timing.rstrip().endswith("&"), timing  # in the background ...
    assert '-m "not timing"' in rest and "-n 3" in rest and not rest.rstrip().endswith("&"), rest
    assert script.index(timing) < script.index(rest)  # ... started first, so the rest loads the machine
    assert 'wait "$timing"' in script and '[ "$rest" -eq 0 ] && [ "$timed" -eq 0 ]' in script


def test_a_failing_timing_session_fails_the_full_run(tmp_path: Path) -> None:
    """The script, run over a copy of the repository whose ``.venv/bin/python`` fails only
    the timing session: the run's status is a failure, and the timing session's output
    is printed."""
    (tmp_path / ".ci").mkdir()
    shutil.copy(FULL_TESTS, tmp_path / ".ci" / "full-tests")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text('#!/bin/sh\ncase "$*" in *"-m timing"*) echo timing-session-output; exit 1;; esac\nexit 0\n')
    python.chmod(0o755)
    done = subprocess.run([str(tmp_path / ".ci" / "full-tests")], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "timing-session-output" in done.stdout


def test_the_readme_runs_the_fork_safety_tests_under_newer_pythons() -> None:
    """The full run's session of the rest takes tests/system (no path narrows it, and
    ``timing`` is the only mark it leaves out), and the system test that runs
    ``.ci/other-pythons`` is not marked ``timing``."""
    _, rest = sessions(full_run()[1])
    assert '-m "not timing"' in rest and "tests/" not in rest
    runner = README.parent / "tests" / "system" / "install" / "test_other_pythons.py"
    assert 'SCRIPT = ROOT / ".ci" / "other-pythons"' in runner.read_text()
    assert "mark.timing" not in runner.read_text()
    script = README.parent / ".ci" / "other-pythons"
    assert script.stat().st_mode & 0o111, "the script must be executable"
    assert "error:This process:DeprecationWarning" in script.read_text()
