"""``benchmarks/bench_stats.py``, run tiny: it prints one row per pipeline with both
conveyor's runs and torch's. Timings are never asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_stats.py"


@pytest.mark.timeout(180)
def test_the_script_prints_a_row_per_pipeline(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--repeats",
            "2",
            "--torch-repeats",
            "1",
            "--items",
            "2000",
            "--data-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    header, rows = lines[0], lines[1:]
    assert "CPU overhead by pair" in header and "conveyor (stats on) vs torch" in header
    names = [row.split("|")[1].strip() for row in rows]
    assert names == ["demo, 2 workers", "demo, in-process", "small, 2 workers", "trivial, in-process"]
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert len(cells) == 12 and cells[-1].endswith("x faster")
        assert all(float(cells[i]) >= 0 for i in (1, 2, 4, 5, 9, 10))  # seconds, 3 decimals: a tiny run may print 0.000


@pytest.mark.timeout(120)
def test_the_script_times_sampled_pulls_apart(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--sample-cost", "2", "--data-dir", str(tmp_path)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith("demo, in-process, one loader, 2 epochs of 64 batches: ") and "per epoch" in line
