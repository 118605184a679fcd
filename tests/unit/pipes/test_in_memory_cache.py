"""``in_memory_cache``: later passes read the first whole pass's items from memory, the
same items in the same order, exactly resumable, each process with its own cache."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.errors import GraphError
from conveyor.pipes import InMemoryCacheHolder, IterableWrapper
from resume_checks import check_resume_at_every_cut

pytestmark = pytest.mark.timeout(120)


class Reads:
    """Counts the items an input yields (in this process)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, x: int) -> int:
        self.count += 1
        return x

    def __deepcopy__(self, memo: dict[int, Any]) -> Reads:
        return self  # the loader's copy of the graph counts here too


def test_later_epochs_read_the_cache_not_the_input() -> None:
    reads = Reads()
    pipe = IterableWrapper(range(10)).map(reads).in_memory_cache()
    assert isinstance(pipe, InMemoryCacheHolder) and len(pipe) == 10
    loader = DataLoader2(pipe)
    loader.seed(0)
    epochs = [list(loader) for _ in range(3)]
    loader.shutdown()
    assert epochs == [list(range(10))] * 3
    assert reads.count == 10


def test_a_pass_left_early_or_over_the_size_caches_nothing() -> None:
    reads = Reads()
    loader = DataLoader2(IterableWrapper(range(10)).map(reads).in_memory_cache())
    it = iter(loader)
    next(it), next(it)
    assert list(loader) == list(range(10))  # the first whole pass: read from the input
    assert list(loader) == list(range(10)) and reads.count == 12
    loader.shutdown()
    big = Reads()
    loader = DataLoader2(IterableWrapper([b"x" * 600_000] * 4).map(big).in_memory_cache(size=1))
    assert [len(list(loader)) for _ in range(2)] == [4, 4] and big.count == 8  # 2.4 MB > 1 MB
    loader.shutdown()


def test_each_worker_caches_its_own_share() -> None:
    def where(x: int) -> tuple[int, int]:
        return x, os.getpid()

    graph = IterableWrapper(range(20)).sharding_filter().map(where).in_memory_cache()
    loader = DataLoader2(graph, reading_service=MultiProcessingReadingService(2))
    first, second = list(loader), list(loader)
    loader.shutdown()
    assert [x for x, _ in first] == [x for x, _ in second] == list(range(20))
    assert first == second  # the same pids: the second epoch came from each worker's cache
    assert len({pid for _, pid in first}) == 2


def test_it_resumes_at_every_cut_of_two_epochs() -> None:
    check_resume_at_every_cut(lambda: IterableWrapper(range(9)).in_memory_cache().shuffle(), seed=3, cut_epochs=(0, 1))


def test_a_random_op_before_it_is_refused() -> None:
    with pytest.raises(GraphError, match="put the random ops after the cache"):
        IterableWrapper(range(9)).shuffle().map(str).in_memory_cache()


def test_a_state_saved_while_reading_the_cache_resumes_in_a_new_loader() -> None:
    loader = DataLoader2(IterableWrapper(range(12)).map(Reads()).in_memory_cache())
    list(loader)
    it = iter(loader)  # from the cache
    head = [next(it) for _ in range(5)]
    state = json.loads(json.dumps(loader.state_dict()))
    loader.shutdown()
    reads = Reads()
    again = DataLoader2(IterableWrapper(range(12)).map(reads).in_memory_cache())
    again.load_state_dict(state)
    assert head + list(again) == list(range(12))
    assert reads.count == 12  # the input read from its start, the first five skipped ...
    assert list(again) == list(range(12)) and reads.count == 12  # ... and the cache filled on the way
    again.shutdown()


def test_the_cache_is_not_pickled_or_copied() -> None:
    import copy
    import pickle

    pipe = IterableWrapper(range(3)).in_memory_cache()
    assert list(pipe) == [0, 1, 2]
    assert "_cache" in vars(pipe)
    assert "_cache" not in vars(copy.deepcopy(pipe)) and "_cache" not in vars(pickle.loads(pickle.dumps(pipe)))


@pytest.mark.parametrize("size", [0, -1, 1.5, True])
def test_size_must_be_a_positive_int_of_megabytes(size: Any) -> None:
    with pytest.raises(ValueError, match="size"):
        IterableWrapper(range(3)).in_memory_cache(size=size)
