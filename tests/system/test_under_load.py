"""The ``--cpu-hogs`` option (tests/conftest.py) really loads the machine when asked, and the
README's test command runs the ``timing`` tests under it."""

from __future__ import annotations

import pathlib
import time

import pytest

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


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


def test_the_readme_runs_the_timing_tests_again_under_two_hogs() -> None:
    command = README.read_text().split("<!-- test-command -->", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    assert "pytest -q -m timing --cpu-hogs 2" in command


def test_the_readme_runs_the_fork_safety_tests_under_newer_pythons() -> None:
    """The full command's first pytest run takes tests/system (no path narrows it, and
    ``timing`` is the only mark it leaves out), and the system test that runs
    ``.ci/other-pythons`` is not marked ``timing``."""
    command = README.read_text().split("<!-- test-command -->", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    first_run = command.split("pytest", 1)[1].split("&&", 1)[0]
    assert '-m "not timing"' in first_run and "tests/" not in first_run
    runner = README.parent / "tests" / "system" / "install" / "test_other_pythons.py"
    assert 'SCRIPT = ROOT / ".ci" / "other-pythons"' in runner.read_text()
    assert "mark.timing" not in runner.read_text()
    script = README.parent / ".ci" / "other-pythons"
    assert script.stat().st_mode & 0o111, "the script must be executable"
    assert "error:This process:DeprecationWarning" in script.read_text()
