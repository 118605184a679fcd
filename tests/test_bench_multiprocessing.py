"""The multi-process benchmark script, run tiny: its output format, its checks and its
failure reporting. Timings are never asserted."""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
NAME = "bench_multiprocessing"


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location(NAME, ROOT / "benchmarks" / f"{NAME}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[NAME] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(NAME, None)


def table_rows(out: str, workload: str) -> list[list[str]]:
    """The cells of every row of ``workload``'s table (header and separator excluded)."""
    block = out.split(f"\n{workload}: ", 1)[1].splitlines()[1:]
    lines = block[: next((i for i, line in enumerate(block) if not line.startswith("|")), len(block))]
    assert lines[0].startswith("| loader ") and lines[1].startswith("|---")
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


def row(rows: list[list[str]], prefix: str) -> list[str]:
    found = [r for r in rows if r[0].startswith(prefix)]
    assert len(found) == 1, (prefix, rows)
    return found[0]


def test_quick_run_prints_tables_with_ratio_rows(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    # --cap-seconds keeps torchdata (about 600 µs per int) short; it is then marked "(capped)".
    assert bench.main(["--quick", "--workloads", "small,numpy", "--cap-seconds", "2"]) == 0
    out = capsys.readouterr().out
    assert "verification passed" in out
    assert "FAILED" not in out
    for workload in ("small", "numpy"):
        rows = table_rows(out, workload)
        conveyor = row(rows, "conveyor DataLoader2")
        assert conveyor[-1] == "ok (1 run)"
        assert re.fullmatch(r"[\d,]+", conveyor[3])  # items/s
        assert re.fullmatch(r"[\d,]+\.\d", conveyor[5])  # CPU µs/item
        assert row(rows, "torch ")[-1] == "ok (1 run)"
        torchdata = row(rows, "torchdata")
        assert torchdata[-1] == "ok (1 run)" or torchdata[-1].startswith(("unavailable: ", "failed "))
        vs_torch = row(rows, "ratio conveyor vs torch ")
        assert all(re.fullmatch(r"\d+\.\d\dx", vs_torch[i]) for i in (3, 5, 6))  # items/s, CPU, first item
        row(rows, "ratio conveyor vs torchdata")
    assert row(table_rows(out, "numpy"), "ratio conveyor vs torch ")[4].endswith("x")  # MiB/s
    assert row(table_rows(out, "small"), "conveyor DataLoader2")[4] == "-"  # no MiB/s for ints


def _broken(workload: Any, n: int, workers: int) -> Any:
    raise RuntimeError("boom")


def test_failures_and_missing_loaders_are_reported_in_their_rows(
    bench: ModuleType, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def candidates() -> list[Any]:
        return [
            bench.Candidate(bench.CONVEYOR, bench._conveyor),
            bench.Candidate("torchdata stand-in", _broken, required=False),
            bench.Candidate("missing loader", None, "unavailable: ModuleNotFoundError: nope", required=False),
        ]

    monkeypatch.setattr(bench, "candidates", candidates)
    assert bench.main(["--quick", "--workloads", "numpy", "--workers", "1"]) == 0
    captured = capsys.readouterr()
    rows = table_rows(captured.out, "numpy")
    assert row(rows, "conveyor DataLoader2")[-1] == "ok (1 run)"
    assert row(rows, "torchdata stand-in")[-1] == "failed (warm-up): RuntimeError: boom"
    assert row(rows, "missing loader")[-1] == "unavailable: ModuleNotFoundError: nope"
    assert row(rows, "ratio conveyor vs torchdata stand-in")[-1] == "torchdata failed"
    assert row(rows, "ratio conveyor vs missing loader")[-1] == "missing unavailable"
    assert "RuntimeError: boom" in captured.err  # the traceback

    # A required loader that fails makes the exit code 1.
    monkeypatch.setattr(bench, "candidates", lambda: [bench.Candidate(bench.CONVEYOR, _broken)])
    assert bench.main(["--quick", "--workloads", "numpy"]) == 1
    assert "verification FAILED for numpy: conveyor DataLoader2" in capsys.readouterr().out


def _listed(items: list[Any]) -> Any:
    def make(workload: Any, n: int, workers: int) -> Any:
        return items, lambda: None

    return make


def test_wrong_items_fail_the_check(bench: ModuleType) -> None:
    small, numpy = bench.WORKLOADS["small"], bench.WORKLOADS["numpy"]
    right = bench.Candidate("right", _listed(list(range(10))))
    assert bench.time_once(right, small, 10, 1).wall_s > 0
    for items, message in [
        (list(range(9)), "read 9 items, expected 10"),
        ([*range(9), 10], "item 9 is 10, expected 9"),
        ([0, 1, 2, 4, 3, 5, 6, 7, 8, 9], "item 3 is 4, expected 3"),  # out of order at a sampled position
        ([float(i) for i in range(10)], "item 0 is 0.0, expected 0"),
    ]:
        with pytest.raises(bench.CheckFailed, match=re.escape(message)):
            bench.time_once(bench.Candidate("wrong", _listed(items)), small, 10, 1)
    arrays = [bench.numpy_mib(i) for i in range(4)]
    assert bench.time_once(bench.Candidate("right", _listed(arrays)), numpy, 4, 1).cpu_s >= 0
    arrays[3][100] = 0  # one wrong byte in the last item
    with pytest.raises(bench.CheckFailed, match="item 3 holds"):
        bench.time_once(bench.Candidate("wrong", _listed(arrays)), numpy, 4, 1)
    assert bench.check_item("ndarray", np.zeros(bench.MIB, np.int64), 0) is not None


def test_workloads_and_arguments_are_validated(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--workloads", "small,huge"], ["--workers", "0"], ["--repeats", "0"], ["--cap-seconds", "0"]):
        with pytest.raises(SystemExit) as exit_info:
            bench.main(argv)
        assert exit_info.value.code == 2
    assert "choose from small,numpy,tensor" in capsys.readouterr().err
