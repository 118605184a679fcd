"""``conveyor bench``, run tiny: the report's tables and ratio rows, the plot, argument
errors, missing or broken optional loaders, and that every loader does the same work on
each workload (same item checks). Timings are never asserted."""

from __future__ import annotations

import importlib
import multiprocessing
import re
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor.bench import loaders as bench_loaders
from conveyor.bench.errors import CheckFailed
from conveyor.bench.loaders import Loader, Session, available_loaders
from conveyor.bench.measure import measure_once
from conveyor.bench.workloads import make_workloads
from conveyor.cli import main

RATIO = re.compile(r"\d+\.\d\dx")


def torchdata_importable() -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            importlib.import_module("torchdata.dataloader2")
    except Exception:  # missing, or broken against this torch: the bench reports it as unavailable
        return False
    return True


def bench(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["bench", *argv])
    out, err = capsys.readouterr()
    assert multiprocessing.active_children() == []  # every worker was joined
    return code, out, err


def table_rows(out: str, workload: str) -> list[list[str]]:
    """The cells of every row of ``workload``'s table (header and separator excluded)."""
    block = out.split(f"\n{workload}: ", 1)[1].splitlines()[2:]
    lines = block[: next((i for i, line in enumerate(block) if not line.startswith("|")), len(block))]
    assert lines[0].startswith("| loader ") and lines[1].startswith("|---")
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


def row(rows: list[list[str]], prefix: str) -> list[str]:
    found = [r for r in rows if r[0].startswith(prefix)]
    assert len(found) == 1, (prefix, rows)
    return found[0]


@pytest.mark.timeout(60)
def test_quick_run_prints_tables_with_ratios(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    code, out, err = bench(
        capsys, "--quick", "--items", "24", "--workloads", "small,numpy,demo", "--data-dir", str(tmp_path)
    )
    assert code == 0, err
    assert out.startswith("conveyor bench: ")
    machine = r"^machine: .* \d+ CPUs usable, python 3\.\d+\.\d+, .* torch \S+ \(\d+ intra-op threads\), torchdata \S+"
    assert re.search(machine, out, re.M)
    assert "settings: quick=yes workloads=small,numpy,demo workers=2 repeats=1 " in out
    assert "verification passed" in out and "FAILED" not in out
    with_torchdata = torchdata_importable()
    for workload in ("small", "numpy", "demo"):
        rows = table_rows(out, workload)
        conveyor = row(rows, "conveyor DataLoader2")
        assert conveyor[-1] == "ok (1 run)"
        assert re.fullmatch(r"[\d,]+", conveyor[3])  # items/s
        assert re.fullmatch(r"\d+\.\d\d", conveyor[5])  # CPU s
        assert row(rows, "torch ")[-1] == "ok (1 run)"
        vs_torch = row(rows, "ratio conveyor vs torch ")
        assert all(RATIO.fullmatch(vs_torch[i]) for i in (3, 6, 7)), vs_torch  # items/s, CPU/item, first item
        torchdata, vs_torchdata = row(rows, "torchdata"), row(rows, "ratio conveyor vs torchdata")
        if with_torchdata:
            assert torchdata[-1] == "ok (1 run)"
            assert all(RATIO.fullmatch(vs_torchdata[i]) for i in (3, 6, 7)), vs_torchdata
        else:
            assert torchdata[-1].startswith("unavailable: ")
        check = out.split(f"\n{workload}: ", 1)[1].split("\ncheck: ", 1)[1].splitlines()[0]
        assert check.startswith("every run of conveyor DataLoader2, torch "), check
    assert row(table_rows(out, "numpy"), "ratio conveyor vs torch ")[4].endswith("x")  # MiB/s
    assert row(table_rows(out, "small"), "conveyor DataLoader2")[4] == "-"  # no MiB/s for ints
    assert "24 images in" in out  # the demo: every image of a 24-image dataset, each once
    assert "demo dataset: " in out and (tmp_path / "4x6" / "manifest.json").is_file()
    assert "conveyor bench: small: 24 items, 2 workers" in err  # progress on stderr


@pytest.mark.timeout(60)
def test_plot_writes_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "bench.png"
    code, out, err = bench(
        capsys,
        "--quick",
        "--items",
        "16",
        "--workloads",
        "small,cpu",
        "--workers",
        "1",
        "--plot",
        str(png),
        "--plot-workers",
        "0,2",
    )
    assert code == 0, err
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 1000
    assert f"plot: {png}" in out
    sweep = out.split("throughput by num_workers (items/s, median):", 1)[1]
    assert "| workload | loader" in sweep and "0 workers" in sweep and "1 workers" in sweep and "2 workers" in sweep
    assert "small: 16 ints, fn = identity; 1 worker," in out  # the tables are for --workers


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workloads", "small,huge"], "unknown workload(s) huge; choose from small,numpy,tensor,cpu,demo"),
        (["--workloads", "small,,numpy"], "without empty entries"),
        (["--workers", "-1"], "argument --workers: must be >= 0, got -1"),
        (["--repeats", "0"], "argument --repeats: must be >= 1, got 0"),
        (["--items", "many"], "argument --items: expected an integer, got 'many'"),
        (["--plot-workers", "0,x"], "argument --plot-workers: expected an integer, got 'x'"),
        (["--cap-seconds", "0"], "argument --cap-seconds: must be > 0"),
        (["--quick", "--unknown"], "unrecognized arguments: --unknown"),
    ],
)
def test_bad_arguments_are_argparse_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "usage: conveyor" in err and message in err


