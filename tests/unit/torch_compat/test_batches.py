"""How ``conveyor.DataLoader`` hands out an epoch's batches in this process
(``num_workers=0``), as torch's iterator does: a batch's error raised from its ``next()``
as the dataset raised it, and torch's warning when an ``IterableDataset`` yields more than
the ``len()`` the loader reported."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import IterableDataset

from conveyor import DataLoader


class Longer(IterableDataset):
    """Says it has ``length`` items and yields ``actual``; item ``bad`` raises instead."""

    def __init__(self, length: int, actual: int, bad: int = -1) -> None:
        self.length, self.actual, self.bad = length, actual, bad

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[int]:
        return Items(self.actual, self.bad)


class Items:
    def __init__(self, end: int, bad: int) -> None:
        self.next, self.end, self.bad = 0, end, bad

    def __iter__(self) -> Items:
        return self

    def __next__(self) -> int:
        item = self.next
        if item >= self.end:
            raise StopIteration
        self.next += 1
        if item == self.bad:
            raise KeyError(item)
        return item


def warnings_per_step(loader: Any) -> list[list[str]]:
    """The length warnings each ``next()`` of one epoch gave (an error is a step too)."""
    steps: list[list[str]] = []
    it = iter(loader)
    while True:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                next(it)
            except StopIteration:
                break
            except KeyError:
                pass
        steps.append(
            [str(w.message) for w in caught if issubclass(w.category, UserWarning) and "Length" in str(w.message)]
        )
    return steps


@pytest.mark.parametrize("batch_size", [None, 2])
def test_an_iterable_dataset_longer_than_its_len_warns_at_each_step_past_it_as_torch(batch_size: int | None) -> None:
    dataset = Longer(length=5, actual=9)
    ours, theirs = DataLoader(dataset, batch_size=batch_size), TorchDataLoader(dataset, batch_size=batch_size)
    assert warnings_per_step(ours) == [[]] * len(warnings_per_step(theirs))  # no len() asked: no warning
    assert len(ours) == len(theirs) == (5 if batch_size is None else 3)
    expected, got = warnings_per_step(theirs), warnings_per_step(ours)
    assert got == expected  # the same text at the same steps
    # torch counts batches against the dataset's length (5), not the loader's (3 batches).
    assert all(not step for step in got[:5]) and all(len(step) == 1 for step in got[5:])
    assert len(got) == (9 if batch_size is None else 5)
    if batch_size is None:
        assert got[-1][0].startswith(f"Length of IterableDataset {dataset} was reported to be 5")
        assert "multiprocessing" not in got[-1][0]  # the hint about workers' replicas is for workers


def test_batches_count_against_the_datasets_length_as_torch() -> None:
    dataset = Longer(length=3, actual=9)
    loader, theirs = DataLoader(dataset, batch_size=2), TorchDataLoader(dataset, batch_size=2)
    assert len(loader) == len(theirs) == 2
    got = warnings_per_step(loader)
    assert got == warnings_per_step(theirs)
    assert [len(step) for step in got] == [0, 0, 0, 1, 1]
    assert "reported to be 3(when accessing len(dataloader)), but 4 samples have been fetched" in got[3][0]


def test_the_warning_category_is_torchs_and_a_failed_step_is_not_counted() -> None:
    dataset = Longer(length=3, actual=6, bad=1)  # 5 items come out, one step raises
    loader = DataLoader(dataset, batch_size=None)
    assert len(loader) == 3
    it = iter(loader)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning up to the reported length
        assert next(it) == 0
        with pytest.raises(KeyError):
            next(it)
        assert [next(it), next(it)] == [2, 3]
    with pytest.warns(UserWarning, match=r"reported to be 3\(when accessing len\(dataloader\)\), but 4 samples"):
        assert next(it) == 4
    theirs = TorchDataLoader(dataset, batch_size=None)
    len(theirs)
    assert warnings_per_step(theirs) == warnings_per_step(loader)


def test_a_map_style_dataset_never_warns() -> None:
    loader = DataLoader(list(range(10)), batch_size=3)
    assert len(loader) == 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(list(loader)) == 4
