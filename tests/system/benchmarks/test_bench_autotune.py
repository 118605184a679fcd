"""``benchmarks/bench_autotune.py`` through its ``main()``, run tiny (``--quick``): every
configuration of every workload runs, every epoch of every run is checked, and the auto
rows report what was chosen. Timings are never asserted."""

from __future__ import annotations

import re
from collections.abc import Iterator
from types import ModuleType

import pytest

from bench_helpers import suite, suite_rows


@pytest.fixture
def bench() -> Iterator[ModuleType]:
    with suite("bench_autotune") as module:
        yield module


@pytest.mark.timeout(300)
def test_the_quick_run_measures_and_checks_every_configuration(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench.main(["--quick", "--epochs", "2"]) == 0
    out = capsys.readouterr().out
    rows = suite_rows(out)
    for workload in ("small", "numpy", "images"):
        labels = [label for (w, label) in rows if w == workload]
        assert labels[0] == "num_workers=0: today's default" and labels[-1] == 'all three "auto"', labels
        assert ("num_workers=3" in labels) == (workload != "small"), labels  # 3 workers: not for small ints
        assert len(labels) == (5 if workload == "small" else 6), labels
        for label in labels:
            cells = rows[(workload, label)]
            assert cells["runs ok"] == "1/1", cells
            assert re.fullmatch(r"\d\.\d{3}x", cells["vs the best hand-picked"]), cells
        assert re.search(rf"^- {workload}: auto is [\d.]+x the best hand-picked configuration", out, re.M)
        assert re.search(rf"^- {workload}, auto run 1: workers by epoch \[\d+, \d+\]; chose num_workers=", out, re.M)
    assert out.rstrip().splitlines()[-1] == "verification passed: every run delivered every item as it should"


def test_an_out_of_order_item_fails_the_check(bench: ModuleType) -> None:
    from conveyor.tools.bench.harness.tally import check_delivery

    tally = bench.OrderedTally(3, times=2, arrays=False)
    for item in (0, 1, 2, 0, 2, 1):
        tally.see(item)
    found = check_delivery(tally.summary(), 3, None)
    assert "expected item 1, in order, got 2" in found[-1]


def test_arguments_are_validated(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in [
        (["--workloads", "small,nope"], "--workloads: unknown or none: 'nope'"),
        (["--epochs", "0"], "argument --epochs: must be >= 1, got 0"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            bench.main(argv)
        assert exit_info.value.code == 2, argv
        assert message in capsys.readouterr().err, argv
