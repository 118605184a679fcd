"""``conveyor bench``, run tiny on the harness: the report's tables and ratio rows, its
results as JSON, the plot, argument errors, missing or broken optional loaders, a run
that delivers wrong failing (and the exit code only for the loaders that count), and every
loader passing each workload's tally. Timings are never asserted."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench_helpers import check_passing_section, row, table_rows, torchdata_importable
from conveyor.tools.bench import command, loaders, options, report, run
from conveyor.tools.bench.demo_data import demo_size, prepare_demo
from conveyor.tools.bench.harness.declare import Context
from conveyor.tools.bench.harness.results import SCHEMA, Result
from conveyor.tools.bench.harness.tally import check_delivery
from conveyor.tools.bench.per_item import MIB, cpu_heavy, numpy_mib
from conveyor.tools.bench.suite import SUITE
from conveyor.tools.cli import main


def bench(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``conveyor bench`` with ``argv``, never capped: a loaded machine would cap these tiny runs."""
    code = main(["bench", *argv, "--cap-seconds", "600"])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.timeout(600)
def test_quick_run_prints_tables_with_ratios_and_saves_its_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    saved = tmp_path / "bench.json"
    code, out, err = bench(
        capsys,
        *("--quick", "--items", "24", "--workloads", "small,numpy,demo", "--data-dir", str(tmp_path)),
        *("--out", str(saved)),
    )
    assert code == 0, err
    assert out.startswith("conveyor bench: conveyor DataLoader2 vs torch DataLoader vs torchdata DataLoader2; ")
    machine = (
        r"^machine: .* \d+ CPUs usable, python 3\.\d+\.\d+, conveyor \S+, numpy \S+, torch \S+, torchdata \S+, "
        r"start method \w+; date \d{4}-\d\d-\d\d$"
    )
    assert re.search(machine, out, re.M)
    assert "settings: quick=yes workloads=small,numpy,demo loaders=conveyor,torch,torchdata workers=2 repeats=1 " in out
    assert "verification passed" in out and "FAILED" not in out
    for workload in ("small", "numpy", "demo"):
        check_passing_section(out, workload)
    assert "\ndemo: 24 images 3x32x32 in 4 to 16 .npz shards" in out
    assert "demo dataset: " in out and (tmp_path / "4x6" / "manifest.json").is_file()
    assert "note: torch DataLoader yields torch tensors here (its default_convert)" in out
    assert "conveyor bench: 2 workers: small 24 items, numpy 24 items, demo 24 items" in err  # progress on stderr
    assert re.search(r"^conveyor bench: small run 1/1: conveyor ", err, re.M)

    assert f"written: {saved}" in out
    result = Result.read(saved)
    assert (result.schema, result.suite, result.subject) == (SCHEMA, "conveyor-bench", "conveyor")
    assert result.command.startswith("conveyor bench --workloads small,numpy,demo --loaders conveyor,torch,torchdata ")
    assert (result.settings["workers"], result.settings["quick"], result.settings["items"]) == (2, True, 24)
    assert re.fullmatch(r"[0-9a-f]{40}", result.commit or "") and isinstance(result.dirty, bool)
    assert {"system", "arch", "cpu", "cpus", "python", "start_method"} <= set(result.machine)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT.*", result.date)
    entry = result.entry("demo", "torch")
    assert entry is not None and entry.status == "ok" and {"torch", "numpy", "python"} <= set(entry.versions)
    assert entry.metrics["items"].values == [24] and entry.metrics["delivered"].values == [2]  # a batch per worker
    unavailable = result.entry("small", "torchdata")
    assert unavailable is not None and unavailable.status == ("ok" if torchdata_importable() else "unavailable")


@pytest.mark.timeout(600)
def test_plot_writes_a_png_and_a_result_per_worker_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    pytest.importorskip("torch")
    png, saved = tmp_path / "bench.png", tmp_path / "bench.json"
    code, out, err = bench(
        capsys,
        *("--quick", "--items", "16", "--workloads", "small", "--loaders", "conveyor,torch", "--workers", "1"),
        *("--plot", str(png), "--plot-workers", "0,2", "--out", str(saved)),
    )
    assert code == 0, err
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 1000
    assert f"plot: {png}" in out
    sweep = out.split("throughput by num_workers (items/s, median):", 1)[1]
    assert "| workload | loader" in sweep and "| 0 workers | 1 workers | 2 workers |" in sweep
    assert "small: 16 ints, fn = identity; 1 worker," in out  # the tables are for --workers
    for count, path in [(1, saved), (0, tmp_path / "bench-0-workers.json"), (2, tmp_path / "bench-2-workers.json")]:
        assert f"written: {path}" in out
        result = Result.read(path)
        assert result.settings["workers"] == count and f"--workers {count} " in result.command
        assert [e.status for e in result.entries] == ["ok", "ok"]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workloads", "small,huge"], "unknown workload(s) huge; choose from small,numpy,tensor,cpu,demo"),
        (["--workloads", "small,,numpy"], "without empty entries"),
        (["--loaders", "conveyor,grain"], "unknown loader(s) grain; choose from conveyor,torch,torchdata"),
        (["--workers", "-1"], "argument --workers: must be >= 0, got -1"),
        (["--repeats", "0"], "argument --repeats: must be >= 1, got 0"),
        (["--items", "many"], "argument --items: expected an integer, got 'many'"),
        (["--plot-workers", "0,x"], "argument --plot-workers: expected an integer, got 'x'"),
        (["--cap-seconds", "0"], "argument --cap-seconds: must be > 0"),
        (["--save", "--out", "x.json"], "argument --out: not allowed with argument --save"),
        (["--quick", "--unknown"], "unrecognized arguments: --unknown"),
    ],
)
def test_bad_arguments_are_argparse_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "usage: conveyor" in err and message in err


