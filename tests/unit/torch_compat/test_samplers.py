"""``conveyor.torch_compat.samplers``: torchdata's stateful samplers, whose iterators (or, for the
distributed one, the sampler itself) keep their position through plain-data states."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from conveyor import DataLoader
from conveyor.core.plain_state import decode, encode
from conveyor.samplers import BatchSampler, RandomSampler, SequentialSampler, StatefulDistributedSampler


def through_json(state: Any) -> Any:
    return decode(json.loads(json.dumps(encode(state, "a sampler"))), "a sampler")


def resumed_keys(make: Any, cut: int) -> tuple[list[Any], list[Any]]:
    """(every key of one pass, the first ``cut`` then the rest from a fresh sampler loaded
    with the state after them)."""
    full = list(make())
    it = iter(make())
    head = [next(it) for _ in range(cut)]
    state = through_json(it.state_dict())
    again = iter(make())
    again.load_state_dict(state)
    return full, head + list(again)


@pytest.mark.parametrize("cut", [0, 1, 7, 20])
@pytest.mark.parametrize(
    "make",
    [
        lambda: SequentialSampler(range(20)),
        lambda: RandomSampler(range(20), generator=torch.Generator().manual_seed(5)),
        lambda: RandomSampler(range(20), replacement=True, num_samples=20, generator=torch.Generator().manual_seed(5)),
        lambda: BatchSampler(RandomSampler(range(60), generator=torch.Generator().manual_seed(5)), 3, False),
    ],
    ids=["sequential", "random", "random-with-replacement", "batches-of-random"],
)
def test_an_iterator_resumes_from_its_state(make: Any, cut: int) -> None:
    full, resumed = resumed_keys(make, cut)
    assert resumed == full


def test_a_random_sampler_draws_a_new_order_each_pass_and_the_same_for_a_seed() -> None:
    sampler = RandomSampler(range(30), generator=torch.Generator().manual_seed(1))
    first, second = list(sampler), list(sampler)
    assert sorted(first) == list(range(30)) and first != second
    assert list(RandomSampler(range(30), generator=torch.Generator().manual_seed(1))) == first


def test_a_batch_sampler_over_a_sampler_without_state_reads_the_keys_taken_again() -> None:
    def make() -> BatchSampler:
        return BatchSampler(torch.utils.data.SequentialSampler(range(10)), 4, drop_last=True)

    full, resumed = resumed_keys(make, 1)
    assert full == resumed == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_the_distributed_sampler_keeps_its_position_on_itself() -> None:
    sampler = StatefulDistributedSampler(range(100), num_replicas=2, rank=0, shuffle=True, seed=42)
    assert (sampler.yielded, sampler.next_yielded) == (0, None)
    iterator = iter(sampler)
    next(iterator)
    assert sampler.yielded == 1 and sampler.state_dict() == {"yielded": 1}
    sampler.load_state_dict({"yielded": 5})
    assert sampler.next_yielded == 5
    full = list(StatefulDistributedSampler(range(100), num_replicas=2, rank=0, shuffle=True, seed=42))
    assert next(iter(sampler)) == full[5] and sampler.yielded == 6
    with pytest.raises(ValueError):
        sampler.load_state_dict({"yielded": -1})


def shuffled_loader(workers: int) -> DataLoader:
    sampler = RandomSampler(range(40), generator=torch.Generator().manual_seed(8))
    return DataLoader(list(range(40)), batch_sampler=BatchSampler(sampler, 3, False), num_workers=workers)


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("saved_with", "resumed_with"), [(0, 0), (2, 2), (2, 3), (0, 2)])
def test_the_loader_resumes_through_a_stateful_batch_sampler(saved_with: int, resumed_with: int) -> None:
    loader = shuffled_loader(saved_with)
    full = [[batch.tolist() for batch in loader] for _ in range(2)]
    loader.shutdown()
    for cut in (0, 1, 6, 14):
        loader = shuffled_loader(saved_with)
        it = iter(loader)
        head = [next(it).tolist() for _ in range(cut)]
        state = json.loads(json.dumps(loader.state_dict()))
        loader.shutdown()
        again = shuffled_loader(resumed_with)
        again.load_state_dict(state)
        if cut < len(full[0]):  # after the last batch, the first iter() is the next epoch
            assert head + [b.tolist() for b in again] == full[0], cut
        assert [b.tolist() for b in again] == full[1], cut
        again.shutdown()
