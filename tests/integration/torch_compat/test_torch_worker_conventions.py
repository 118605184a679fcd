"""``conveyor.DataLoader``'s workers keep torch's conventions: their global RNGs are
seeded as torch seeds them and stay the user's from one epoch to the next, and the
dataset is never copied in the main process (some cannot be: nested tensors,
synchronized values)."""

from __future__ import annotations

import multiprocessing
import random
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import Dataset, get_worker_info

from conveyor import DataLoader

pytestmark = pytest.mark.timeout(180)


class Draws(Dataset):
    """Each item draws from the worker's global RNGs, as augmentations do."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> tuple[int, float, float, float, int, int]:
        info = get_worker_info()
        return (i, random.random(), float(np.random.rand()), float(torch.rand(())), torch.initial_seed(), info.seed)


def epochs(loader_class: Any, persistent: bool) -> list[list[Any]]:
    torch.manual_seed(7)
    loader = loader_class(Draws(), batch_size=None, num_workers=2, persistent_workers=persistent)
    return [list(loader) for _ in range(2)]


def test_workers_draw_what_torchs_workers_draw() -> None:
    got = epochs(DataLoader, persistent=False)
    assert got == epochs(TorchDataLoader, persistent=False)
    assert all(item[4] == item[5] for epoch in got for item in epoch)  # torch.initial_seed() is the worker's seed


def test_persistent_workers_draw_torchs_first_epoch_then_each_epoch_from_its_seed() -> None:
    got = epochs(DataLoader, persistent=True)
    assert got[0] == epochs(TorchDataLoader, persistent=True)[0]
    assert all(item[4] == item[5] for epoch in got for item in epoch)
    assert [item[1] for item in got[0]] != [item[1] for item in got[1]]  # the next epoch draws anew
    # ... from its own base seed, which a state saved between the epochs holds.
    torch.manual_seed(7)
    loader = DataLoader(Draws(), batch_size=None, num_workers=2, persistent_workers=True)
    first = list(loader)
    state = loader.state_dict()
    second = list(loader)
    resumed = DataLoader(Draws(), batch_size=None, num_workers=2, persistent_workers=True)
    resumed.load_state_dict(state)
    assert [first, second] == got and list(resumed) == second


class Ragged(Dataset):
    """Nested tensors: torch cannot deep-copy them."""

    def __init__(self) -> None:
        self.items = [torch.nested.nested_tensor([torch.arange(float(i + 1)), torch.ones(2)]) for i in range(6)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        return self.items[i]


def first(batch: list[Any]) -> Any:
    return batch[0]


def test_a_dataset_that_cannot_be_copied_loads_in_workers(start_method: str) -> None:
    dataset = Ragged()
    loader = DataLoader(dataset, batch_size=1, num_workers=2, collate_fn=first, multiprocessing_context=start_method)
    got = list(loader)
    assert len(got) == len(dataset)
    for batch, expected in zip(got, dataset.items, strict=True):
        assert batch.is_nested
        assert all(torch.equal(a, b) for a, b in zip(batch.unbind(), expected.unbind(), strict=True))


class Counted(Dataset):
    """Counts its reads in a value shared with its workers (handed down by fork)."""

    def __init__(self) -> None:
        self.reads = multiprocessing.get_context("fork").Value("i", 0)

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        with self.reads.get_lock():
            self.reads.value += 1
        return i


def test_a_dataset_sharing_a_synchronized_value_with_its_workers() -> None:
    dataset = Counted()
    loader = DataLoader(dataset, batch_size=2, num_workers=2, multiprocessing_context="fork")
    assert [batch.tolist() for batch in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert dataset.reads.value == 8


class Tagged(Dataset):
    """Its items carry what its own ``worker_init_fn`` (a bound method) set on it."""

    def __init__(self) -> None:
        self.worker_id: int | None = None

    def tag(self, worker_id: int) -> None:
        self.worker_id = worker_id

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> tuple[int | None, int]:
        return self.worker_id, i


def test_a_bound_worker_init_fn_configures_the_dataset_its_worker_reads(start_method: str) -> None:
    dataset = Tagged()
    loader = DataLoader(
        dataset, batch_size=2, num_workers=2, worker_init_fn=dataset.tag, multiprocessing_context=start_method
    )
    got = [(workers.tolist(), items.tolist()) for workers, items in loader]
    assert got == [([0, 0], [0, 1]), ([1, 1], [2, 3]), ([0, 0], [4, 5]), ([1, 1], [6, 7])]
    assert dataset.worker_id is None  # the workers' copies were tagged, not this process's
