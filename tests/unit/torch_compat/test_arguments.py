"""``conveyor.DataLoader``'s arguments as torch's ``DataLoader`` treats them: a datapipe
graph takes ``shuffle``, what the batches are made of is fixed once the loader is built,
and more workers than CPUs warns."""

from __future__ import annotations

import os

import pytest
import torch
from torch.utils.data.datapipes.iter import IterableWrapper as TorchWrapper

from conveyor import DataLoader
from conveyor.pipes import IterableWrapper

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("make", [TorchWrapper, IterableWrapper], ids=["torch datapipe", "conveyor pipe"])
def test_shuffle_turns_a_datapipe_graphs_shuffles_on_and_off(make) -> None:  # type: ignore[no-untyped-def]
    items = list(range(40))
    torch.manual_seed(0)
    assert list(DataLoader(make(items).shuffle(), batch_size=None, shuffle=False)) == items
    torch.manual_seed(0)
    shuffled = list(DataLoader(make(items).shuffle().set_shuffle(False), batch_size=None, shuffle=True))
    assert sorted(shuffled) == items and shuffled != items


def test_an_iterable_dataset_that_is_no_datapipe_still_refuses_shuffle() -> None:
    with pytest.raises(ValueError, match="expected unspecified shuffle option"):
        DataLoader(torch.utils.data.ChainDataset([]), shuffle=True)


FIXED = ["batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers"]


@pytest.mark.parametrize("name", FIXED)
def test_what_the_batches_are_made_of_is_fixed_after_init(name: str) -> None:
    loader = DataLoader(range(10), batch_size=2)
    with pytest.raises(ValueError, match=f"{name} attribute should not be set after DataLoader is initialized"):
        setattr(loader, name, None)
    loader.num_workers = 0  # the others may change, as in torch
    assert [batch.tolist() for batch in loader] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]


def test_more_workers_than_cpus_warns_as_torch_does() -> None:
    too_many = len(os.sched_getaffinity(0)) + 1 if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1) + 1
    with pytest.warns(UserWarning, match="excessive worker creation might get DataLoader running slow or even freeze"):
        DataLoader(range(4), num_workers=too_many)
