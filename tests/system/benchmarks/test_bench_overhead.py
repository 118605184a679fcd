"""``benchmarks/bench_overhead.py`` through its ``main()``, run tiny: conveyor with its
statistics on and off, torch's loaders and the bare ``map`` on the trivial workload, and
the demo graph; statistics' cost derived from each repeat's pair; the sampled pulls timed
apart. Timings are never asserted."""

from __future__ import annotations

import re
from collections.abc import Iterator
from types import ModuleType

import pytest

from bench_helpers import suite, suite_rows, torchdata_importable

NUMBER = r"[\d,]+(\.\d)?"


@pytest.fixture
def bench() -> Iterator[ModuleType]:
    pytest.importorskip("torch")
    with suite("bench_overhead") as module:
        yield module


@pytest.mark.timeout(240)
def test_quick_run_reports_every_loader_and_the_statistics_cost(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench.main(["--quick", "--repeats", "2", "--workloads", "trivial,demo-in-process"]) == 0
    out = capsys.readouterr().out
    rows = suite_rows(out)
    trivial = [
        "conveyor DataLoader2",
        "conveyor DataLoader2, statistics off",
        "torch DataLoader (batch_size=None)",
        "torch DataLoader (batch_size=1)",
        "torchdata 0.7 DataLoader2",
        "no loader: map(add_one, range(N)) (floor)",
    ]
    demo = trivial[:3]
    assert list(rows) == [("trivial", label) for label in trivial] + [("demo-in-process", label) for label in demo]
    for (workload, label), cells in rows.items():
        if label.startswith("torchdata") and not torchdata_importable():
            assert cells["items/s"].startswith("unavailable: torchdata not installed"), cells
            continue
        assert re.fullmatch(NUMBER + r"( \(.*\))?", cells["items/s"]), cells
        assert cells["runs ok"] == "2/2", cells
        cost = (cells["statistics' cost, wall"], cells["statistics' cost, CPU"])
        if label == "conveyor DataLoader2":  # from each repeat's pair of runs, on and off
            assert all(re.fullmatch(r"[+-]\d+\.\d%", c) for c in cost), (workload, cells)
        else:
            assert cost == ("-", "-"), (workload, cells)
    assert out.rstrip().splitlines()[-1] == "verification passed: every run delivered every item as it should"


@pytest.mark.timeout(120)
def test_the_sampled_pulls_are_timed_apart(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--sample-cost", "2"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("demo, in-process, one loader, 2 epochs of 64 batches: ") and "per epoch" in line
