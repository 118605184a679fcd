"""``benchmarks/bench_torch_dataloader.py``, run tiny: it exits 0 and prints a row for each
loader on each of the three workloads, with the targets as text; its check catches items
delivered twice or never. Timings are never asserted."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from bench_helpers import loaded_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_torch_dataloader.py"


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    pytest.importorskip("torch")
    with loaded_script(SCRIPT) as module:
        yield module


@pytest.mark.timeout(120)
def test_script_reports_the_three_workloads(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    command = [sys.executable, str(SCRIPT), "--scale", "0.002", "--repeats", "1"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=115, check=False)
    out = done.stdout
    assert done.returncode == 0, done.stderr
    assert re.search(r"^machine: .*, start method \w+; date \d{4}-\d\d-\d\d$", out, re.M)
    assert "settings: workloads=ints,tensors,dicts workers=2 repeats=1 scale=0.002;" in out
    number = r"[\d,]+(\.\d)?"
    for workload in ("(a) ints", "(b) tensors", "(c) dicts"):
        rows = {}
        for loader in ("torch", "conveyor"):
            found = re.search(rf"^\| {re.escape(workload)} \| {loader}( \S+)? \| (.*) \|$", out, re.M)
            assert found, (workload, loader, out)
            rows[loader] = [cell.strip() for cell in found.group(2).split("|")]
        torch_cells, cells = rows["torch"], rows["conveyor"]
        for row in (torch_cells, cells):  # items/s, CPU µs/item, first batch, runs ok
            assert all(re.fullmatch(number, row[i]) for i in (0, 2, 3)) and row[4] == "1/1", row
        assert torch_cells[1] == torch_cells[5] == torch_cells[6] == "", torch_cells
        assert re.fullmatch(r"\d+\.\d\dx", cells[1]), cells  # the ratio
        assert re.fullmatch(r"items/s >= [\d.]+x torch, CPU/item < torch", cells[5]), cells
        assert re.fullmatch(r"(yes|no) \(.*\)", cells[6]), cells  # reported, never asserted
    assert "tensors-unbatched" not in out.split("settings:", 1)[1]  # opt-in only
    assert out.rstrip().splitlines()[-1] == "verification passed for every run"


def test_the_check_catches_items_repeated_or_missing(bench: ModuleType) -> None:
    import torch

    ints = bench.WORKLOADS["ints"]
    check = bench.Checker(ints, 3)
    for i in (0, 1, 2):
        check.see(torch.tensor([i]))
    check.finish()  # every id once

    check = bench.Checker(ints, 3)
    for i in (0, 1, 1):
        check.see(torch.tensor([i]))
    with pytest.raises(bench.CheckFailed, match=re.escape("1 id(s) never delivered, 1 delivered more than once")):
        check.finish()

    tensors = bench.WORKLOADS["tensors"]
    check = bench.Checker(tensors, 2)
    check.see(torch.full((1, bench.TENSOR_ELEMENTS), 0.0))
    wrong = torch.full((1, bench.TENSOR_ELEMENTS), 1.0)
    wrong[0, -1] = 5.0
    check.see(wrong)
    with pytest.raises(bench.CheckFailed, match=re.escape("batch 2: elements 1.0 .. 5.0")):
        check.finish()

    dicts = bench.WORKLOADS["dicts"]
    check = bench.Checker(dicts, 2)
    ids = torch.tensor([0, 1])
    check.see({"id": ids, "x": ids / 2, "label": torch.tensor([0, 7])})
    with pytest.raises(bench.CheckFailed, match="x or label do not match"):
        check.finish()


def test_arguments_are_validated(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in [
        (["--workloads", "ints,huge"], "unknown workload(s) huge; choose from ints,tensors,dicts,tensors-unbatched"),
        (["--repeats", "0"], "--repeats must be >= 1, got 0"),
        (["--scale", "0"], "--scale must be > 0, got 0.0"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            bench.main(argv)
        assert exit_info.value.code == 2, argv
        assert message in capsys.readouterr().err, argv
