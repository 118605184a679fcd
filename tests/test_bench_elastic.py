"""``benchmarks/bench_elastic.py``, run tiny: both tables print, and on the same ranks the
merged state resumes the very items the ranks' own states do. Timings are never asserted."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_elastic.py"


@pytest.mark.timeout(200)
def test_the_benchmark_prints_both_tables_and_checks_its_items() -> None:
    pytest.importorskip("torch.distributed")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--ranks", "2", "--items", "6000", "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert sum(line.startswith("| 64 ranks x 8 workers") for line in lines) == 1, done.stdout
    assert any(line.startswith("| merged state") for line in lines), done.stdout
    assert "read the same 1000 items on every rank: yes" in done.stdout
