"""``batch().collate()`` stacks arrays as they arrive (``BatchRows``): what it yields
must be what ``default_collate`` of each batch's list yields, error for error."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conveyor.core.batch_rows import BatchRows
from conveyor.core.shared_arrays import GATHERED
from conveyor.pipes import IterableWrapper, default_collate
from conveyor.pipes.batch import BatcherPass
from conveyor.pipes.collate import CollatorPass


def _item(kind: str, i: int) -> Any:
    """Items of the kinds a batch may mix: the usual array, and ones that break its layout."""
    if kind == "array":
        return np.full((2, 3), i, dtype=np.int32)
    if kind == "wider":
        return np.full((2, 4), i, dtype=np.int32)
    if kind == "float":
        return np.full((2, 3), i + 0.5, dtype=np.float64)
    if kind == "fortran":
        return np.asfortranarray(np.full((2, 3), i, dtype=np.int32))
    if kind == "strided":
        return np.arange(12, dtype=np.int32).reshape(2, 6)[:, ::2] + i
    if kind == "objects":
        return np.array([i, "x"], dtype=object)
    if kind == "subclass":
        return np.ma.masked_array(np.full((2, 3), i, dtype=np.int32))
    if kind == "scalar":
        return np.int32(i)
    if kind == "pair":
        return (np.full(3, i, dtype=np.uint8), i)
    if kind == "wide pair":
        return (np.full(4, i, dtype=np.uint8), i)
    if kind == "record":
        return {"image": np.full((2, 2), i, dtype=np.float32), "label": i, "tags": [np.int64(i), np.zeros(1)]}
    if kind == "other record":
        return {"image": np.full((2, 2), i, dtype=np.float32), "name": "x"}
    if kind == "tensor":
        return torch.full((3,), i, dtype=torch.int16)
    return [i, i]  # a list


KINDS = [
    "array",
    "wider",
    "float",
    "fortran",
    "strided",
    "objects",
    "subclass",
    "scalar",
    "list",
    "pair",
    "wide pair",
    "record",
    "other record",
    "tensor",
]


def _outcome(make: Any) -> tuple[str, Any]:
    try:
        return "ok", make()
    except Exception as error:  # the error is the outcome compared
        return "error", type(error)


def _assert_same(got: Any, expected: Any) -> None:
    assert type(got) is type(expected)
    if isinstance(expected, torch.Tensor):
        assert got.shape == expected.shape and got.dtype == expected.dtype
        assert torch.equal(got, expected)
    elif isinstance(expected, dict):
        assert list(got) == list(expected)
        for key in expected:
            _assert_same(got[key], expected[key])
    elif isinstance(expected, np.ndarray):
        assert got.shape == expected.shape and got.dtype == expected.dtype
        assert got.flags.c_contiguous == expected.flags.c_contiguous
        if expected.dtype.hasobject:  # items of any kind: compared one by one
            for g, e in zip(got.ravel(), expected.ravel(), strict=True):
                _assert_same(g, e)
        else:
            np.testing.assert_array_equal(got, expected)
    elif isinstance(expected, (list, tuple)):
        assert len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            _assert_same(g, e)
    else:
        assert got == expected


# default_collate indexes a tensor by a record's key when a batch mixes them (both ways).
@pytest.mark.filterwarnings("ignore:Using a non-tuple sequence:UserWarning")
@given(
    kinds=st.lists(st.sampled_from(KINDS), max_size=12),
    size=st.integers(1, 5),
    drop_last=st.booleans(),
)
def test_collated_batches_equal_default_collate_of_the_lists(kinds: list[str], size: int, drop_last: bool) -> None:
    items = [_item(kind, i) for i, kind in enumerate(kinds)]
    lists = list(IterableWrapper(items).batch(size, drop_last=drop_last))
    for batch, collated in zip(lists, _batches(items, size, drop_last), strict=True):
        expected = _outcome(lambda batch=batch: default_collate(batch))
        assert collated[0] == expected[0]
        if expected[0] == "ok":
            _assert_same(collated[1], expected[1])
        else:
            assert collated[1] is expected[1]


def _batches(items: list[Any], size: int, drop_last: bool) -> list[tuple[str, Any]]:
    """Each batch's outcome, the way ``batch(size).collate()`` gathers it."""
    outcomes = []
    rows = BatchRows(size)
    for item in items:
        rows.append(item)
        if len(rows) == size:
            outcomes.append(_outcome(lambda rows=rows: rows.collate(default_collate)))
            rows = BatchRows(size)
    if len(rows) and not drop_last:
        outcomes.append(_outcome(lambda rows=rows: rows.collate(default_collate)))
    del rows
    assert not GATHERED  # every batch array forgotten, collated or dropped
    return outcomes


def test_the_pipe_gathers_its_batches_in_stacked_rows() -> None:
    pipe = IterableWrapper([np.full(3, i) for i in range(5)]).batch(2).collate()
    opened = pipe.open()
    assert isinstance(opened, CollatorPass) and isinstance(opened.source, BatcherPass)
    batches = list(opened)
    assert [b.shape for b in batches] == [(2, 3), (2, 3), (1, 3)]
    np.testing.assert_array_equal(batches[2], [[4, 4, 4]])
    np.testing.assert_array_equal(batches[0], [[0, 0, 0], [1, 1, 1]])


def test_a_collate_fn_of_the_users_gets_the_lists() -> None:
    seen: list[Any] = []
    batches = list(IterableWrapper(range(5)).batch(2).collate(fn=lambda b: seen.append(b) or len(b)))
    assert batches == [2, 2, 1]
    assert seen == [[0, 1], [2, 3], [4]]


def test_a_mismatch_is_the_same_error_as_before() -> None:
    pipe = IterableWrapper([np.zeros(3), np.zeros(3), np.zeros(4)]).batch(3).collate()
    with pytest.raises(ValueError, match="same shape"):
        list(pipe)


def test_a_resume_between_batches_gives_the_same_batches() -> None:
    pipe = IterableWrapper([np.full(2, i) for i in range(7)]).batch(3).collate()
    opened = pipe.open()
    first = next(opened)
    resumed = pipe.open(opened.state())
    rest = [b.tolist() for b in resumed]
    assert first.tolist() == [[0, 0], [1, 1], [2, 2]]
    assert rest == [[[3, 3], [4, 4], [5, 5]], [[6, 6]]]


def test_the_stacks_are_the_arrays_the_rows_were_copied_into() -> None:
    rows = BatchRows(3)
    for i in range(3):
        rows.append({"image": np.full(4, i, dtype=np.uint8), "label": i})
    gathered = [item["image"] for item in rows._items]
    batch = rows.collate(default_collate)
    assert all(np.shares_memory(batch["image"], row) for row in gathered)
    assert batch["label"].tolist() == [0, 1, 2]
    assert not GATHERED


def test_torch_rows_only_gathers_tensors() -> None:
    rows = BatchRows(2, arrays=False)
    items = [(torch.full((2,), i), np.full(2, i)) for i in range(2)]
    for item in items:
        rows.append(item)
    assert all(kept[1] is item[1] for kept, item in zip(rows._items, items, strict=True))
    batch = rows.collate(default_collate)
    assert torch.equal(batch[0], torch.tensor([[0, 0], [1, 1]]))
    np.testing.assert_array_equal(batch[1], [[0, 0], [1, 1]])
