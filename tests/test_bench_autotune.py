"""``benchmarks/bench_autotune.py``, run tiny (``--quick``): every configuration of every
workload runs, every epoch of every run is checked, the auto rows report what was chosen.
Timings are never asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_autotune.py"
WORKLOADS = ("small", "numpy", "images")
#: The labels of the rows every workload has (besides its other prefetch setting's).
LABELS = {
    "num_workers=0: today's default, MultiProcessingReadingService()",
    "num_workers=1",
    "num_workers=2 (what most users type)",
    "num_workers=3",
    'all three "auto"',
}


def sections(stdout: str) -> dict[str, list[str]]:
    """Each workload's table rows (not its header lines), by workload."""
    found: dict[str, list[str]] = {}
    current = None
    for line in stdout.splitlines():
        if line.startswith("## "):
            current = line[3:].split(":", 1)[0]
            found[current] = []
        elif current and line.startswith("| ") and not line.startswith("| configuration"):
            found[current].append(line)
    return found


@pytest.mark.timeout(300)
def test_the_quick_run_measures_and_checks_every_configuration() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--epochs", "2"],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verification passed for every run" in done.stdout
    tables = sections(done.stdout)
    assert set(tables) == set(WORKLOADS), done.stdout
    for workload, rows in tables.items():
        labels = [row.split("|")[1].strip().removesuffix(" **best**") for row in rows]
        others = [label for label in labels if label not in LABELS]
        expected = LABELS if workload != "small" else LABELS - {"num_workers=3"}  # 3 workers: not for small ints
        assert set(labels) >= expected and len(labels) == len(expected) + 1, (workload, labels)
        assert len(others) == 1 and others[0].startswith("num_workers=2, worker_prefetch_cnt="), others
        assert all(row.rstrip().endswith("| 1/1 |") for row in rows), rows  # ran, and checked OK
        assert f"- {workload} auto run 1: workers by epoch [" in done.stdout
        assert f"{workload}: auto is " in done.stdout
    assert "FAILED" not in done.stdout


def test_an_unknown_workload_is_refused() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--workloads", "small,nope"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "--workloads" in done.stderr
