"""``benchmarks/bench_transport.py``, run tiny: a child run checks what it reads, the
parent prints one row per loader and workload, reports a failed run in its row, and says
why the small-/dev/shm workload did not run where it cannot. Timings are never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from bench_helpers import loaded_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_transport.py"


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    with loaded_script(SCRIPT) as module:
        yield module


@pytest.mark.timeout(120)
def test_a_child_run_reads_and_checks_every_item():
    pytest.importorskip("torch")
    for loader in ("conveyor", "torch"):
        done = subprocess.run(
            [sys.executable, str(SCRIPT), "--one", loader, str(1 << 20), "10"], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert result["items"] == 10 and result["problems"] == [] and result["wall_s"] > 0


def test_the_check_names_wrong_items(bench):
    import numpy as np

    items = [np.full(8, 0, np.uint8), np.full(8, 5, np.uint8)]
    seen, problems = bench.check(iter(items), 3, 8)
    assert seen == 2 and any("item 1" in p for p in problems) and any("read 2 items" in p for p in problems)


def test_the_report_has_a_row_per_loader_and_says_why_a_run_failed(bench):
    rows = [
        bench.Row("1MiB", "conveyor", rates=[3000.0, 3200.0], cpu=[0.3, 0.4]),
        bench.Row("1MiB", "torch", rates=[300.0], cpu=[3.0], failures=["killed by SIGBUS: Bus error"]),
    ]
    text = bench.report(rows)
    assert "| 1MiB | conveyor | 3,100 | 0.35 | 2/2 |  |" in text
    assert "| 1MiB | torch | 300 | 3.00 | 1/2 | 10.33 |" in text
    assert "- 1MiB, torch: killed by SIGBUS: Bus error" in text


def test_without_root_the_small_dev_shm_workload_says_why(bench, monkeypatch):
    monkeypatch.setattr(bench.os, "geteuid", lambda: 1000)
    rows = bench.run(["1MiB-small-shm"], repeats=1, quick=True)
    why = "not run: needs root to mount a private /dev/shm (unshare -m + mount -t tmpfs)"
    assert [r.failures for r in rows] == [[why], [why]]
