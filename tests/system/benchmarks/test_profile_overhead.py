"""``benchmarks/profile_overhead.py``, run tiny: every run completes, conveyor's runs deliver
every item once, and the breakdown adds up. Timings are never asserted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "profile_overhead.py"
NUMBER = r"[+-]?[\d,]+(\.\d+)?"


@pytest.mark.timeout(120)
def test_the_profile_prints_every_run_and_a_breakdown_that_adds_up() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--items", "300", "--repeats", "1"], capture_output=True, text=True, timeout=110
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    rows = {line.split("|")[1].strip(): line for line in lines if line.startswith("| ") and "---" not in line}
    assert set(rows) == {"run", "bound: the work alone", "conveyor", "conveyor, statistics off"}
    for label in ("conveyor", "conveyor, statistics off"):
        cells = [c.strip() for c in rows[label].strip("|").split("|")]
        assert all(re.fullmatch(NUMBER + "%?", c) for c in cells[1:]), cells
        assert float(cells[3]) == pytest.approx(float(cells[4]) + float(cells[5]), abs=0.11)  # main + workers
    total = re.search(rf"beyond the work: ({NUMBER}) µs", done.stdout)
    assert total is not None, done.stdout
    parts = [float(m.group(1)) for m in re.finditer(rf"^- .*: ({NUMBER}) µs", done.stdout, re.M)]
    assert len(parts) == 3 and sum(parts) == pytest.approx(float(total.group(1)), abs=0.2)


def test_bad_arguments_are_refused() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--items", "1"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--items must be >= 2" in done.stderr
