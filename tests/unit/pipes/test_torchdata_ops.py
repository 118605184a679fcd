"""torchdata's ``repeat``, ``zip_longest`` and ``in_batch_shuffle``: its outputs, exact
resume at every cut, and the same output for any number of workers."""

from __future__ import annotations

from typing import Any

import pytest

from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.loader.adapters import Shuffle
from conveyor.pipes import BatchMapper, InBatchShuffler, IterableWrapper, Repeater, ShuffledFlatMapper, ZipperLongest
from resume_checks import check_resume_at_every_cut

pytestmark = pytest.mark.timeout(120)


def read(graph: Any, workers: int = 0, seed: int = 5) -> list[Any]:
    loader = DataLoader2(graph, reading_service=MultiProcessingReadingService(workers) if workers else None)
    loader.seed(seed)
    try:
        return list(loader)
    finally:
        loader.shutdown()


def test_repeat_yields_each_item_times_in_a_row() -> None:
    pipe = IterableWrapper(range(3)).repeat(2)
    assert isinstance(pipe, Repeater) and list(pipe) == [0, 0, 1, 1, 2, 2] and len(pipe) == 6
    item = [1]
    first, second = list(IterableWrapper([item]).repeat(2))
    assert first is second is not None  # the same object, as torchdata's


@pytest.mark.parametrize("times", [1, 0, -2, 2.0, True])
def test_repeat_refuses_fewer_than_two_times(times: Any) -> None:
    with pytest.raises(ValueError, match="must be an int > 1"):
        IterableWrapper(range(3)).repeat(times)


def test_zip_longest_fills_the_inputs_that_ended() -> None:
    a, b, c = IterableWrapper(range(3)), IterableWrapper(range(10, 15)), IterableWrapper(range(20, 25))
    pipe = a.zip_longest(b, c)
    assert isinstance(pipe, ZipperLongest) and len(pipe) == 5
    assert list(pipe) == [(0, 10, 20), (1, 11, 21), (2, 12, 22), (None, 13, 23), (None, 14, 24)]
    assert list(IterableWrapper(range(2)).zip_longest(IterableWrapper(range(3)), fill_value=-1)) == [
        (0, 0),
        (1, 1),
        (-1, 2),
    ]
    assert list(IterableWrapper([]).zip_longest(IterableWrapper([]))) == []
    with pytest.raises(TypeError, match="zip_longest"):
        IterableWrapper(range(2)).zip_longest([1, 2])  # type: ignore[arg-type]


def test_in_batch_shuffle_permutes_inside_each_batch_only() -> None:
    batches = read(IterableWrapper(range(40)).batch(4).in_batch_shuffle())
    assert [sorted(b) for b in batches] == [list(range(k, k + 4)) for k in range(0, 40, 4)]
    assert batches != [list(range(k, k + 4)) for k in range(0, 40, 4)]
    assert read(IterableWrapper(range(40)).batch(4).in_batch_shuffle(), seed=5) == batches
    assert read(IterableWrapper(range(40)).batch(4).in_batch_shuffle(), seed=6) != batches


def test_in_batch_shuffle_is_turned_off_by_set_shuffle_and_the_adapter() -> None:
    plain = [list(range(k, k + 4)) for k in range(0, 12, 4)]
    assert read(IterableWrapper(range(12)).batch(4).in_batch_shuffle().set_shuffle(False)) == plain
    loader = DataLoader2(IterableWrapper(range(12)).batch(4).in_batch_shuffle(), datapipe_adapter_fn=Shuffle(False))
    assert list(loader) == plain
    loader.shutdown()
    assert isinstance(IterableWrapper(range(3)).batch(2).in_batch_shuffle(), InBatchShuffler)


def _repeat_then_shuffle() -> Any:
    return IterableWrapper(range(7)).repeat(3).shuffle(buffer_size=5)


def _zip_longest_of_uneven() -> Any:
    return IterableWrapper(range(4)).zip_longest(IterableWrapper(range(10, 17)).shuffle(), fill_value=-1)


def _in_batch_shuffle_of_repeats() -> Any:
    return IterableWrapper(range(9)).repeat(2).batch(4).in_batch_shuffle()


