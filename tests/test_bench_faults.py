"""``benchmarks/bench_faults.py``, run tiny: every row runs, every conveyor run delivers
what it should, and torch's loader loses the epochs the faults end. The shutdown row runs
under ``fork`` alone here (the other start methods are the same code with another name,
and each costs four fresh processes, torch's importing torch in every worker); conveyor's
shutdown under each start method is tested in ``test_hardening.py``. Timings are never
asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_faults.py"


@pytest.mark.timeout(240)
def test_the_script_runs_every_row_and_checks_what_came() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--repeats", "1", "--scale", "0.05", "--start-methods", "fork"],
        capture_output=True,
        text=True,
        timeout=220,
    )
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and not line.startswith("| row")]
    cells = {tuple(c.strip() for c in row.strip("|").split("|")[:2]): row for row in rows}
    assert set(cells) == {
        ("budget", "small-raise"),
        ("budget", "small-skip"),
        ("budget", "trivial-raise"),
        ("budget", "trivial-skip"),
        ("corrupt", "conveyor"),
        ("corrupt", "torch"),
        ("restart", "conveyor"),
        ("restart", "conveyor-killed"),
        ("restart", "torch-killed"),
        *(
            ("shutdown", f"{loader}-{context}-{how}")
            for how in ("normal", "stuck")
            for context in ("fork",)
            for loader in ("conveyor", "torch")
        ),
    }
    assert all(row.rstrip().endswith("| 1/1 |") for row in rows), done.stdout
    assert "2 skipped" in cells[("corrupt", "conveyor")]
    assert "failed: " in cells[("corrupt", "torch")]
    assert "1 restart(s)" in cells[("restart", "conveyor-killed")]
    assert "failed: RuntimeError" in cells[("restart", "torch-killed")]
    assert "the wall time of 'raise'" in done.stdout and "without the kill" in done.stdout
    assert "conveyor's shutdown(), stuck" in done.stdout


@pytest.mark.parametrize("methods", ["", ",", "fork,thread"])
def test_start_methods_are_validated(methods: str) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--rows", "shutdown", "--start-methods", methods],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stdout
    assert f"--start-methods takes some of fork,spawn,forkserver, got {methods!r}" in done.stderr
