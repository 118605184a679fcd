"""``max_token_bucketize``: torchdata's batches of similar length within a token budget,
resumed exactly without saving items."""

from __future__ import annotations

import heapq
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conveyor import DataLoader2
from conveyor.errors import StateError
from conveyor.pipes import IterableWrapper, MaxTokenBucketizer
from hypothesis_profiles import scaled
from resume_checks import check_resume_at_every_cut

pytestmark = pytest.mark.timeout(180)

SOURCE = ["1", "11", "1", "1111", "111", "1", "11", "11", "111"]


def test_torchdatas_examples() -> None:
    pipe = IterableWrapper(SOURCE).max_token_bucketize(max_token_count=5)
    assert isinstance(pipe, MaxTokenBucketizer)
    assert list(pipe) == [["1", "1", "1", "11"], ["11", "11"], ["111"], ["111"], ["1111"]]
    assert list(IterableWrapper(SOURCE).max_token_bucketize(max_token_count=4, buffer_size=4)) == [
        ["1", "1", "1"],
        ["11", "11"],
        ["11"],
        ["111"],
        ["111"],
        ["1111"],
    ]


def reference(items: list[str], max_tokens: int, buffer_size: int, padding: bool, low: int, high: int) -> list[Any]:
    """The algorithm as torchdata states it, ties in length leaving in arrival order."""
    heap: list[tuple[int, int, str]] = []
    batch: list[str] = []
    out = []

    def take() -> None:
        nonlocal batch
        length, _, item = heapq.heappop(heap)
        lengths = [length, *map(len, batch)]
        size = len(lengths) * max(lengths) if padding else sum(lengths)
        if size > max_tokens:
            out.append(batch)
            batch = []
        batch.append(item)

    for arrival, item in enumerate(items):
        if low <= len(item) <= high:
            heapq.heappush(heap, (len(item), arrival, item))
            if len(heap) == buffer_size:
                take()
    while heap:
        take()
    if batch:
        out.append(batch)
    return out


@settings(max_examples=scaled(80), deadline=None)
@given(
    lengths=st.lists(st.integers(1, 6), max_size=40),
    max_tokens=st.integers(6, 14),
    buffer_size=st.integers(1, 8),
    padding=st.booleans(),
    low=st.integers(0, 2),
)
def test_batches_follow_torchdatas_rule(
    lengths: list[int], max_tokens: int, buffer_size: int, padding: bool, low: int
) -> None:
    items = [chr(ord("a") + k % 26) * n for k, n in enumerate(lengths)]
    ours = list(
        IterableWrapper(items).max_token_bucketize(
            max_tokens, min_len=low, max_len=6, buffer_size=buffer_size, include_padding=padding
        )
    )
    assert ours == reference(items, max_tokens, buffer_size, padding, low, 6)
    for batch in ours:
        total = len(batch) * max(map(len, batch)) if padding else sum(map(len, batch))
        assert total <= max_tokens


@pytest.mark.parametrize(
    "kwargs",
    [{"buffer_size": 3}, {"buffer_size": 5, "include_padding": True}, {"buffer_size": 4, "min_len": 2}],
)
def test_it_resumes_at_every_cut_of_two_epochs(kwargs: dict[str, Any]) -> None:
    items = ["x" * (1 + (k * 5) % 6) for k in range(21)]

    def make() -> Any:
        return IterableWrapper(items).shuffle(buffer_size=7).max_token_bucketize(max_token_count=9, **kwargs)

    check_resume_at_every_cut(make, seed=2, cut_epochs=(0, 1))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_token_count": 0}, "max_token_count"),
        ({"max_token_count": 4, "max_len": 5}, "max_len"),
        ({"max_token_count": 4, "min_len": 3, "max_len": 2}, "min_len"),
        ({"max_token_count": 4, "buffer_size": 0}, "buffer_size"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        IterableWrapper(SOURCE).max_token_bucketize(**kwargs)


def test_a_state_naming_an_item_twice_is_refused() -> None:
    loader = DataLoader2(IterableWrapper(SOURCE).max_token_bucketize(max_token_count=5, buffer_size=4))
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    loader.shutdown()
    pipeline = state["pipeline"]
    pipeline["batch"] = pipeline["heap"][:1]
    with pytest.raises(StateError, match="distinct offsets"):
        DataLoader2(IterableWrapper(SOURCE).max_token_bucketize(max_token_count=5, buffer_size=4)).load_state_dict(
            state
        )
