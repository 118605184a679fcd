"""``benchmarks/bench_real_data.py`` through its ``main()``, run tiny: a row for each loader
and bound of the four workloads (thread workers and worker processes among them), the
targets as text, its data removed at the end; its tallies catch items delivered twice,
never, or wrong, the bounds' merged tallies included. Timings are never asserted."""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch

from bench_helpers import suite, suite_rows

NUMBER = r"[\d,]+(\.\d)?"
ROWS = {
    "images": (
        "conveyor",
        "conveyor, thread workers",
        "webdataset WebLoader",
        "torch DataLoader",
        "no loader: the work alone (bound)",
        "no loader: the work in 2 threads (bound)",
        "no loader: conveyor's graph in 2 threads (bound)",
        "no loader: the work in the run's thread",
    ),
    "startup": ("conveyor", "conveyor, thread workers", "torch DataLoader"),
    "parquet": ("conveyor", "Hugging Face datasets + torch DataLoader"),
    "s3": ("conveyor", "conveyor map (no threads)", "no loader: the work alone (bound)"),
}


@pytest.fixture
def bench() -> Iterator[ModuleType]:
    with suite("bench_real_data") as module:
        yield module


def quick_run(bench: ModuleType, workloads: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """The suite's quick run of ``workloads``: its output, after checking every row."""
    assert bench.main(["--quick", "--workloads", workloads]) == 0
    out = capsys.readouterr().out
    rows = suite_rows(out)
    names = workloads.split(",")
    assert list(rows) == [(workload, label) for workload in names for label in ROWS[workload]]
    for (workload, label), cells in rows.items():
        columns = ("items/s", "CPU µs/item", "first item ms", "peak PSS MiB", "peak RSS MiB")
        assert all(re.fullmatch(NUMBER, cells[c]) for c in columns), (workload, label, cells)
        ratio = cells["conveyor's items/s ÷ this"]
        assert ratio == "" if label == "conveyor" else re.fullmatch(r"\d+\.\d\dx", ratio), (workload, label, cells)
        assert cells["runs ok"] == "1/1"
    assert out.rstrip().splitlines()[-1] == "verification passed: every run delivered every item as it should"
    assert not list(tmp_path.glob("bench_real_data-*")), "its data stays behind"
    return out


@pytest.mark.timeout(420)
def test_quick_run_reports_every_loader_of_the_images(
    bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # its data goes here
    out = quick_run(bench, "images", tmp_path, capsys)
    for target in (
        r"images: conveyor's items/s over webdataset's >= 1.5x",
        r"images: conveyor's CPU per item over torch's <= 0.7x",
        r"images: how much sooner thread workers' first batch comes than worker processes' >= 10x",
        r"images: thread workers' peak RSS over worker processes' <= 0.333x",
        r"images: thread workers' items/s over worker processes' >= 0.9x",
    ):
        assert re.search(rf"^- target: {target}: [\d.]+x, (held|missed)$", out, re.M), target
    assert re.search(r"^- images: torch makes \d+% of the bound's items/s at \d+% of its CPU per item$", out, re.M)


@pytest.mark.timeout(420)
def test_quick_run_reports_the_start_up_the_table_and_the_objects(
    bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # its data, and Hugging Face's cache, go here
    out = quick_run(bench, "startup,parquet,s3", tmp_path, capsys)
    for target in (
        r"parquet: conveyor's items/s over Hugging Face's >= 2x",
        r"s3: threadpool_map's items/s over map's >= 10x",
    ):
        assert re.search(rf"^- target: {target}: [\d.]+x, (held|missed)$", out, re.M), target
    assert re.search(rf"^- s3: the server used {NUMBER} µs of CPU per object under conveyor-map", out, re.M)


def image_batch(indices: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from work import images

    crops = [images.crop(images.decode_jpeg(images.encode_image(i)[0]), i) for i in indices]
    index = torch.tensor(indices)
    return torch.from_numpy(np.stack(crops)), index % images.CLASSES, index


def problems(tally: Any, n: int) -> list[str]:
    from conveyor.tools.bench.harness.tally import check_delivery

    return check_delivery(tally.summary(), n, None)


def test_the_image_tally_catches_items_repeated_missing_or_wrong(bench: ModuleType) -> None:
    from work import images

    expected = np.array([images.encode_image(i)[1] for i in range(3)])
    tally = images.ImageTally(3, expected, workers=2)
    tally.see(image_batch([0, 1, 2]))
    assert problems(tally, 3) == []  # every item once

    tally = images.ImageTally(3, expected, workers=2)
    tally.see(image_batch([0, 1, 1]))
    assert "1 id(s) never delivered, 1 delivered more than once" in problems(tally, 3)[0]

    crops, labels, indices = image_batch([0, 1, 2])
    crops[1, 0, 0, 0] += 1  # on the fingerprint's grid
    tally = images.ImageTally(3, expected, workers=2)
    tally.see((crops, labels, indices))
    labels[2] += 1
    tally.see((crops, labels, indices))
    assert "expected the written images' crops" in problems(tally, 3)[-1]
    assert "expected labels matching the keys" in problems(tally, 3)[-1]

    tally = images.ImageTally(3, expected, workers=2)
    tally.see((crops.numpy(), labels, indices))
    assert "expected uint8 images and int64 labels and indices as tensors" in problems(tally, 3)[-1]

    expected = np.array([images.encode_image(i)[1] for i in range(4)])
    tally = images.ImageTally(4, expected, workers=1)
    for i in range(4):  # four short batches: more than one per worker
        tally.see(image_batch([i]))
    assert "4 batches of fewer than 32" in problems(tally, 4)[-1]


def test_the_bounds_tallies_merge_into_one_check(bench: ModuleType) -> None:
    from work import images

    expected = np.array([images.encode_image(i)[1] for i in range(4)])
    halves = [images.ImageTally(4, expected, workers=2) for _ in range(2)]
    halves[0].see(image_batch([0, 2]))
    halves[1].see(image_batch([1, 3]))
    merged = images.ImageTally(4, expected, workers=2)
    for half in halves:
        merged.merge(half)
    assert problems(merged, 4) == [] and merged.batches == 2

    merged = images.ImageTally(4, expected, workers=2)
    for half in (halves[0], halves[0]):
        merged.merge(half)
    assert "2 id(s) never delivered, 2 delivered more than once" in problems(merged, 4)[0]


def rows(ids: list[int], names: list[str] | None = None) -> dict[str, Any]:
    index = torch.tensor(ids)
    return {"id": index, "x": index.double() / 2, "label": index % 10, "name": names or [f"row{i}" for i in ids]}


def test_the_row_and_object_tallies_catch_what_is_wrong(bench: ModuleType) -> None:
    from work.parquet import RowTally
    from work.s3 import OBJECT_BYTES, ObjectTally, object_bytes

    tally = RowTally(4)
    for batch in ([0, 1], [2, 3]):
        tally.see(rows(batch))
    assert problems(tally, 4) == []

    tally = RowTally(4)
    tally.see(rows([0, 1]))
    tally.see(rows([3], ["row4"]))
    found = problems(tally, 4)
    assert "1 id(s) never delivered" in found[0] and "expected names matching the ids" in found[1]

    tally = ObjectTally(3)
    for index in (0, 0, 2):
        tally.see(object_bytes(index))
    assert "1 id(s) never delivered, 1 delivered more than once" in problems(tally, 3)[0]
    tally = ObjectTally(1)
    tally.see(object_bytes(0)[:-1] + b"!")
    tally.see(b"short")
    found = problems(tally, 1)
    assert "expected its bytes" in found[-1] and f"expected an object of {OBJECT_BYTES} bytes" in found[-1]


def test_arguments_are_validated(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in [
        (["--workloads", "images,huge"], "--workloads: unknown or none: 'huge'; choose from images,startup,parquet,s3"),
        (["--repeats", "0"], "--repeats must be >= 1, got 0"),
        (["--items", "0"], "--items must be >= 1, got 0"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            bench.main(argv)
        assert exit_info.value.code == 2, argv
        assert message in capsys.readouterr().err, argv
