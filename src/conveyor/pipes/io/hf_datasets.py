"""Hugging Face ``datasets`` tables as random-access sources.

A ``datasets.Dataset`` (an Arrow table, memory-mapped from its cache files) is read by
index like any :class:`~conveyor.core.base.MapDataPipe`: ``DataLoader2(dataset)`` splits
its indices between ranks and workers, each worker reading only its own rows, and any
map-style op composes with it (``HuggingFaceDataset(dataset).shuffle().map(f)``). Rows
come as the dataset formats them (dicts of Python values, or arrays after
``dataset.with_format("numpy")``).

``datasets`` is not imported here: a dataset is recognised only when the caller's process
has imported it already (it must have, to make one).
"""

from __future__ import annotations

import sys
from typing import Any

from conveyor.core.base import MapDataPipe


def is_hf_dataset(obj: Any) -> bool:
    """Whether ``obj`` is a Hugging Face ``datasets.Dataset`` (random access; its streaming
    ``IterableDataset`` is not one)."""
    dataset_type = getattr(sys.modules.get("datasets"), "Dataset", None)
    return isinstance(dataset_type, type) and isinstance(obj, dataset_type)


class HuggingFaceDataset(MapDataPipe):
    """A ``datasets.Dataset`` as a random-access pipe: ``pipe[i]`` is ``dataset[i]`` for
    ``0 <= i < len(dataset)`` (negative indices count from the end).

    The dataset's own fingerprint (which ``datasets`` derives from its data and every
    transform applied) is part of the pipe's description, so a state saved over one
    table is refused over another.

    Args:
        dataset: A ``datasets.Dataset`` (map-style, with a length).
    """

    _params = ("num_rows", "column_names", "fingerprint")

    def __init__(self, dataset: Any):
        if not is_hf_dataset(dataset):
            raise TypeError(
                f"HuggingFaceDataset takes a datasets.Dataset, got {type(dataset).__name__} (a streaming "
                "IterableDataset is a torch IterableDataset: pass it to DataLoader2 as it is)"
            )
        self._dataset = dataset
        self.num_rows = len(dataset)
        self.column_names = list(dataset.column_names)
        self.fingerprint = getattr(dataset, "_fingerprint", None)

    def __getitem__(self, index: int) -> Any:
        if isinstance(index, bool) or not isinstance(index, int):
            raise TypeError(f"{self!r} takes int indices, got {type(index).__name__}")
        position = index + self.num_rows if index < 0 else index
        if not 0 <= position < self.num_rows:
            raise IndexError(f"index {index} out of range for {self!r} of length {self.num_rows}")
        return self._dataset[position]

    def __len__(self) -> int:
        return self.num_rows
