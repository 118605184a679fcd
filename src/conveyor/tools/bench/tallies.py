"""How a run of ``conveyor bench`` counts what a loader delivered: one tally per workload,
each item checked as it arrives (cheaply: the check is in the timed epoch, the same for
every loader), and its id counted, so that the harness finds any item missing, repeated,
malformed or wrong.

A loader's items are what it makes of the workload's: torch's ``DataLoader`` converts
numpy arrays to tensors (its ``default_convert``, even with ``batch_size=None``) and
collates the demo's batches into tensors, so each tally expects the type the run's loader
yields.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from conveyor.tools.bench.demo_data import DEMO_BATCH_SIZE, demo_dir, demo_labels
from conveyor.tools.bench.harness.declare import Context
from conveyor.tools.bench.harness.tally import PairTally, Tally
from conveyor.tools.bench.per_item import FILL_MODULUS, ID_BYTES, MIB

#: Bytes of a 1 MiB item compared with its fill value: one per page, and the last.
PAGE = 4096


def _tensor_type() -> type[Any]:
    import torch

    return torch.Tensor


def yields_tensors(context: Context, kind: str) -> bool:
    """Whether the run's loader yields tensors for a workload of ``kind`` items."""
    loader = context.loader.key if context.loader is not None else ""
    if kind == "tensor":
        return True
    if kind == "batch":  # torch's default_collate
        return loader != "conveyor"
    return loader == "torch"  # its default_convert


class ArrayTally(Tally):
    """``numpy`` and ``tensor``: each item a 1 MiB uint8 array (or tensor) whose first
    bytes name its id and whose other bytes are the id's fill value (one per page and the
    last are compared)."""

    def __init__(self, n: int, tensors: bool) -> None:
        super().__init__(n)
        self.type: type[Any] = _tensor_type() if tensors else np.ndarray
        self.expected = f"a {self.type.__module__}.{self.type.__name__} of {MIB} uint8"

    def see(self, item: Any) -> None:
        self.count += 1
        if not isinstance(item, self.type):
            self.wrong(type(item).__name__, self.expected)
            return
        array = np.asarray(item)
        if array.dtype != np.uint8 or array.shape != (MIB,):
            self.wrong(f"{array.dtype} {array.shape}", self.expected)
            return
        i = int(array[:ID_BYTES].view(np.int64)[0])
        fill = i % FILL_MODULUS
        if not (np.all(array[ID_BYTES::PAGE] == fill) and array[-1] == fill):
            self.wrong(f"item of id {i}", f"every byte {fill}, its id's fill value")
            return
        self.id(i)


class DemoTally(Tally):
    """``demo``: each item a batch ``(images, labels, index)``, of ``1 ..`` :data:`DEMO_BATCH_SIZE`
    images of float32 ``(3, 32, 32)``, int64 labels and indices, every label the dataset's
    for its index; the indices are the ids. Augmented pixels are not compared: each
    loader draws its own random numbers."""

    def __init__(self, n: int, labels: np.ndarray, tensors: bool) -> None:
        super().__init__(n)
        self.labels = labels
        self.type: type[Any] = _tensor_type() if tensors else np.ndarray

    def _problem(self, batch: Any) -> str | None:
        if not isinstance(batch, tuple | list) or len(batch) != 3:
            return "a batch (images, labels, index)"
        if not all(isinstance(part, self.type) for part in batch):
            return f"a batch of {self.type.__name__}s"
        images, labels, index = (np.asarray(part) for part in batch)
        size = len(index)
        if not 0 < size <= DEMO_BATCH_SIZE or images.dtype != np.float32 or images.shape != (size, 3, 32, 32):
            return f"1 to {DEMO_BATCH_SIZE} float32 images of (3, 32, 32)"
        if labels.dtype != np.int64 or index.dtype != np.int64 or labels.shape != (size,):
            return "int64 labels and indices"
        if index.min() < 0 or index.max() >= len(self.labels) or not np.array_equal(labels, self.labels[index]):
            return "the labels of the dataset's images at its indices"
        return None

    def see(self, item: Any) -> None:
        self.count += 1
        problem = self._problem(item)
        if problem is not None:
            described = [type(part).__name__ for part in item] if isinstance(item, tuple | list) else item
            self.wrong(described, problem)
            return
        self.ids(np.asarray(item[2]).tolist())


def small_tally(context: Context) -> Tally:
    return Tally(context.items)  # each item an int, its own id


def array_tally(context: Context) -> Tally:
    return ArrayTally(context.items, yields_tensors(context, "tensor" if context.workload.key == "tensor" else "array"))


def pair_tally(context: Context) -> Tally:
    return PairTally(context.items)


def demo_tally(context: Context) -> Tally:
    labels = demo_labels(demo_dir(context.settings["demo_root"], context.items))
    return DemoTally(context.items, labels, yields_tensors(context, "batch"))
