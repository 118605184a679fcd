"""torchdata's documented distributed dispatching pattern: ``sharding_filter()`` splits the
items by rank, then ``sharding_round_robin_dispatch(SHARDING_PRIORITIES.MULTIPROCESSING)``
hands each rank's items round-robin to its workers, under
``SequentialReadingService(DistributedReadingService(), MultiProcessingReadingService(n))``."""

from __future__ import annotations

import random
from typing import Any

import pytest

from conveyor import DataLoader2, DistributedReadingService, MultiProcessingReadingService, SequentialReadingService
from conveyor.errors import GraphError
from conveyor.graph import SHARDING_PRIORITIES, apply_sharding
from conveyor.pipes import IterableWrapper
from distributed_helpers import run_ranks, succeeded


def with_draw(item: int) -> tuple[int, float]:
    """The item and a draw from the worker's global RNG (seeded per worker and epoch)."""
    return item, random.random()


def split_then_dispatch(n: int) -> Any:
    pipe = IterableWrapper(list(range(n))).shuffle().sharding_filter()
    return pipe.sharding_round_robin_dispatch(SHARDING_PRIORITIES.MULTIPROCESSING).map(with_draw)


def _epochs(rank: int, world_size: int, workers: int, n: int) -> list[list[tuple[int, float]]]:
    service = SequentialReadingService(DistributedReadingService(), MultiProcessingReadingService(num_workers=workers))
    loader = DataLoader2(split_then_dispatch(n), reading_service=service)
    try:
        epochs = []
        for seed in (123, 123, 321):
            loader.seed(seed)
            epochs.append(list(loader))
        return epochs
    finally:
        loader.shutdown()


@pytest.mark.timeout(180)
def test_split_by_rank_then_dispatch_to_workers() -> None:
    world, workers = 2, 2
    n = world * workers * 10 + 1  # uneven: the agreed epoch end drops the odd item
    results = succeeded(run_ranks(world, _epochs, workers, n))
    for epochs in results:
        assert [len(epoch) for epoch in epochs] == [20, 20, 20]
        assert epochs[0] == epochs[1]  # same seed, same items, order and worker draws
        assert [i for i, _ in epochs[0]] != [i for i, _ in epochs[2]]
    for epoch in range(3):
        items = [i for rank in results for i, _ in rank[epoch]]
        assert len(set(items)) == len(items) == 40  # the ranks' shares are disjoint
        assert set(items) <= set(range(n))


def test_a_dispatch_point_that_names_its_level_takes_only_that_level() -> None:
    pipe = split_then_dispatch(12)
    apply_sharding(pipe, 2, 1, SHARDING_PRIORITIES.DISTRIBUTED)  # goes to the sharding_filter
    dispatcher = pipe.source
    assert dispatcher.sharding == [] and dispatcher.source.sharding == [(2, 1)]
    unnamed = IterableWrapper(range(4)).sharding_filter().sharding_round_robin_dispatch()
    with pytest.raises(GraphError, match="sharded once"):
        apply_sharding(unnamed, 2, 0, SHARDING_PRIORITIES.DISTRIBUTED)
    with pytest.raises(ValueError, match="sharding_group"):
        IterableWrapper(range(4)).sharding_round_robin_dispatch("workers")


def double(x: int) -> int:
    return x * 2


def test_a_sharding_filter_after_a_dispatch_point_keeps_every_item() -> None:
    import torch

    pipe = IterableWrapper(list(range(10))).shuffle()
    pipe = pipe.sharding_round_robin_dispatch(SHARDING_PRIORITIES.MULTIPROCESSING).map(double)
    pipe = pipe.sharding_filter().map(double).shuffle()
    loader = DataLoader2(pipe, reading_service=MultiProcessingReadingService(num_workers=2))
    try:
        torch.manual_seed(123)
        first = list(loader)
        torch.manual_seed(123)
        assert list(loader) == first
        torch.manual_seed(321)
        assert list(loader) != first
    finally:
        loader.shutdown()
    assert sorted(first) == [i * 4 for i in range(10)]


def test_a_filter_before_a_named_dispatch_point_in_one_process_keeps_every_item() -> None:
    pipe = IterableWrapper(list(range(10))).shuffle().sharding_filter().map(double)
    pipe = pipe.sharding_round_robin_dispatch(SHARDING_PRIORITIES.MULTIPROCESSING).map(double)
    loader = DataLoader2(pipe, reading_service=MultiProcessingReadingService(num_workers=2))
    loader.seed(4)
    items = list(loader)
    loader.shutdown()
    assert sorted(items) == [i * 4 for i in range(10)]


# --- several dispatch points: one per non-replicable branch ---------------------------------


def dispatched(n: int, offset: int = 0) -> Any:
    source = IterableWrapper([offset + i for i in range(n)]).shuffle()
    return source.sharding_round_robin_dispatch(SHARDING_PRIORITIES.MULTIPROCESSING)


def two_dispatched_branches() -> Any:
    return dispatched(10).map(double).zip(dispatched(10, 100))


def dispatched_and_sharded_branches() -> Any:
    return dispatched(10).map(double).zip(IterableWrapper(range(10)).shuffle().sharding_filter())


def dispatched_branches_one_after_the_other() -> Any:
    return dispatched(7).concat(dispatched(5, 100).map(double))


def read_two_epochs(make: Any, workers: int, seed: int = 2, context: str = "fork") -> list[list[Any]]:
    service = MultiProcessingReadingService(workers, multiprocessing_context=context)
    with DataLoader2(make(), reading_service=service) as loader:
        loader.seed(seed)
        return [list(loader) for _ in range(2)]


@pytest.mark.timeout(120)
def test_two_dispatched_branches_each_hand_every_item_out_once(start_method: str) -> None:
    epochs = read_two_epochs(two_dispatched_branches, 2, context=start_method)
    for epoch in epochs:
        assert sorted(a for a, _ in epoch) == [2 * i for i in range(10)]
        assert sorted(b for _, b in epoch) == [100 + i for i in range(10)]
    assert epochs[0] != epochs[1]  # each epoch shuffles anew
    assert read_two_epochs(two_dispatched_branches, 2, context=start_method) == epochs  # deterministic per seed


@pytest.mark.timeout(120)
def test_a_dispatched_branch_beside_a_sharded_one() -> None:
    epochs = read_two_epochs(dispatched_and_sharded_branches, 2)
    assert sorted(a for a, _ in epochs[0]) == [2 * i for i in range(10)]
    assert sorted(b for _, b in epochs[0]) == list(range(10))
    assert read_two_epochs(dispatched_and_sharded_branches, 2) == epochs


@pytest.mark.timeout(180)
@pytest.mark.parametrize("make", [two_dispatched_branches, dispatched_branches_one_after_the_other])
def test_several_dispatch_points_resume_exactly_with_the_same_workers(make: Any) -> None:
    from pipeline_helpers import resume_after

    expected = read_two_epochs(make, 2, seed=6)
    for cut in range(0, len(expected[0]) + 1, 3):
        epoch, following = resume_after(make, cut, 6, 2, 2)
        assert epoch == expected[0], cut
        assert following == expected[1], cut


def test_a_dispatch_point_upstream_of_another_is_refused() -> None:
    nested = dispatched(6).map(double).sharding_round_robin_dispatch(SHARDING_PRIORITIES.MULTIPROCESSING)
    loader = DataLoader2(nested, reading_service=MultiProcessingReadingService(2))
    with pytest.raises(GraphError, match="a branch is dispatched once"):
        iter(loader)
    loader.shutdown()
