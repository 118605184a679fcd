"""``benchmarks/bench_thread_workers.py``, run tiny: it exits 0, prints a row for each loader
and bound with its numbers, and the three targets as text; its memory sampling sums a
process tree. Timings are never asserted."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from bench_helpers import loaded_script

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPT = BENCHMARKS / "bench_thread_workers.py"
NUMBER = r"[\d,]+(\.\d)?"
ROWS = (
    "conveyor, 2 thread workers",
    "conveyor, 2 worker processes",
    "torch DataLoader(num_workers=2)",
    "no loader: the work in 2 threads (bound)",
    "no loader: the work in 2 processes (bound)",
    "no loader: conveyor's graph in 2 threads (bound)",
)


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    with loaded_script(SCRIPT) as module:  # the script imports bench_real_data, beside it
        yield module


def row_cells(out: str, label: str) -> list[str]:
    found = re.search(rf"^\| {re.escape(label)} \| (.*) \|$", out, re.M)
    assert found, (label, out)
    return [cell.strip() for cell in found.group(1).split("|")]


@pytest.mark.timeout(300)
def test_script_reports_every_loader_and_the_targets(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--shards", "4", "--per-shard", "8", "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=280,
        env=env,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, done.stderr
    assert re.search(r"^machine: .*; date \d{4}-\d\d-\d\d$", out, re.M)
    assert re.search(
        r"^settings: 4 shards x 8 images = 32 per epoch, .* commit \w+; load [\d.]+ at the start$", out, re.M
    )
    for label in ROWS:
        # images/s, CPU, first batch, peak RSS, peak PSS, start-up alone, one batch alone,
        # the libraries' RSS, processes, runs
        cells = row_cells(out, label)
        bound = label.startswith("no loader")
        assert all(re.fullmatch(NUMBER, cells[i]) for i in (0, 1, 2, 3, 4, 6, 7)), cells
        assert re.fullmatch("-" if bound else NUMBER, cells[5]), cells  # a bound has no loader to start
        assert cells[9] == "1/1", cells
    # The run counts its live children at each batch (the parent's samples, 50 ms apart,
    # could miss both workers of this short epoch): thread workers never show a second
    # process, worker processes the main one and both workers (the in-order merge needs
    # the second's items, so it runs at some batch).
    assert row_cells(out, ROWS[0])[8] == "1"
    assert row_cells(out, ROWS[1])[8] == "3"
    for target in (r"first batch [\d.]+x sooner \(target >= 10x\)", r"peak RSS [\d.]+x \(target <= 0\.333x\)"):
        assert re.search(rf"^{target}: (yes|no)$", out, re.M), target
    assert re.search(r"^images/s [\d.]+x \(target >= 0\.9x\): (yes|no)$", out, re.M)
    assert re.search(
        r"^- throughput: the work alone in 2 threads runs at .* thread workers reach \d+% of the latter$", out, re.M
    )
    assert out.rstrip().endswith("verification passed for every run")
    assert not list(tmp_path.iterdir())  # its data is removed


def test_memory_of_a_process_tree_counts_every_process(bench: ModuleType) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "print('ready', flush=True); input()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        tree = bench.descendants(os.getpid())
        assert os.getpid() in tree and child.pid in tree
        own, child_rss = bench.status_bytes(os.getpid(), "VmRSS"), bench.status_bytes(child.pid, "VmRSS")
        rss, pss, count = bench.tree_memory(os.getpid())
        assert count == len(tree) >= 2
        assert own > 0 and child_rss > 0
        assert abs(rss - own - child_rss) < own // 10  # both, once each (this process's own may move a little)
        assert 0 < pss <= rss
    finally:
        child.kill()
        child.wait(30)
    assert bench.status_bytes(child.pid, "VmRSS") == 0  # gone: nothing to count
