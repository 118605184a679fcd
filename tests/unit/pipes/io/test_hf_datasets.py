"""A Hugging Face ``datasets.Dataset`` as a random-access source: given to ``DataLoader2``
as it is, split by index between workers (each row read once, by one worker), composed
with map-style ops, resumed at every cut, and refused for a state of another table."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pytest

from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.errors import StateError
from conveyor.pipes import HuggingFaceDataset
from resume_checks import check_resume_at_every_cut, json_state

pytestmark = pytest.mark.timeout(120)

ROWS = 40


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))


def table(rows: int = ROWS) -> datasets.Dataset:
    return datasets.Dataset.from_dict({"id": list(range(rows)), "text": [f"row {i}" for i in range(rows)]})


def test_dataloader2_reads_a_dataset_as_given() -> None:
    assert list(DataLoader2(table())) == [{"id": i, "text": f"row {i}"} for i in range(ROWS)]
    pipe = HuggingFaceDataset(table())
    assert len(pipe) == ROWS and pipe[-1] == {"id": ROWS - 1, "text": f"row {ROWS - 1}"}
    with pytest.raises(IndexError, match="out of range"):
        pipe[ROWS]
    with pytest.raises(TypeError, match="int indices"):
        pipe["id"]  # type: ignore[index]
    with pytest.raises(TypeError, match=r"takes a datasets\.Dataset, got list"):
        HuggingFaceDataset([1, 2])


class LoggedReads:
    """A transform the dataset applies to the rows it reads: logs the reading process."""

    def __init__(self, log: str) -> None:
        self.log = log

    def __call__(self, batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        with open(self.log, "a") as out:
            out.write("".join(f"{os.getpid()} {i}\n" for i in batch["id"]))
        return batch


def test_workers_each_read_only_their_own_rows(tmp_path: Path) -> None:
    """From the dataset's files (memory-mapped), as training jobs load them."""
    table().save_to_disk(str(tmp_path / "saved"))
    log = str(tmp_path / "reads")
    loaded = datasets.load_from_disk(str(tmp_path / "saved")).with_transform(LoggedReads(log))
    loader = DataLoader2(loaded, reading_service=MultiProcessingReadingService(num_workers=2))
    try:
        rows = list(loader)
    finally:
        loader.shutdown()
    assert [row["id"] for row in rows] == list(range(ROWS))
    reads = [line.split() for line in Path(log).read_text().splitlines()]
    assert sorted(int(index) for _, index in reads) == list(range(ROWS))  # each row read once
    by_worker: dict[str, set[int]] = {}
    for pid, index in reads:
        by_worker.setdefault(pid, set()).add(int(index))
    assert len(by_worker) == 2 and str(os.getpid()) not in by_worker
    assert sorted(min(indices) % 2 for indices in by_worker.values()) == [0, 1]  # split by index


def test_map_style_ops_compose_and_resume_at_every_cut() -> None:
    data = table(12).with_format("numpy")

    def make() -> Any:
        return HuggingFaceDataset(data).shuffle().map(lambda row: int(row["id"]) * 10)

    check_resume_at_every_cut(make, seed=2, cut_epochs=(0, 1))
    first = DataLoader2(make())
    first.seed(2)
    epoch = list(first)
    assert sorted(epoch) == [10 * i for i in range(12)] and epoch != sorted(epoch)
    assert isinstance(HuggingFaceDataset(data)[0]["id"], np.integer)


def test_a_state_over_one_table_is_refused_over_another() -> None:
    loader = DataLoader2(table())
    it = iter(loader)
    next(it)
    state = json_state(loader)
    loader.shutdown()
    edited = table().map(lambda row: {"text": row["text"].upper()})
    with pytest.raises(StateError, match="another pipeline"):
        DataLoader2(edited).load_state_dict(state)
    resumed = DataLoader2(table())
    resumed.load_state_dict(state)
    assert [row["id"] for row in resumed] == list(range(1, ROWS))


def row_id(row: dict[str, Any]) -> int:
    return int(row["id"])


class ShardRows:
    """An adapter that shards the rows again after the loader's own split of the dataset."""

    def __call__(self, graph: Any) -> Any:
        return graph.map(row_id).sharding_filter()


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_a_dataset_sharded_downstream_gives_every_row_once_in_order(workers: int) -> None:
    """The user's ``sharding_filter()`` splits the rows, as one process reads them;
    ``DataLoader2``'s own split of the dataset by index yields to it."""
    graphs = [
        (table(), ShardRows()),
        (HuggingFaceDataset(table()).to_iter_datapipe().sharding_filter().map(row_id), None),
        (HuggingFaceDataset(table()).to_iter_datapipe().map(row_id).sharding_filter(), None),
    ]
    for graph, adapter in graphs:
        service = MultiProcessingReadingService(num_workers=workers, multiprocessing_context="fork")
        loader = DataLoader2(graph, datapipe_adapter_fn=adapter, reading_service=service)
        try:
            assert list(loader) == list(range(ROWS))
        finally:
            loader.shutdown()