def test_the_options_name_the_suites_workloads_and_loaders() -> None:
    assert tuple(w.key for w in SUITE.workloads) == options.WORKLOAD_NAMES
    assert tuple(loader.key for loader in SUITE.loaders) == options.LOADER_NAMES


def open_and_tally(loader: str, workload: str, items: int, settings: dict[str, Any]) -> tuple[list[str], Any]:
    """One epoch of ``loader`` on ``workload`` in this process, counted by the workload's
    tally: the problems of the delivery, and the tally's checksum."""
    declared = SUITE.workload(workload)
    context = Context(declared, SUITE.loader(loader), items, settings, warmup=False)
    tally = declared.tally(context)
    open_loader = SUITE.loader(loader).open
    assert open_loader is not None
    opened = open_loader(context)
    try:
        for item in opened.items:
            tally.see(item)
    finally:
        opened.close()
    expected = declared.expected(Context(declared, None, items, settings, warmup=False))
    return check_delivery(tally.summary(), items, expected), tally.checksum()


@pytest.mark.timeout(300)
def test_every_loader_passes_every_workloads_tally(tmp_path: Path) -> None:
    """The same work and the same items from every loader, with and without workers."""
    pytest.importorskip("torch")
    keys = ["conveyor", "torch"] + (["torchdata"] if torchdata_importable() else [])
    prepare_demo(tmp_path, 40)
    for workload in options.WORKLOAD_NAMES:
        items = demo_size(40) if workload == "demo" else 12
        for workers in (0, 2):
            settings = {"workers": workers, "demo_root": str(tmp_path)}
            checksums = set()
            for loader in keys:
                problems, checksum = open_and_tally(loader, workload, items, settings)
                assert problems == [], (workload, workers, loader)
                checksums.add(checksum)
            assert len(checksums) == 1, (workload, workers, checksums)


def test_the_tallies_catch_wrong_items(tmp_path: Path) -> None:
    def problems(workload: str, loader: str, items: list[Any], n: int) -> list[str]:
        declared = SUITE.workload(workload)
        context = Context(declared, SUITE.loader(loader), n, {"demo_root": str(tmp_path)}, warmup=False)
        tally = declared.tally(context)
        for item in items:
            tally.see(item)
        return check_delivery(tally.summary(), n, declared.expected(context))

    assert problems("small", "conveyor", list(range(10)), 10) == []
    assert problems("small", "conveyor", list(range(9)), 10) == [
        "9 item(s) delivered for 10 ids: 1 id(s) never delivered, 0 delivered more than once"
    ]
    assert problems("small", "conveyor", [0, *range(9)], 10)[0].endswith("1 delivered more than once")
    assert problems("small", "conveyor", [float(i) for i in range(10)], 10)[1].startswith(
        "10 malformed item(s): item 1: expected an int, got 0.0"
    )

    arrays = [numpy_mib(i) for i in range(4)]
    assert problems("numpy", "conveyor", arrays, 4) == []
    spoiled = arrays[3].copy()
    spoiled[4096:8192] = 0  # one page, as a reused buffer would spoil it
    assert (
        "item 4: expected every byte 3, its id's fill value, got 'item of id 3'"
        in (problems("numpy", "conveyor", [*arrays[:3], spoiled], 4)[1])
    )
    wrong_type = problems("numpy", "conveyor", [np.zeros(MIB, np.int64), *arrays[1:]], 4)[1]
    assert f"item 1: expected a numpy.ndarray of {MIB} uint8, got 'int64 ({MIB},)'" in wrong_type
    assert "expected a torch.Tensor" in problems("numpy", "torch", arrays, 4)[1]  # torch's default_convert

    pairs = [cpu_heavy(i) for i in range(3)]
    assert problems("cpu", "conveyor", pairs, 3) == []
    assert problems("cpu", "torch", [list(pair) for pair in pairs], 3) == []  # default_convert makes lists
    assert problems("cpu", "conveyor", [*pairs[:2], (2, pairs[2][1] + 1.0)], 3)[0].endswith("some values are wrong")

    prepare_demo(tmp_path, 8)
    from conveyor.tools.demo import build_pipeline

    batch = next(iter(build_pipeline(tmp_path / "4x2")))  # one batch of all 8 images, as conveyor yields it
    assert problems("demo", "conveyor", [batch], 8) == []
    assert problems("demo", "conveyor", [batch, batch], 8)[0].endswith("8 delivered more than once")
    relabelled = (batch[0], (batch[1] + 1) % 10, batch[2])
    assert "the labels of the dataset's images at its indices" in problems("demo", "conveyor", [relabelled], 8)[1]
    assert "expected a batch of Tensors" in problems("demo", "torch", [batch], 8)[1]


