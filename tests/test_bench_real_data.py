"""``benchmarks/bench_real_data.py``, run tiny: it exits 0 and prints a row for each loader
of the three workloads and for the bounds of (a) and (c), with the targets as text; its
checks catch items delivered twice, never, or wrong, the bounds' tallies included. Timings
are never asserted."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch

from bench_helpers import loaded_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_real_data.py"
NUMBER = r"[\d,]+(\.\d)?"
ROWS = {
    "(a) images": ("conveyor", r"webdataset \S+ WebLoader", r"torch \S+ DataLoader"),
    "(b) parquet": ("conveyor", r"datasets \S+ \+ torch DataLoader"),
    "(c) s3": ("conveyor threadpool_map, 16 threads", "conveyor map"),
}
BOUNDS = {
    "(a) images": re.escape("no loader: the work alone in 2 processes (bound)"),
    "(c) s3": re.escape("ThreadPoolExecutor(16), no loader (bound)"),
}
SHARE = r"\d+%, \d+%"  # a loader row's items/s and CPU/item over its bound's


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    with loaded_script(SCRIPT) as module:
        yield module


def row_cells(out: str, workload: str, loader: str) -> list[str]:
    found = re.search(rf"^\| {re.escape(workload)} \| {loader} \| (.*) \|$", out, re.M)
    assert found, (workload, loader, out)
    return [cell.strip() for cell in found.group(1).split("|")]


def run_script(arguments: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """The script's run, in a session of its own: if it overruns, its whole process group
    (moto's server, its helpers) is killed with it, not only the script's process."""
    env = {**os.environ, "TMPDIR": str(cwd)}  # its data, and Hugging Face's cache, go here
    command = [sys.executable, str(SCRIPT), *arguments]
    process = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    return subprocess.CompletedProcess(command, process.returncode, out, err)


@pytest.mark.timeout(150)
def test_script_reports_the_three_workloads(tmp_path: Path) -> None:
    done = run_script(["--scale", "0.005", "--repeats", "1"], tmp_path, timeout=140)
    out = done.stdout
    assert done.returncode == 0, done.stderr
    assert re.search(r"^machine: .*, start method \w+; date \d{4}-\d\d-\d\d$", out, re.M)
    assert "settings: workloads=images,parquet,s3 workers=2 repeats=1 scale=0.005;" in out
    for workload, (subject, *others) in ROWS.items():
        share = SHARE if workload in BOUNDS else ""
        cells = row_cells(out, workload, subject)  # items/s, CPU, first batch, runs ok, share, then no ratios
        assert all(re.fullmatch(NUMBER, cells[i]) for i in (0, 1, 2)) and cells[3] == "1/1", cells
        assert re.fullmatch(share, cells[4]) and cells[5:] == ["", "", "", ""], cells
        for other in others:
            cells = row_cells(out, workload, other)
            assert all(re.fullmatch(NUMBER, cells[i]) for i in (0, 1, 2)) and cells[3] == "1/1", cells
            assert re.fullmatch(share, cells[4]), cells
            assert all(re.fullmatch(r"\d+\.\d\dx", cells[i]) for i in (5, 6)), cells  # the ratios
            assert re.fullmatch(r"items/s >= [\d.]+x(, CPU/item <= [\d.]+x)?", cells[7]), cells
            assert re.fullmatch(r"(yes|no) \(.*\)", cells[8]), cells  # reported, never asserted
    for workload, bound in BOUNDS.items():  # measured and checked like the loaders; compared with nothing
        cells = row_cells(out, workload, bound)
        assert all(re.fullmatch(NUMBER, cells[i]) for i in (0, 1, 2)) and cells[3] == "1/1", cells
        assert cells[4:] == ["", "", "", "", ""], cells
    assert not re.search(r"^\| \(b\) parquet \| .*\(bound\)", out, re.M)
    needs = out.split("\nthe targets against the bound (the same work without a loader):\n", 1)[1].splitlines()
    percent = r"[\d,]+%"
    assert re.fullmatch(rf"\(a\) bound: {NUMBER} items/s, {NUMBER} µs CPU/item", needs[0]), needs
    for line, peer in zip(needs[1:3], ROWS["(a) images"][1:], strict=True):
        a_need = rf"\(a\) 1.5x {peer}'s rate is {NUMBER} items/s = {percent} of the bound; 0.7x its CPU/item is "
        assert re.fullmatch(rf"{a_need}{NUMBER} µs = {percent} of the bound's", line), line
    assert re.fullmatch(rf"\(c\) bound: {NUMBER} items/s, {NUMBER} µs CPU/item", needs[3]), needs
    assert re.fullmatch(rf"\(c\) 10x conveyor map's rate is {NUMBER} items/s = {percent} of the bound", needs[4])
    assert needs[5] == "targets:", needs
    targets = out.split("\ntargets:\n", 1)[1].splitlines()
    assert re.fullmatch(r"\(a\) conveyor: items/s >= 1.5x, CPU/item <= 0.7x of .*: (yes|no) \(.*\)", targets[0])
    assert re.fullmatch(r"\(b\) conveyor: items/s >= 2x of .*: (yes|no) \(.*\)", targets[1])
    assert re.fullmatch(r"\(c\) conveyor threadpool_map, 16 threads: items/s >= 10x of .*: (yes|no) \(.*\)", targets[2])
    for loader in ("conveyor map", re.escape("ThreadPoolExecutor(16), no loader (bound)")):
        assert re.search(rf"^\(c\) {loader}: the S3 server used {NUMBER} µs of CPU per item besides", out, re.M)
    assert out.rstrip().splitlines()[-1] == "verification passed for every run"
    assert not list(tmp_path.glob("bench_real_data-*")), "its data stays behind"


def image_batch(bench: ModuleType, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    crops = [bench.crop(bench.decode_jpeg(bench.encode_image(i)[0]), i) for i in indices]
    index = torch.tensor(indices)
    return torch.from_numpy(np.stack(crops)), index % bench.CLASSES, index


def test_the_image_check_catches_items_repeated_missing_or_wrong(bench: ModuleType) -> None:
    expected = np.array([bench.encode_image(i)[1] for i in range(3)])
    check = bench.ImageCheck(3, expected)
    check.see(image_batch(bench, [0, 1, 2]))
    check.finish()  # every item once

    check = bench.ImageCheck(3, expected)
    check.see(image_batch(bench, [0, 1, 1]))
    with pytest.raises(bench.CheckFailed, match=re.escape("1 item(s) never delivered, 1 delivered more than once")):
        check.finish()

    images, labels, indices = image_batch(bench, [0, 1, 2])
    images[1, 0, 0, 0] += 1  # on the fingerprint's grid
    labels[2] += 1
    check = bench.ImageCheck(3, expected)
    check.see((images, labels, indices))
    with pytest.raises(bench.CheckFailed, match=r"labels do not match the keys; .*image content differs"):
        check.finish()

    check = bench.ImageCheck(3, expected)
    check.see((images.numpy(), labels, indices))
    with pytest.raises(bench.CheckFailed, match=re.escape("images: ndarray uint8, not a torch.uint8 tensor")):
        check.finish()


def test_the_image_check_counts_the_bound_processes_tallies(bench: ModuleType) -> None:
    expected = np.array([bench.encode_image(i)[1] for i in range(4)])

    def tally(indices: list[int]) -> Any:  # one process's batch, checked and tallied there
        check = bench.ImageCheck(4, expected)
        check.see(image_batch(bench, indices))
        return check.tally(first_at=0.0)

    check = bench.ImageCheck(4, expected)
    assert bench.read_epoch([tally([0, 2]), tally([1, 3])], check, 0.0) == 0.0
    check.finish()  # every item once, over both processes

    images, labels, indices = image_batch(bench, [0, 1])
    images[0, 0, 0, 0] += 1
    wrong = bench.ImageCheck(4, expected)
    wrong.see((images, labels, indices))
    check = bench.ImageCheck(4, expected)
    bench.read_epoch([wrong.tally(first_at=0.0), tally([1, 3])], check, 0.0)
    message = "batch 1: image content differs from the written images' crops; "
    message += "1 item(s) never delivered, 1 delivered more than once (of 4)"
    with pytest.raises(bench.CheckFailed, match=re.escape(message)):
        check.finish()


def rows(ids: list[int], names: list[str] | None = None) -> dict[str, Any]:
    index = torch.tensor(ids)
    return {"id": index, "x": index.double() / 2, "label": index % 10, "name": names or [f"row{i}" for i in ids]}


def test_the_row_check_catches_rows_missing_wrong_or_in_short_batches(bench: ModuleType, monkeypatch: Any) -> None:
    monkeypatch.setattr(bench.RowCheck, "batch_size", 2)
    check = bench.RowCheck(4)
    for batch in ([0, 1], [2, 3]):
        check.see(rows(batch))
    check.finish()

    check = bench.RowCheck(4)
    check.see(rows([0, 1]))
    check.see(rows([3], ["row4"]))
    message = "batch 2: name does not match the ids; 1 item(s) never delivered"
    with pytest.raises(bench.CheckFailed, match=re.escape(message)):
        check.finish()

    check = bench.RowCheck(4)
    for batch in ([0], [1], [2], [3]):  # more short batches than workers
        check.see(rows(batch))
    with pytest.raises(bench.CheckFailed, match="4 batches of fewer than 2 items, more than one per worker"):
        check.finish()


def test_the_object_check_catches_objects_repeated_missing_or_wrong(bench: ModuleType) -> None:
    check = bench.ObjectCheck(2)
    for index in (1, 0):
        check.see(bench.object_bytes(index))
    check.finish()

    check = bench.ObjectCheck(3)
    for index in (0, 0, 5):
        check.see(bench.object_bytes(index))
    message = "indices outside 0..2: [5]; 2 item(s) never delivered, 1 delivered more than once (of 3)"
    with pytest.raises(bench.CheckFailed, match=re.escape(message)):
        check.finish()

    check = bench.ObjectCheck(1)
    check.see(bench.object_bytes(0)[:-1] + b"!")
    check.see(b"short")
    message = "object 0's bytes differ; batch 2: 5 bytes starting b'short', not an object"
    with pytest.raises(bench.CheckFailed, match=re.escape(message)):
        check.finish()


def test_arguments_are_validated(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in [
        (["--workloads", "images,huge"], "unknown workload(s) huge; choose from images,parquet,s3"),
        (["--repeats", "0"], "--repeats must be >= 1, got 0"),
        (["--scale", "0"], "--scale must be > 0, got 0.0"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            bench.main(argv)
        assert exit_info.value.code == 2, argv
        assert message in capsys.readouterr().err, argv
