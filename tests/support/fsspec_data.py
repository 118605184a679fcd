"""Parquet files written to, and read from, fsspec URLs (``memory://``, ``s3://``)."""

from __future__ import annotations

from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from conveyor.pipes import IterableWrapper


def write_parquet_to(url: str, first_id: int, rows: int = 12, **options: Any) -> list[int]:
    ids = list(range(first_id, first_id + rows))
    with fsspec.open(url, "wb", **options) as out:
        pq.write_table(pa.table({"id": ids, "half": [i / 2 for i in ids]}), out, row_group_size=5)
    return ids


def parquet_ids(urls: list[str], **options: Any) -> Any:
    return IterableWrapper(urls).load_parquet(columns=["id"], **options).map(lambda row: int(row["id"]))
