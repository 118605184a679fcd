"""``benchmarks/bench_torch_dataloader.py`` through its ``main()``, run tiny: a row for each
loader on each workload (the opt-in one only when named), the targets as text; its tally
catches batches repeated, missing or wrong. Timings are never asserted."""

from __future__ import annotations

import re
from collections.abc import Iterator
from types import ModuleType

import pytest

from bench_helpers import suite, suite_rows

NUMBER = r"[\d,]+(\.\d)?"


@pytest.fixture
def bench() -> Iterator[ModuleType]:
    pytest.importorskip("torch")
    with suite("bench_torch_dataloader") as module:
        yield module


@pytest.mark.timeout(180)
def test_quick_run_reports_the_three_workloads(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "settings: workloads=ints,tensors,dicts loaders=torch,conveyor repeats=1 quick;" in out
    rows = suite_rows(out)
    workloads = ("ints", "tensors", "dicts")  # tensors-unbatched: opt-in only
    assert list(rows) == [(w, label) for w in workloads for label in ("torch DataLoader", "conveyor.DataLoader")]
    for (_, label), cells in rows.items():
        assert all(re.fullmatch(NUMBER, cells[c]) for c in ("items/s", "CPU µs/item", "first item ms")), cells
        ratio = cells["conveyor.DataLoader's items/s ÷ this"]
        assert ratio == "" if label.startswith("conveyor") else re.fullmatch(r"\d+\.\d\dx", ratio), cells
        assert cells["runs ok"] == "1/1"
    for workload, goal in (("ints", 10), ("tensors", 5), ("dicts", 1.5)):
        target = rf"^- target: {workload}: conveyor items/s >= {goal:g}x torch's and less CPU per item: "
        assert re.search(target + r"[\d.]+x, .* µs, (held|missed)$", out, re.M), workload
    assert out.rstrip().splitlines()[-1] == "verification passed: every run delivered every item as it should"


def test_the_tally_catches_batches_repeated_missing_or_wrong(bench: ModuleType) -> None:
    import torch

    from conveyor.tools.bench.harness.tally import check_delivery

    def problems(tally: object, n: int) -> list[str]:
        return check_delivery(tally.summary(), n, None)  # type: ignore[attr-defined]

    tally = bench.BatchTally(3, "ints", 1)
    for i in (0, 1, 2):
        tally.see(torch.tensor([i]))
    assert problems(tally, 3) == []  # every id once, in 3 batches

    tally = bench.BatchTally(3, "ints", 1)
    for i in (0, 1, 1):
        tally.see(torch.tensor([i]))
    assert "1 id(s) never delivered, 1 delivered more than once" in problems(tally, 3)[0]

    tally = bench.BatchTally(2, "tensors", 1)
    tally.see(torch.full((1, bench.TENSOR_ELEMENTS), 0.0))
    wrong = torch.full((1, bench.TENSOR_ELEMENTS), 1.0)
    wrong[0, -1] = 5.0
    tally.see(wrong)
    assert "expected one id throughout, got 'elements 1.0 .. 5.0'" in problems(tally, 2)[-1]

    tally = bench.BatchTally(2, "dicts", 64)
    ids = torch.tensor([0, 1])
    tally.see({"id": ids, "x": ids / 2, "label": torch.tensor([0, 7])})
    assert "expected x and label matching the ids" in problems(tally, 2)[-1]

    tally = bench.BatchTally(4, "dicts", 2)  # two batches expected: three came
    for batch in ([0], [1], [2, 3]):
        ids = torch.tensor(batch)
        tally.see({"id": ids, "x": ids / 2, "label": ids % 10})
    assert "expected 2 batches, got '3 batches'" in problems(tally, 4)[-1]


def test_arguments_are_validated(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    choices = "choose from ints,tensors,dicts,tensors-unbatched"
    for argv, message in [
        (["--workloads", "ints,huge"], f"--workloads: unknown or none: 'huge'; {choices}"),
        (["--repeats", "0"], "--repeats must be >= 1, got 0"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            bench.main(argv)
        assert exit_info.value.code == 2, argv
        assert message in capsys.readouterr().err, argv