@pytest.mark.timeout(300)
def test_a_run_that_delivers_wrong_fails_and_only_required_loaders_set_the_exit_code(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = bench(capsys, "--quick", "--items", "8", "--workloads", "small", "--loaders", "conveyor",
                           "--drop-one", "conveyor")  # fmt: skip
    assert code == 1
    cell = row(table_rows(out, "small"), "conveyor DataLoader2")[-1]
    assert cell.startswith("failed (run 1: 7 item(s) delivered for 8 ids: 1 id(s) never delivered"), cell
    assert "verification FAILED for small (2 workers): conveyor DataLoader2" in out
    assert "small run 1/1: conveyor FAILED" in err

    # torchdata's failures are only reported: a loader not required fails, the exit code stays 0
    pytest.importorskip("torch")
    monkeypatch.setattr(report, "REQUIRED", ("conveyor",))
    code, out, _ = bench(capsys, "--quick", "--items", "8", "--workloads", "small", "--loaders", "conveyor,torch",
                         "--drop-one", "torch")  # fmt: skip
    assert code == 0
    rows = table_rows(out, "small")
    assert row(rows, "conveyor DataLoader2")[-1] == "ok (1 run)"
    assert row(rows, "torch DataLoader")[-1].startswith("failed (run 1: ")
    assert row(rows, "ratio conveyor vs torch DataLoader")[-1] == "torch failed"
    assert "verification passed" in out


def _missing_torch() -> Any:
    raise ModuleNotFoundError("No module named 'torch'")


def _broken_torchdata() -> Any:
    raise RuntimeError("torchdata is broken against this torch")


@pytest.mark.timeout(120)
def test_missing_torch_makes_torch_and_tensor_rows_unavailable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(loaders, "_import_torch", _missing_torch)
    code, out, err = bench(capsys, "--quick", "--items", "8", "--workloads", "small,tensor")
    assert code == 0, err
    small = table_rows(out, "small")
    assert row(small, "conveyor DataLoader2")[-1] == "ok (1 run)"
    assert row(small, "torch DataLoader")[-1] == "unavailable: ModuleNotFoundError: No module named 'torch'"
    assert row(small, "torchdata")[-1].startswith("unavailable: needs torch")
    assert row(small, "ratio conveyor vs torch DataLoader")[-1] == "torch unavailable"
    for cells in table_rows(out, "tensor")[:3]:
        assert (
            cells[-1] == "unavailable: the tensor workload needs torch (ModuleNotFoundError: No module named 'torch')"
        )


@pytest.mark.timeout(120)
def test_broken_torchdata_is_reported_in_its_rows(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    monkeypatch.setattr(loaders, "_import_torchdata", _broken_torchdata)
    code, out, _ = bench(capsys, "--quick", "--items", "8", "--workloads", "small", "--loaders", "conveyor,torchdata")
    assert code == 0
    rows = table_rows(out, "small")
    assert row(rows, "torchdata")[-1] == "unavailable: RuntimeError: torchdata is broken against this torch"
    assert row(rows, "ratio conveyor vs torchdata")[-1] == "torchdata unavailable"


def test_save_needs_a_checkout_and_a_full_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = bench(capsys, "--quick", "--workloads", "small", "--save")
    assert code == 1 and out == ""
    assert "conveyor bench: error: --quick and --items runs are not saved with the results (use --out PATH)" in err
    monkeypatch.setattr(command, "checkout_of", lambda path: None)
    code, out, err = bench(capsys, "--workloads", "small", "--save")
    assert code == 1 and out == ""
    assert "conveyor bench: error: --save writes under benchmarks/results/ of a conveyor checkout" in err


@pytest.mark.timeout(300)
def test_runs_as_a_module_outside_the_checkout(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    done = subprocess.run(
        [sys.executable, "-m", "conveyor.tools.bench", "--quick", "--items", "8", "--workloads", "small",
         "--loaders", "conveyor,torch", "--data-dir", "d", "--out", "r.json", "--cap-seconds", "600"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=280,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "ratio conveyor vs torch" in done.stdout
    assert json.loads((tmp_path / "r.json").read_text())["suite"] == "conveyor-bench"


def test_a_front_end_can_narrow_the_workloads(capsys: pytest.CaptureFixture[str]) -> None:
    """Another front end offers some workloads only (and then no --data-dir, which only the
    demo workload reads)."""
    import argparse

    parser = argparse.ArgumentParser(prog="narrowed")
    options.add_arguments(parser, workloads=("small", "numpy", "tensor"))
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
