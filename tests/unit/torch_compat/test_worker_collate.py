"""The collation conveyor's workers run for torch's ``default_collate``: the same batches,
types and errors, stacked into ordinary memory (torch's makes a shared-memory segment per
batch in a worker; conveyor sends batches through its own)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate
from torch.utils.data._utils import worker as torch_worker

from conveyor.torch_compat.torch_workers import worker_collate


@contextmanager
def as_in_a_worker() -> Iterator[None]:
    """torch's worker info set, as conveyor's workers set it."""
    saved = torch_worker._worker_info
    torch_worker._worker_info = torch_worker.WorkerInfo(id=0, num_workers=1, seed=0, dataset=None)
    try:
        yield
    finally:
        torch_worker._worker_info = saved


BATCHES = [
    [torch.full((4, 3), float(i)) for i in range(5)],
    [{"x": torch.arange(3) + i, "y": np.full(2, i), "name": f"n{i}", "k": i, "f": i / 2} for i in range(4)],
    [(torch.tensor([i]), [np.float32(i), torch.tensor(i)]) for i in range(3)],
]


def same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def tensors_in(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors_in(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_in(v)]
    return []


@pytest.mark.parametrize("batch", BATCHES)
def test_the_same_batches_as_default_collate_in_ordinary_memory(batch: list[object]) -> None:
    collate = worker_collate(default_collate)
    with as_in_a_worker():
        theirs = default_collate(batch)
        ours = collate(batch)
    assert same(ours, theirs)
    assert not any(t.is_shared() for t in tensors_in(ours))


def test_torch_stacks_into_shared_memory_in_a_worker() -> None:
    """Why conveyor's workers collate with their own stack."""
    with as_in_a_worker():
        assert default_collate(BATCHES[0]).is_shared()


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
def test_nested_tensors_raise_torchs_error() -> None:
    nested = [torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]) for _ in range(2)]
    with as_in_a_worker(), pytest.raises(RuntimeError, match="nested tensors are not currently supported"):
        worker_collate(default_collate)(nested)


def test_any_other_collate_fn_is_kept_as_given() -> None:
    def mine(batch: list[object]) -> list[object]:
        return batch

    assert worker_collate(mine) is mine
