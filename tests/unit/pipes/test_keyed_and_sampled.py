"""``zip_with_map`` (torchdata's ``MapKeyZipper``) and ``SampleMultiplexer``: outputs,
errors, exact resume at every cut, and what does not depend on the worker count."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.errors import StateError
from conveyor.pipes import IterableWrapper, IterKeyZipper, MapKeyZipper, SampleMultiplexer, SequenceWrapper
from resume_checks import check_resume_at_every_cut

pytestmark = pytest.mark.timeout(120)

LETTERS = SequenceWrapper(list("abcdefghij"))


def read(graph: Any, workers: int = 0, seed: int = 4) -> list[Any]:
    loader = DataLoader2(graph, reading_service=MultiProcessingReadingService(workers) if workers else None)
    loader.seed(seed)
    try:
        return list(loader)
    finally:
        loader.shutdown()


def identity(x: Any) -> Any:
    return x


def joined(item: int, found: str) -> str:
    return f"{item}{found}"


def test_zip_with_map_joins_each_item_with_what_its_key_finds() -> None:
    pipe = IterableWrapper([2, 0, 1]).zip_with_map(LETTERS, identity)
    assert isinstance(pipe, MapKeyZipper) and len(pipe) == 3
    assert list(pipe) == [(2, "c"), (0, "a"), (1, "b")]
    assert list(IterableWrapper([3]).zip_with_map(LETTERS, identity, merge_fn=joined)) == ["3d"]
    assert list(IterableWrapper([4]).zip_with_map(LETTERS, identity, joined, keep_key=True)) == [(4, "4e")]


def test_zip_with_map_names_a_missing_key_and_checks_its_arguments() -> None:
    with pytest.raises(KeyError, match=r"maps the item 12 to 12, which is not a key of SequenceWrapper"):
        list(IterableWrapper([1, 12]).zip_with_map(LETTERS, identity))
    with pytest.raises(TypeError, match="MapDataPipe"):
        IterableWrapper([1]).zip_with_map({1: "a"}, identity)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="key_fn"):
        IterableWrapper([1]).zip_with_map(LETTERS, "key")  # type: ignore[arg-type]


def test_zip_with_map_gives_the_same_output_for_any_worker_count() -> None:
    def graph() -> Any:
        return IterableWrapper([k % 10 for k in range(40)]).sharding_filter().zip_with_map(LETTERS, identity, joined)

    assert read(graph(), 0) == read(graph(), 2) == [f"{k % 10}{'abcdefghij'[k % 10]}" for k in range(40)]


def _zip_with_map_after_shuffle() -> Any:
    return IterableWrapper(list(range(10)) * 2).shuffle(buffer_size=6).zip_with_map(LETTERS, identity, joined)


def _weighted_three() -> Any:
    return SampleMultiplexer(
        {IterableWrapper(range(6)): 0.5, IterableWrapper(range(10, 14)): 0.3, IterableWrapper(range(20, 23)): 0.2}
    )


def _weighted_seeded_over_shuffles() -> Any:
    return SampleMultiplexer(
        {IterableWrapper(range(5)).shuffle(): 1, IterableWrapper(range(10, 17)).batch(2): 2}, seed=9
    )


@pytest.mark.parametrize(
    "make", [_zip_with_map_after_shuffle, _weighted_three, _weighted_seeded_over_shuffles], ids=lambda f: f.__name__
)
def test_they_resume_at_every_cut_of_two_epochs(make: Any) -> None:
    check_resume_at_every_cut(make, seed=6, cut_epochs=(0, 1))


def test_sample_multiplexer_yields_every_item_once_at_the_weights_rates() -> None:
    heavy, light = IterableWrapper(range(0, 4000)), IterableWrapper(range(4000, 5000))
    out = read(SampleMultiplexer({heavy: 4, light: 1}))
    assert sorted(out) == list(range(5000))
    head = Counter(x >= 4000 for x in out[:2000])
    assert 300 < head[True] < 500  # a fifth of the draws while both inputs last (400 expected)
    assert [x for x in out if x < 4000] == list(range(4000))  # each input's order is kept


def test_sample_multiplexer_draws_by_the_loaders_seed_or_its_own() -> None:
    def unseeded() -> Any:
        return SampleMultiplexer({IterableWrapper(range(20)): 1, IterableWrapper(range(100, 120)): 1})

    assert read(unseeded(), seed=1) == read(unseeded(), seed=1) != read(unseeded(), seed=2)
    loader = DataLoader2(unseeded())
    loader.seed(1)
    first, second = list(loader), list(loader)
    assert first != second  # each epoch draws anew
    loader.shutdown()

    def seeded() -> Any:
        return SampleMultiplexer({IterableWrapper(range(20)): 1, IterableWrapper(range(100, 120)): 1}, seed=5)

    assert read(seeded(), seed=1) == read(seeded(), seed=2) == list(seeded())


@pytest.mark.parametrize(
    ("weights", "error", "message"),
    [({}, ValueError, "non-empty"), ({0: 1}, TypeError, "IterDataPipes"), (None, ValueError, "non-empty")],
)
def test_sample_multiplexer_checks_its_inputs(weights: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        SampleMultiplexer(weights)


@pytest.mark.parametrize("weight", [0, -1, float("nan"), "1", True])
def test_sample_multiplexer_refuses_weights_that_are_not_positive_numbers(weight: Any) -> None:
    with pytest.raises(ValueError, match="weights must be positive numbers"):
        SampleMultiplexer({IterableWrapper(range(3)): weight})


def test_sample_multiplexer_checks_its_state() -> None:
    loader = DataLoader2(_weighted_three())
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    loader.shutdown()
    state["pipeline"]["ended"] = [True]
    with pytest.raises(StateError, match="'ended' must be 3 booleans"):
        DataLoader2(_weighted_three()).load_state_dict(state)


# --- zip_with_iter -----------------------------------------------------------------------


def first(pair: tuple[str, int]) -> str:
    return pair[0]


def add_values(item: tuple[str, int], ref: tuple[str, int]) -> tuple[str, int]:
    return item[0], item[1] + ref[1]


def test_zip_with_iter_matches_each_item_with_the_reference_item_of_its_key() -> None:
    items = IterableWrapper([("a", 100), ("b", 200), ("c", 300)])
    refs = IterableWrapper([("a", 1), ("b", 2), ("c", 3), ("d", 4)])
    pipe = items.zip_with_iter(refs, key_fn=first, keep_key=True, merge_fn=add_values)
    assert isinstance(pipe, IterKeyZipper)
    assert list(pipe) == [("a", ("a", 101)), ("b", ("b", 202)), ("c", ("c", 303))]
    assert list(IterableWrapper([3, 1, 2]).zip_with_iter(IterableWrapper([1, 2, 3]), identity)) == [
        (3, 3),
        (1, 1),
        (2, 2),
    ]


def test_zip_with_iter_names_a_key_it_cannot_match_and_a_duplicate() -> None:
    with pytest.raises(BufferError, match="no item of the reference input has the key 9"):
        list(IterableWrapper([1, 9]).zip_with_iter(IterableWrapper([1, 2]), identity))
    with pytest.raises(ValueError, match="has the key 2 twice"):
        list(IterableWrapper([3]).zip_with_iter(IterableWrapper([2, 2, 3]), identity))
    with pytest.raises(BufferError, match="raise buffer_size"):  # 1 left the full buffer of 2 before it was asked for
        list(IterableWrapper([4, 1]).zip_with_iter(IterableWrapper([1, 2, 3, 4]), identity, buffer_size=2))


def _zip_with_iter_shuffled() -> Any:
    refs = IterableWrapper(list(range(12))).shuffle(buffer_size=5)
    return IterableWrapper(list(range(12))).shuffle(buffer_size=4).zip_with_iter(refs, identity, buffer_size=8)


def test_zip_with_iter_resumes_at_every_cut_of_two_epochs() -> None:
    check_resume_at_every_cut(_zip_with_iter_shuffled, seed=7, cut_epochs=(0, 1))


def test_zip_with_iter_checks_its_state() -> None:
    loader = DataLoader2(_zip_with_iter_shuffled())
    loader.seed(1)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    loader.shutdown()
    state["pipeline"]["held"] = [0, 0]
    with pytest.raises(StateError, match="distinct offsets"):
        DataLoader2(_zip_with_iter_shuffled()).load_state_dict(state)
