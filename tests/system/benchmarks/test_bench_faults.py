"""``benchmarks/bench_faults.py`` through its ``main()``, run tiny: every workload runs,
every conveyor run delivers what it should (every good image; every item once after a
worker is killed), and torch's loader loses the epochs the faults end. The shutdown rows
run under ``fork`` alone here (the other start methods are the same code with another
name, and each costs fresh processes importing torch); conveyor's shutdown under each
start method is tested in ``test_hardening.py``. Timings are never asserted."""

from __future__ import annotations

import re
from collections.abc import Iterator
from types import ModuleType

import pytest

from bench_helpers import suite, suite_rows


@pytest.fixture
def bench() -> Iterator[ModuleType]:
    pytest.importorskip("torch")
    with suite("bench_faults") as module:
        yield module


@pytest.mark.timeout(240)
def test_quick_run_runs_every_workload_and_checks_what_came(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    loaders = "raise,skip,conveyor,torch,conveyor-killed,torch-killed,conveyor-fork,torch-fork"
    assert bench.main(["--quick", "--loaders", loaders]) == 0
    out = capsys.readouterr().out
    rows = suite_rows(out)
    assert set(rows) == {
        ("budget-small", "conveyor, on_error='raise'"),
        ("budget-small", "conveyor, on_error='skip'"),
        ("budget-trivial", "conveyor, on_error='raise'"),
        ("budget-trivial", "conveyor, on_error='skip'"),
        ("corrupt", "conveyor"),
        ("corrupt", "torch DataLoader"),
        ("restart", "conveyor"),
        ("restart", "conveyor, a worker killed"),
        ("restart", "torch DataLoader, a worker killed"),
        *((workload, f"{name}, fork") for workload in ("shutdown", "shutdown-stuck") for name in ("conveyor", "torch")),
    }
    assert all(cells["runs ok"] == "1/1" for cells in rows.values()), out
    assert rows[("corrupt", "conveyor")]["skipped"] == "4"  # 1% of 400, each skipped and none else
    assert rows[("corrupt", "conveyor")]["items delivered"] == "396"
    assert rows[("corrupt", "torch DataLoader")]["items delivered"] == "99"  # up to the first bad one
    assert rows[("restart", "conveyor, a worker killed")]["worker restarts"] == "1"
    assert rows[("restart", "conveyor, a worker killed")]["items delivered"] == "300"
    assert re.fullmatch(r"[\d,]+\.\d", rows[("shutdown-stuck", "conveyor, fork")]["shutdown ms"])
    assert "- corrupt, torch: failed: OSError" in out
    assert "- restart, torch-killed: failed: RuntimeError" in out
    assert "the wall time of 'raise'" in out and "without the kill" in out
    assert out.rstrip().splitlines()[-1] == "verification passed: every run delivered every item as it should"


def test_the_tallies_expect_what_each_loader_must_deliver(bench: ModuleType) -> None:
    from conveyor.tools.bench.harness.declare import Context
    from conveyor.tools.bench.harness.tally import check_delivery

    def tally(workload: str, loader: str, n: int) -> object:
        return bench.tally(Context(bench.SUITE.workload(workload), bench.SUITE.loader(loader), n, {}, False))

    conveyor = tally("corrupt", "conveyor", 200)
    for i in (0, 1, 99):  # 99 is corrupt: conveyor must skip it
        conveyor.see((i, bench.np.zeros((64, 64, 3), bench.np.uint8)))
    found = check_delivery(conveyor.summary(), 200, None)
    assert "expected only the ids this loader delivers, got 'id 99'" in found[-1] and "196 id(s) never" in found[0]
    torch = tally("corrupt", "torch", 200)
    for i in range(99):
        torch.see((i, bench.np.zeros((64, 64, 3), bench.np.uint8)))
    assert check_delivery(torch.summary(), 200, None) == []  # up to the first bad one, each once
