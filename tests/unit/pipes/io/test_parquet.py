"""``load_parquet``: rows and batches of Parquet files through pyarrow, split between
workers by row group (each reads only its own), resumable inside a row group."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.pipes import FileLister, FileOpener, IterableWrapper, ParquetLoader
from resume_checks import check_resume_at_every_cut

pytestmark = pytest.mark.timeout(120)


def write_files(root: Path, files: int = 3, rows: int = 10, group: int = 4) -> list[dict[str, Any]]:
    everything = []
    for f in range(files):
        ids = list(range(f * rows, (f + 1) * rows))
        table = pa.table({"id": ids, "name": [f"n{i}" for i in ids], "x": [i / 2 for i in ids]})
        pq.write_table(table, root / f"part-{f}.parquet", row_group_size=group)
        everything += [{"id": i, "name": f"n{i}", "x": i / 2} for i in ids]
    return everything


def plain(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v.item() if isinstance(v, np.generic) else v for k, v in row.items()}


def test_rows_come_in_file_and_row_order(tmp_path: Path) -> None:
    expected = write_files(tmp_path)
    pipe = FileLister(str(tmp_path), "*.parquet").load_parquet()
    assert isinstance(pipe, ParquetLoader)
    assert [plain(r) for r in pipe] == expected


def test_columns_and_batches(tmp_path: Path) -> None:
    write_files(tmp_path, files=1)
    pipe = FileLister(str(tmp_path), "*.parquet").load_parquet(columns=["id"], batch_rows=3)
    batches = list(pipe)
    assert [sorted(b) for b in batches] == [["id"]] * len(batches)
    assert [b["id"].tolist() for b in batches] == [[0, 1, 2], [3], [4, 5, 6], [7], [8, 9]]  # within row groups
    assert all(isinstance(b["id"], np.ndarray) for b in batches)


def test_path_and_stream_pairs_are_read_by_path(tmp_path: Path) -> None:
    expected = write_files(tmp_path, files=1)
    pipe = FileOpener(FileLister(str(tmp_path), "*.parquet"), mode="b").load_parquet()
    assert [plain(r) for r in pipe] == expected


def test_a_missing_column_names_the_file(tmp_path: Path) -> None:
    write_files(tmp_path, files=1)
    with pytest.raises(KeyError, match=r"part-0\.parquet.* no column 'nope'"):
        list(FileLister(str(tmp_path), "*.parquet").load_parquet(columns=["nope"]))
    with pytest.raises(TypeError, match="list of column names"):
        IterableWrapper([]).load_parquet(columns="id")


@pytest.mark.parametrize("batch_rows", [None, 3])
def test_it_resumes_at_every_cut(tmp_path: Path, batch_rows: int | None) -> None:
    write_files(tmp_path, files=2, rows=7, group=3)
    root = str(tmp_path)
    check_resume_at_every_cut(
        lambda: FileLister(root, "*.parquet").load_parquet(batch_rows=batch_rows).map(as_lists), seed=1, cut_epochs=(0,)
    )


def as_lists(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v.tolist() if isinstance(v, (np.ndarray, np.generic)) else v for k, v in row.items()}


def test_workers_read_only_their_own_row_groups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each row group is read once in all, by the worker it belongs to (the workers fork
    after the read is patched to log to a file)."""
    expected = write_files(tmp_path, files=3, rows=10, group=4)  # 3 row groups per file: 9 in all
    log = tmp_path / "reads.log"
    real = pq.ParquetFile.read_row_group

    def logged(self: pq.ParquetFile, group: int, *args: Any, **kwargs: Any) -> Any:
        with open(log, "a") as out:
            out.write(f"{os.getpid()} {group}\n")
        return real(self, group, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", logged)
    graph = FileLister(str(tmp_path), "*.parquet").load_parquet().map(as_lists)
    loader = DataLoader2(graph, reading_service=MultiProcessingReadingService(2, multiprocessing_context="fork"))
    try:
        rows = list(loader)
    finally:
        loader.shutdown()
    assert sorted(r["id"] for r in rows) == [r["id"] for r in expected]
    reads = [line.split() for line in log.read_text().splitlines()]
    assert len(reads) == 9  # every row group once
    assert len({pid for pid, _ in reads}) == 2


def test_files_split_before_it_are_read_whole(tmp_path: Path) -> None:
    expected = write_files(tmp_path, files=4)
    graph = FileLister(str(tmp_path), "*.parquet").sharding_filter().load_parquet().map(as_lists)
    loader = DataLoader2(graph, reading_service=MultiProcessingReadingService(2))
    try:
        rows = list(loader)
    finally:
        loader.shutdown()
    assert sorted(r["id"] for r in rows) == [r["id"] for r in expected]


def row_id(row: dict[str, Any]) -> int:
    return int(row["id"])


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_rows_sharded_after_loading_come_once_in_order_for_any_workers(
    tmp_path: Path, workers: int, start_method: str
) -> None:
    """torchdata's way (read rows, then shard them): the user's ``sharding_filter()`` splits
    the rows and ``load_parquet``'s own split of row groups yields to it, so every row
    comes once, in the order of one process (the merge follows the user's point)."""
    expected = write_files(tmp_path, files=3, rows=10, group=4)
    graph = FileLister(str(tmp_path), masks="*.parquet").load_parquet().sharding_filter().map(row_id)
    service = MultiProcessingReadingService(num_workers=workers, multiprocessing_context=start_method)
    loader = DataLoader2(graph, reading_service=service)
    try:
        rows = list(loader)
    finally:
        loader.shutdown()
    assert rows == [row["id"] for row in expected]
