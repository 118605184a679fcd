"""``benchmarks/bench_transport.py`` through its ``main()``, run tiny: a row per loader and
workload in MB/s and CPU s/GB, each item checked (its id, its bytes); the small-/dev/shm
workload's rows say why it did not run where it cannot. Timings are never asserted."""

from __future__ import annotations

import re
from collections.abc import Iterator
from types import ModuleType

import numpy as np
import pytest

from bench_helpers import suite, suite_rows

NUMBER = r"[\d,]+(\.\d+)?"


@pytest.fixture
def bench() -> Iterator[ModuleType]:
    pytest.importorskip("torch")
    with suite("bench_transport") as module:
        yield module


@pytest.mark.timeout(180)
def test_quick_run_reports_a_row_per_loader(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(bench.os, "geteuid", lambda: 1000)  # not root: no private /dev/shm
    assert bench.main(["--quick", "--workloads", "1MiB,1MiB-small-shm"]) == 0
    out = capsys.readouterr().out
    rows = suite_rows(out)
    for label in ("conveyor DataLoader2", "torch DataLoader"):
        cells = rows[("1MiB", label)]
        assert all(re.fullmatch(NUMBER, cells[c]) for c in ("MB/s", "CPU s/GB", "first item ms", "peak PSS MiB"))
        assert cells["runs ok"] == "1/1"
        why = "unavailable: not run: needs root to mount a private /dev/shm (unshare -m + mount -t tmpfs)"
        assert rows[("1MiB-small-shm", label)]["MB/s"] == why
    assert re.fullmatch(r"\d+\.\d\dx", rows[("1MiB", "torch DataLoader")]["conveyor DataLoader2's MB/s ÷ this"])
    assert out.rstrip().splitlines()[-1] == "verification passed: every run delivered every item as it should"


def test_the_tally_names_wrong_items(bench: ModuleType) -> None:
    from conveyor.tools.bench.harness.tally import check_delivery

    fill = bench.Fill(64)
    tally = bench.FillTally(3, 64)
    tally.see(fill(0))
    spoiled = fill(1)
    spoiled[-1] += 1
    tally.see(spoiled)
    tally.see(np.zeros(8, np.uint8))
    found = check_delivery(tally.summary(), 3, None)
    assert "1 id(s) never delivered" in found[0]  # the spoiled one still names its id
    assert "expected 1 in every byte after the id, got 'item 1'" in found[1]
    assert "expected uint8 (64,), got 'uint8 (8,)'" in found[1]
    whole = fill(16)  # every 16th is compared byte for byte
    whole[30] = 0
    tally = bench.FillTally(17, 64)
    tally.see(whole)
    assert "item 16" in check_delivery(tally.summary(), 17, None)[-1]
