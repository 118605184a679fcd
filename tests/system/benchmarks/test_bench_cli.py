"""``conveyor bench``, run tiny: the report's tables and ratio rows, the plot, argument
errors, missing or broken optional loaders, and that every loader does the same work on
each workload (same item checks). Timings are never asserted."""

from __future__ import annotations

import multiprocessing
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench_helpers import check_passing_section, row, table_rows, torchdata_importable
from conveyor.tools.bench import add_arguments, run
from conveyor.tools.bench import loaders as bench_loaders
from conveyor.tools.bench import measure as bench_measure
from conveyor.tools.bench import runner as bench_runner
from conveyor.tools.bench.errors import CheckFailed
from conveyor.tools.bench.loaders import Loader, Session, available_loaders
from conveyor.tools.bench.measure import measure_once
from conveyor.tools.bench.workloads import MIB, make_workloads, numpy_mib
from conveyor.tools.cli import main


def bench(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["bench", *argv])
    out, err = capsys.readouterr()
    assert multiprocessing.active_children() == []  # every worker was joined
    return code, out, err


@pytest.mark.timeout(60)
def test_quick_run_prints_tables_with_ratios(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    code, out, err = bench(
        capsys, "--quick", "--items", "24", "--workloads", "small,numpy,demo", "--data-dir", str(tmp_path)
    )
    assert code == 0, err
    assert out.startswith("conveyor bench: ")
    machine = (
        r"^machine: .* \d+ CPUs usable, python 3\.\d+\.\d+, .* torch \S+ \(\d+ intra-op threads\), torchdata \S+, "
        r"start method \w+; date \d{4}-\d\d-\d\d$"
    )
    assert re.search(machine, out, re.M)
    assert "settings: quick=yes workloads=small,numpy,demo workers=2 repeats=1 " in out
    assert "verification passed" in out and "FAILED" not in out
    for workload in ("small", "numpy", "demo"):
        check_passing_section(out, workload)
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
    numpy = make_workloads(tmp_path)["numpy"].prepare(4)
    arrays = [numpy_mib(i) for i in range(4)]
    monkeypatch.setattr(Listed, "items", arrays)
    assert measure_once(fake, numpy, 1).cpu_s >= 0
    wrong_byte = arrays[3].copy()
    wrong_byte[100] = 0
    for items, message in [
        ([*arrays[:3], wrong_byte], "item 3 holds 3..0..3, expected 3 throughout"),
        ([np.zeros(MIB, np.int64), *arrays[1:]], f"item 0 has dtype int64 and shape ({MIB},), expected uint8"),
        ([*arrays[:3], arrays[3][:-1]], f"item 3 has dtype uint8 and shape ({MIB - 1},)"),
    ]:
        monkeypatch.setattr(Listed, "items", items)
        with pytest.raises(CheckFailed, match=re.escape(message)):
            measure_once(fake, numpy, 1)
    demo = make_workloads(tmp_path)["demo"].prepare(8)
    batch = next(iter(demo.conveyor_pipe()))  # one batch of all 8 images, as conveyor yields it
    monkeypatch.setitem(bench_loaders._SESSIONS, "conveyor", Listed)
    fake = Loader("conveyor", "conveyor stand-in")
    monkeypatch.setattr(Listed, "items", [batch])
    assert measure_once(fake, demo, 1).fingerprint.startswith("8 images in 1 batches, each once")
    monkeypatch.setattr(Listed, "items", [batch, batch])
    with pytest.raises(CheckFailed, match=r"0 images missing and 8 delivered more than once"):
        measure_once(fake, demo, 1)


class SpoiledOnClose(Listed):
    """A stand-in whose items live in a buffer the loader reuses once it shuts down."""

    def close(self) -> None:
        type(self).items[-1][:] = 0


class LeavesAWorker(Listed):
    """A stand-in that starts a worker process and does not end it at shutdown."""

    def __init__(self, prepared: Any, workers: int):
        super().__init__(prepared, workers)
        multiprocessing.Process(target=time.sleep, args=(60,), daemon=True).start()


@pytest.mark.timeout(30)
def test_spoiled_last_item_and_stray_workers_fail_the_check(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    numpy = make_workloads(tmp_path)["numpy"].prepare(4)
    monkeypatch.setattr(Listed, "items", [numpy_mib(i) for i in range(4)])
    monkeypatch.setitem(bench_loaders._SESSIONS, "spoiled", SpoiledOnClose)
    # Item 3 passed while the loader ran (it is a sampled position): only the second look catches it.
    with pytest.raises(CheckFailed, match=r"^after shutdown: item 3 holds 0\.\.0\.\.0, expected 3 throughout$"):
        measure_once(Loader("spoiled", "spoiled stand-in"), numpy, 1)

    monkeypatch.setattr(Listed, "items", [numpy_mib(i) for i in range(4)])
    monkeypatch.setitem(bench_loaders._SESSIONS, "stray", LeavesAWorker)
    monkeypatch.setattr(bench_measure, "STRAY_JOIN_S", 0.5)  # the sleeper is terminated after that
    with pytest.raises(CheckFailed, match=r"^1 worker process\(es\) still running after shutdown$"):
        measure_once(Loader("stray", "stray stand-in"), numpy, 1)
    assert multiprocessing.active_children() == []  # ended by the measurement, not left to the next run


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
        [
            sys.executable,
            "-m",
            "conveyor.tools.bench",
            "--quick",
            "--items",
            "8",
            "--workloads",
            "small",
            "--data-dir",
            "d",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=55,
    )
    assert done.returncode == 0, done.stderr
    assert "ratio conveyor vs torch" in done.stdout


class Broken(Session):
    """A stand-in loader that raises as it is built."""

    def __init__(self, prepared: Any, workers: int):
        raise RuntimeError("boom")

    def __iter__(self) -> Iterator[Any]:
        raise AssertionError("never built")

    def close(self) -> None:
        raise AssertionError("never built")


MISSING = Loader("missing", "missing loader", "unavailable: ModuleNotFoundError: nope", required=False)


@pytest.mark.timeout(60)
def test_exit_code_is_1_only_when_a_required_loader_fails(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(bench_loaders._SESSIONS, "broken", Broken)
    conveyor = Loader("conveyor", "conveyor DataLoader2")
    stand_in = Loader("broken", "torchdata stand-in", required=False)
    monkeypatch.setattr(bench_runner, "available_loaders", lambda: [conveyor, stand_in, MISSING])
    code, out, err = bench(capsys, "--quick", "--items", "6", "--workloads", "numpy", "--workers", "1")
    assert code == 0
    rows = table_rows(out, "numpy")
    assert row(rows, "conveyor DataLoader2")[-1] == "ok (1 run)"
    assert row(rows, "torchdata stand-in")[-1] == "failed (warm-up): RuntimeError: boom"
    assert row(rows, "missing loader")[-1] == "unavailable: ModuleNotFoundError: nope"
    assert row(rows, "ratio conveyor vs torchdata stand-in")[-1] == "broken failed"
    assert row(rows, "ratio conveyor vs missing loader")[-1] == "missing unavailable"
    assert "RuntimeError: boom" in err  # the traceback
    assert "verification passed" in out

    # conveyor is required: its failure makes the exit code 1, and every ratio row says why it has no numbers.
    monkeypatch.setitem(bench_loaders._SESSIONS, "conveyor", Broken)
    monkeypatch.setattr(bench_runner, "available_loaders", lambda: [conveyor, MISSING])
    code, out, _ = bench(capsys, "--quick", "--items", "6", "--workloads", "numpy")
    assert code == 1
    assert row(table_rows(out, "numpy"), "ratio conveyor vs missing loader")[-1] == "conveyor failed"
    assert "verification FAILED for numpy (2 workers): conveyor DataLoader2" in out


def test_a_front_end_can_narrow_the_workloads(capsys: pytest.CaptureFixture[str]) -> None:
    """Another front end offers some workloads only (and then no --data-dir, which only the
    demo workload reads)."""
    import argparse

    parser = argparse.ArgumentParser(prog="narrowed")
    add_arguments(parser, workloads=("small", "numpy", "tensor"))
    assert parser.parse_args([]).workloads == ("small", "numpy", "tensor")
    for argv, message in [
        (["--workloads", "small,huge"], "unknown workload(s) huge; choose from small,numpy,tensor\n"),
        (["--workloads", "cpu"], "unknown workload(s) cpu; choose from small,numpy,tensor\n"),
        (["--data-dir", "d"], "unrecognized arguments: --data-dir d"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            run(parser.parse_args(argv))
        assert exit_info.value.code == 2, argv
        assert message in capsys.readouterr().err, argv