@pytest.mark.parametrize(
    "make", [_repeat_then_shuffle, _zip_longest_of_uneven, _in_batch_shuffle_of_repeats], ids=lambda f: f.__name__
)
def test_they_resume_at_every_cut_of_two_epochs(make: Any) -> None:
    check_resume_at_every_cut(make, seed=11, cut_epochs=(0, 1))


def test_per_item_ones_give_the_same_output_for_any_worker_count() -> None:
    def graph() -> Any:
        batches = [list(range(k, k + 3)) for k in range(0, 30, 3)]  # batched before the sharding point
        return IterableWrapper(batches).sharding_filter().in_batch_shuffle().repeat(2)

    assert read(graph(), 0) == read(graph(), 2) == read(graph(), 3)


def add_one(batch: list[int]) -> list[int]:
    return [d + 1 for d in batch]


def test_map_batches_maps_groups_and_flattens_what_fn_returns() -> None:
    pipe = IterableWrapper(range(5)).map_batches(add_one, batch_size=3)
    assert isinstance(pipe, BatchMapper) and list(pipe) == [1, 2, 3, 4, 5]
    rows = IterableWrapper([(i, -i, 2 * i) for i in range(5)])
    assert list(rows.map_batches(lambda b: [sum(b)], batch_size=2, input_col=1)) == [-1, -5, -4]
    assert list(rows.map_batches(lambda b: b[:1], batch_size=2, input_col=[0, 2])) == [[0, 0], [2, 4], [4, 8]]
    with pytest.raises(TypeError, match="length depends on what its function returns"):
        len(pipe)
    with pytest.raises(TypeError, match="needs a callable"):
        IterableWrapper(range(3)).map_batches(3, batch_size=2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_size"):
        IterableWrapper(range(3)).map_batches(add_one, batch_size=0)


def expand_some(batch: list[int]) -> list[int]:
    return [x for d in batch for x in [d] * (d % 3)]


def test_map_batches_resumes_at_every_cut_of_two_epochs() -> None:
    check_resume_at_every_cut(
        lambda: IterableWrapper(range(11)).shuffle(buffer_size=4).map_batches(expand_some, batch_size=3),
        seed=2,
        cut_epochs=(0, 1),
    )


# --- shuffled_flatmap --------------------------------------------------------------------


def some_parts(x: int) -> list[int]:
    return [x * 10 + k for k in range(x % 4)]


def test_shuffled_flatmap_interleaves_every_part_once_each_items_parts_in_order() -> None:
    out = read(IterableWrapper(range(30)).shuffled_flatmap(some_parts, buffer_size=4))
    expected = [p for x in range(30) for p in some_parts(x)]
    assert sorted(out) == sorted(expected) and out != expected
    for x in range(30):  # an item's parts keep their order
        mine = [p for p in out if p // 10 == x]
        assert mine == some_parts(x)
    assert read(IterableWrapper(range(30)).shuffled_flatmap(some_parts, buffer_size=4), seed=5) == out
    assert read(IterableWrapper(range(30)).shuffled_flatmap(some_parts, buffer_size=4), seed=9) != out


def test_shuffled_flatmap_without_fn_and_turned_off() -> None:
    nested = [[1, 2], [3], [], [4, 5, 6]]
    assert sorted(read(IterableWrapper(nested).shuffled_flatmap())) == [1, 2, 3, 4, 5, 6]
    assert list(IterableWrapper(nested).shuffled_flatmap().set_shuffle(False)) == [1, 2, 3, 4, 5, 6]
    pairs = IterableWrapper([(2, "a"), (1, "b")]).shuffled_flatmap(lambda n: range(n), input_col=0)
    assert sorted(read(pairs)) == [0, 0, 1]
    assert isinstance(IterableWrapper(nested).shuffled_flatmap(), ShuffledFlatMapper)


@pytest.mark.parametrize("buffer_size", [1, 3])
def test_shuffled_flatmap_resumes_at_every_cut_of_two_epochs(buffer_size: int) -> None:
    def make() -> Any:
        return IterableWrapper(range(9)).shuffle(buffer_size=4).shuffled_flatmap(some_parts, buffer_size=buffer_size)

    check_resume_at_every_cut(make, seed=12, cut_epochs=(0, 1))


def test_shuffled_flatmap_turned_off_resumes_inside_an_item() -> None:
    check_resume_at_every_cut(
        lambda: IterableWrapper(range(7)).shuffled_flatmap(some_parts).set_shuffle(False), seed=1, cut_epochs=(0,)
    )