@pytest.mark.timeout(60)
def test_workloads_give_identical_item_checks_across_loaders(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    loaders = [loader for loader in available_loaders() if loader.available]
    assert [loader.key for loader in loaders][:2] == ["conveyor", "torch"]
    for name, workload in make_workloads(tmp_path).items():
        prepared = workload.prepare(40 if name == "demo" else 12)
        for workers in (0, 2):
            runs = {loader.name: measure_once(loader, prepared, workers) for loader in loaders}
            prints = {loader: run.fingerprint for loader, run in runs.items()}
            assert len(set(prints.values())) == 1, (name, workers, prints)
            assert all(run.items == prepared.items for run in runs.values())
    assert multiprocessing.active_children() == []


class Listed(Session):
    """A stand-in loader that yields a fixed list."""

    items: list[Any] = []

    def __init__(self, prepared: Any, workers: int):
        self.closed = False

    def __iter__(self) -> Iterator[Any]:
        return iter(type(self).items)

    def close(self) -> None:
        self.closed = True


@pytest.mark.timeout(30)
def test_wrong_items_fail_the_check(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(bench_loaders._SESSIONS, "listed", Listed)
    fake = Loader("listed", "listed stand-in")
    small = make_workloads(tmp_path)["small"].prepare(10)
    monkeypatch.setattr(Listed, "items", list(range(10)))
    assert measure_once(fake, small, 1).items == 10
    for items, message in [
        (list(range(9)), "read 9 items, expected 10"),
        ([*range(9), 10], "item 9 is 10, expected 9"),
        ([0, 1, 2, 4, 3, 5, 6, 7, 8, 9], "item 3 is 4, expected 3"),  # out of order at a sampled position
        ([float(i) for i in range(10)], "item 0 is 0.0, expected 0"),
    ]:
        monkeypatch.setattr(Listed, "items", items)
        with pytest.raises(CheckFailed, match=re.escape(message)):
            measure_once(fake, small, 1)
    demo = make_workloads(tmp_path)["demo"].prepare(8)
    batch = next(iter(demo.conveyor_pipe()))  # one batch of all 8 images, as conveyor yields it
    monkeypatch.setitem(bench_loaders._SESSIONS, "conveyor", Listed)
    fake = Loader("conveyor", "conveyor stand-in")
    monkeypatch.setattr(Listed, "items", [batch])
    assert measure_once(fake, demo, 1).fingerprint.startswith("8 images in 1 batches, each once")
    monkeypatch.setattr(Listed, "items", [batch, batch])
    with pytest.raises(CheckFailed, match=r"0 images missing and 8 delivered more than once"):
        measure_once(fake, demo, 1)


def _missing_torch() -> Any:
    raise ModuleNotFoundError("No module named 'torch'")


def _broken_torchdata() -> Any:
    raise RuntimeError("torchdata is broken against this torch")


@pytest.mark.timeout(60)
def test_missing_torch_makes_torch_and_tensor_rows_unavailable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(bench_loaders, "_import_torch", _missing_torch)
    code, out, err = bench(capsys, "--quick", "--items", "8", "--workloads", "small,tensor")
    assert code == 0, err
    assert ", torch -, torchdata " in out
    small = table_rows(out, "small")
    assert row(small, "conveyor DataLoader2")[-1] == "ok (1 run)"
    assert row(small, "torch DataLoader")[-1] == "unavailable: ModuleNotFoundError: No module named 'torch'"
    assert row(small, "torchdata")[-1].startswith("unavailable: needs torch")
    assert row(small, "ratio conveyor vs torch DataLoader")[-1] == "torch unavailable"
    for cells in table_rows(out, "tensor")[:3]:
        assert (
            cells[-1] == "unavailable: the tensor workload needs torch (ModuleNotFoundError: No module named 'torch')"
        )


@pytest.mark.timeout(60)
def test_broken_torchdata_is_reported_in_its_rows(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    monkeypatch.setattr(bench_loaders, "_import_torchdata", _broken_torchdata)
    code, out, _ = bench(capsys, "--quick", "--items", "8", "--workloads", "small")
    assert code == 0
    rows = table_rows(out, "small")
    assert row(rows, "torchdata")[-1] == "unavailable: RuntimeError: torchdata is broken against this torch"
    assert row(rows, "ratio conveyor vs torchdata")[-1] == "torchdata unavailable"

    # Importable but failing at run time: "failed", still exit code 0 (torchdata is not required).
    monkeypatch.undo()
    if not torchdata_importable():
        return

    def failing(self: Any, prepared: Any, workers: int) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(bench_loaders.TorchdataSession, "__init__", failing)
    code, out, err = bench(capsys, "--quick", "--items", "8", "--workloads", "small")
    assert code == 0
    assert row(table_rows(out, "small"), "torchdata")[-1] == "failed (warm-up): RuntimeError: boom"
    assert "RuntimeError: boom" in err  # the traceback


@pytest.mark.timeout(60)
def test_runs_as_a_module_outside_the_checkout(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "conveyor.bench", "--quick", "--items", "8", "--workloads", "small", "--data-dir", "d"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=55,
    )
    assert done.returncode == 0, done.stderr
    assert "ratio conveyor vs torch" in done.stdout
