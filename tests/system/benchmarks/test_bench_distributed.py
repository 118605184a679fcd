"""``benchmarks/bench_distributed.py`` through its ``main()``, run tiny: the agreed epoch end
against none, an elastic resume from each kind of state (the resumed items new ones, each
once), and a merge of synthesized states. Timings are never asserted."""

from __future__ import annotations

import re
from collections.abc import Iterator
from types import ModuleType

import pytest

from bench_helpers import suite, suite_rows

NUMBER = r"[\d,]+(\.\d)?"


@pytest.fixture
def bench() -> Iterator[ModuleType]:
    pytest.importorskip("torch.distributed")
    with suite("bench_distributed") as module:
        yield module


@pytest.mark.timeout(300)
def test_quick_run_reports_each_kind_of_run(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    loaders = "without,window-32,own-state,merged-state,merge"
    assert bench.main(["--quick", "--workloads", "batched,resume,merge-64x8", "--loaders", loaders]) == 0
    out = capsys.readouterr().out
    rows = suite_rows(out)
    assert list(rows) == [
        ("batched", "sharded, no agreement"),
        ("batched", "fullsync, window 32"),
        ("resume", "resumed from the rank's own state"),
        ("resume", "resumed from the merged state"),
        ("merge-64x8", "merge_rank_states"),
    ]
    assert all(cells["runs ok"] == "1/1" for cells in rows.values()), out
    for label in ("resumed from the rank's own state", "resumed from the merged state"):
        cells = rows[("resume", label)]
        assert re.fullmatch(NUMBER, cells["first item ms"]) and re.fullmatch(NUMBER, cells["to 1,000 items ms"])
    merge = rows[("merge-64x8", "merge_rank_states")]
    assert all(re.fullmatch(NUMBER, merge[c]) for c in ("merge ms", "states in, JSON B", "merged, JSON B"))
    assert int(merge["runs in the merged state"]) > 0
    assert re.search(r"^- batched, window 32: [\d.]+x the wall time without the agreement$", out, re.M)
    assert out.rstrip().splitlines()[-1] == "verification passed: every run delivered every item as it should"


def test_a_resumed_item_read_before_the_cut_fails(bench: ModuleType) -> None:
    from conveyor.tools.bench.harness.tally import check_delivery

    tally = bench.ResumeTally(10)
    tally.before = {1, 2}
    for i in (5, 6, 2, 6):
        tally.see(i)
    found = check_delivery(tally.summary(), 10, None)
    assert "delivered more than once" in found[0] and "expected an item not read before the cut" in found[1]
