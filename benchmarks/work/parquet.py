"""The Parquet workload of ``bench_real_data.py``: a table of ``id`` int64, ``x = id / 2``
float64, ``label = id % 10`` int64 and ``name = f"row{id}"`` string, read as batches of
1,024 rows, each a dict of column -> tensor (``name``: a list of str); and the check of
every batch against its ids."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from conveyor.tools.bench.harness.tally import Tally
from work.images import tensor_of

ROW_BATCH = 1024


def row_name(row_id: int) -> str:
    return f"row{row_id}"


def write_table(path: Path, groups: int, group_rows: int) -> dict[str, Any]:
    """A Parquet file of ``groups`` row groups of ``group_rows`` rows (see the module)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    ids = np.arange(groups * group_rows, dtype=np.int64)
    table = pa.table({"id": ids, "x": ids * 0.5, "label": ids % 10, "name": [row_name(i) for i in range(len(ids))]})
    pq.write_table(table, path, row_group_size=group_rows)
    return {"sources": [str(path)], "items": len(ids), "groups": groups}


def as_tensors(batch: dict[str, np.ndarray]) -> dict[str, Any]:
    """A batch of conveyor's ``load_parquet`` as torch's ``default_collate`` gives rows:
    numbers as tensors (copies: pyarrow's arrays are read-only), strings as a list."""
    import torch

    return {name: torch.from_numpy(v.copy()) if v.dtype.kind in "biuf" else v.tolist() for name, v in batch.items()}


class RowTally(Tally):
    """``{"id", "x", "label": tensor, "name": list}`` batches of up to 1,024 rows."""

    def see(self, batch: Any) -> None:
        import torch

        self.count += 1
        if not isinstance(batch, Mapping) or set(batch) != {"id", "x", "label", "name"}:
            self.wrong(batch, "a dict of id, x, label and name")
            return
        ids, x, labels = (
            tensor_of(batch[k], t) for k, t in (("id", torch.int64), ("x", torch.float64), ("label", torch.int64))
        )
        names = batch["name"]
        if (
            ids is None
            or x is None
            or labels is None
            or not isinstance(names, list)
            or not len(names) == len(ids) == len(x) == len(labels)
        ):
            self.wrong(batch, "int64 id, float64 x, int64 label tensors and a list of names, of one length")
            return
        if not (np.array_equal(x, ids * 0.5) and np.array_equal(labels, ids % 10)):
            self.wrong(f"batch {self.count}", "x and label matching the ids")
        if len(ids) and (names[0] != row_name(ids[0]) or names[-1] != row_name(ids[-1])):
            self.wrong(f"batch {self.count}", "names matching the ids")
        self.ids(ids.tolist())
