"""Batches stacked as their items arrive: :class:`BatchRows`.

A collate that stacks a batch once the batch is whole reads its first items back from
memory (by then they have left the cache) and keeps every item alive until the end, so
each new item is written to cold memory too. :class:`BatchRows` gathers the items of a
batch instead: each array of an item (the item itself, or a field of a plain tuple, list
or dict, nested) is copied into its row of a batch array made by
:func:`~conveyor.core.shared_arrays.shared_empty` (in a worker, the ring) as the item
arrives, and the item is kept with that row in its place, so its own memory is free for
the next item at once.

The collate then runs over the gathered items as it would over the originals (the rows
are equal to the arrays they replace: values, dtype, shape), and
:func:`~conveyor.core.shared_arrays.stack` and
:func:`~conveyor.core.shared_arrays.stack_tensors`, given exactly the rows of one batch
array in order, return that array instead of stacking them again. So what the collate
returns, and every error it raises, is what it would have been; only the copy moved.

An array that does not fit its field's batch array (another shape or dtype, or the first
of its field was not an array) stays as it is: that field is stacked at the end, as
before. Only plain arrays and tensors are gathered: C-contiguous ``numpy.ndarray`` of a
non-object dtype, and CPU tensors (strided, no grad) of a dtype numpy has.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from conveyor.core import shared_arrays
from conveyor.core.torch_support import loaded_torch


class _Column:
    """One field's batch array and its rows filled so far."""

    __slots__ = ("batch", "rows")

    def __init__(self, batch: Any):
        self.batch = batch
        self.rows: list[Any] = []


class BatchRows:
    """The items of one batch of at most ``size`` items, gathered for a collate (see the
    module): a list of the items to ``append`` to, then :meth:`collate`. Its batch arrays
    are forgotten then (or when it is dropped: a batch never collated).

    Args:
        size: The batch's size (a last batch may have fewer items).
        arrays: Gather numpy arrays too (a numpy collate); False: torch tensors only
            (torch's collate turns arrays into new tensors first, so rows of them would
            be copied for nothing).
    """

    __slots__ = ("_arrays", "_columns", "_items", "_registered", "_size", "_torch")

    def __init__(self, size: int, arrays: bool = True):
        self._size = size
        self._arrays = arrays
        self._items: list[Any] = []
        self._columns: dict[tuple[Any, ...], _Column | None] = {}  # None: not gathered
        self._registered: list[int] = []  # keys of this batch's arrays in GATHERED
        self._torch = loaded_torch()

    def append(self, item: Any) -> None:
        self._items.append(self._gather(item, ()))

    def __len__(self) -> int:
        return len(self._items)

    def collate(self, collate_fn: Any) -> Any:
        """``collate_fn`` of the gathered items (a list): the stacks of the gathered
        fields are the batch arrays their rows were copied into."""
        try:
            return collate_fn(self._items)
        finally:
            self.close()

    def close(self) -> None:
        """Forget the batch arrays (the items keep their rows)."""
        for key in self._registered:
            shared_arrays.GATHERED.pop(key, None)
        self._registered.clear()
        self._columns.clear()

    def __del__(self) -> None:
        self.close()

    def _gather(self, value: Any, path: tuple[Any, ...]) -> Any:
        kind = type(value)
        if (kind is np.ndarray and self._arrays) or (self._torch is not None and kind is self._torch.Tensor):
            return self._row(value, path)
        if kind is tuple:
            return tuple(self._gather(field, (*path, i)) for i, field in enumerate(value))
        if kind is list:
            return [self._gather(field, (*path, i)) for i, field in enumerate(value)]
        if kind is dict:
            return {key: self._gather(field, (*path, key)) for key, field in value.items()}
        return value

    def _row(self, value: Any, path: tuple[Any, ...]) -> Any:
        columns = self._columns
        if path not in columns:  # the field's first value (a later first: never gathered)
            columns[path] = self._column(value) if not self._items else None
        column = columns[path]
        if column is None:
            return value
        batch, rows = column.batch, column.rows
        if len(rows) < len(self._items) or len(rows) == len(batch):  # a row missed, or no row left
            columns[path] = None
            return value
        row = batch[len(rows)]
        if type(value) is not type(row) or value.shape != row.shape or value.dtype != row.dtype or not _plain(value):
            columns[path] = None  # from here on, the field is stacked at the end
            return value
        row[...] = value
        rows.append(row)
        if len(rows) == 1:
            shared_arrays.GATHERED[id(row)] = (batch, rows)
            self._registered.append(id(row))
        return row

    def _column(self, value: Any) -> _Column | None:
        """A batch array for the field whose first value is ``value``, when it can have one."""
        if not _plain(value):
            return None
        if type(value) is np.ndarray:
            return _Column(shared_arrays.shared_empty((self._size, *value.shape), value.dtype))
        kind = shared_arrays.numpy_dtype(value.dtype)
        if kind is None:
            return None
        torch = self._torch
        assert torch is not None  # value is a tensor
        return _Column(torch.from_numpy(shared_arrays.shared_empty((self._size, *value.shape), kind)))


def _plain(value: Any) -> bool:
    """An array or tensor a batch array can hold a copy of, as its stack would have."""
    if type(value) is np.ndarray:
        return bool(value.flags.c_contiguous) and not value.dtype.hasobject
    torch = loaded_torch()
    assert torch is not None  # value is a tensor
    return (
        value.device.type == "cpu"
        and value.layout == torch.strided
        and not value.requires_grad
        and not value.is_nested
        and value.is_contiguous()
    )
