"""``groupby``: the groups torch's ``Grouper`` forms, and exact resume at every cut without
saving items (the input is re-read from the oldest item still held)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data.datapipes.iter import IterableWrapper as TorchIterableWrapper

from conveyor import DataLoader2
from conveyor.errors import StateError
from conveyor.pipes import Grouper, IterableWrapper
from hypothesis_profiles import scaled
from resume_checks import check_resume_at_every_cut

pytestmark = pytest.mark.timeout(180)


class by_mod:
    """A key function (an object, not a closure: torch's Grouper warns about those)."""

    def __init__(self, modulus: int) -> None:
        self.modulus = modulus

    def __call__(self, x: int) -> int:
        return (x * 7919) % self.modulus


def torch_groups(items: list[int], key: Any, **kwargs: Any) -> list[Any]:
    return [
        (g[0], list(g[1])) if isinstance(g, tuple) else list(g)
        for g in TorchIterableWrapper(items).groupby(key, **kwargs)
    ]


settings_for = st.fixed_dictionaries(
    {},
    optional={
        "buffer_size": st.integers(3, 12),
        "group_size": st.integers(1, 3),
        "drop_remaining": st.booleans(),
    },
)


@settings(max_examples=scaled(60), deadline=None)
@given(items=st.lists(st.integers(0, 50), max_size=40), modulus=st.integers(1, 6), kwargs=settings_for)
def test_groups_are_torchs(items: list[int], modulus: int, kwargs: dict[str, Any]) -> None:
    if "group_size" in kwargs and "buffer_size" in kwargs and kwargs["group_size"] > kwargs["buffer_size"]:
        return
    key = by_mod(modulus)
    try:
        theirs: Any = torch_groups(items, key, **kwargs)
    except RuntimeError:
        theirs = RuntimeError
    try:
        ours: Any = list(IterableWrapper(items).groupby(key, **kwargs))
    except RuntimeError:
        ours = RuntimeError
    assert ours == theirs


def test_keep_key_gives_the_key_of_the_group() -> None:
    groups = list(IterableWrapper(range(7)).groupby(by_mod(2), keep_key=True, buffer_size=3))
    assert all(all(by_mod(2)(x) == key for x in group) for key, group in groups)
    assert sorted(x for _, group in groups for x in group) == list(range(7))
    assert isinstance(IterableWrapper(range(3)).groupby(by_mod(2)), Grouper)


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"group_size": 2}, {"buffer_size": 4}, {"buffer_size": 5, "group_size": 3, "drop_remaining": True}],
    ids=["end-only", "group-size", "evict-biggest", "drop-short"],
)
def test_it_resumes_at_every_cut_of_two_epochs(kwargs: dict[str, Any]) -> None:
    check_resume_at_every_cut(
        lambda: IterableWrapper(range(23)).shuffle(buffer_size=6).groupby(by_mod(4), **kwargs),
        seed=3,
        cut_epochs=(0, 1),
    )


class Reads:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self, x: int) -> int:
        self.count += 1
        return x

    def __deepcopy__(self, memo: dict[int, Any]) -> Reads:
        return self


def test_a_resume_re_reads_only_from_the_oldest_item_held() -> None:
    """Keys 0 and 1 alternate and groups of 2 leave at once: at most one item is held, so a
    resume re-reads only from the item held, wherever the cut."""
    items = [0, 1, 0, 1] * 10
    reads = Reads()

    def make() -> DataLoader2:
        return DataLoader2(IterableWrapper(items).map(reads).groupby(identity, group_size=2))

    first = make()
    it = iter(first)
    for _ in range(11):  # 23 items read, item 21 (a 1) held
        next(it)
    cut = json.loads(json.dumps(first.state_dict()))
    expected = list(it)
    first.shutdown()
    reads.count = 0
    again = make()
    again.load_state_dict(cut)
    assert list(again) == expected
    assert reads.count == len(items) - 21  # from item 21, the oldest held at the cut, to the end
    again.shutdown()


def identity(x: int) -> int:
    return x


def test_a_full_buffer_short_of_the_guaranteed_size_is_an_error_naming_the_fix() -> None:
    with pytest.raises(RuntimeError, match="raise buffer_size or set drop_remaining=True"):
        list(IterableWrapper(range(10)).groupby(by_mod(5), buffer_size=4, group_size=3))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"group_size": 5, "buffer_size": 4}, "must be <= buffer_size"),
        ({"guaranteed_group_size": 2}, "needs group_size"),
        ({"buffer_size": 0}, "buffer_size"),
    ],
)
def test_bad_sizes_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        IterableWrapper(range(3)).groupby(by_mod(2), **kwargs)


def test_a_state_with_bad_offsets_is_refused() -> None:
    loader = DataLoader2(IterableWrapper(range(9)).groupby(by_mod(3), buffer_size=9))
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    loader.shutdown()
    state["pipeline"]["firsts"] = [1, 0]
    with pytest.raises(StateError, match="increasing ints"):
        DataLoader2(IterableWrapper(range(9)).groupby(by_mod(3), buffer_size=9)).load_state_dict(state)


# --- bucketbatch -------------------------------------------------------------------------


def by_length(bucket: list[str]) -> list[str]:
    return sorted(bucket, key=len)


def words(n: int) -> list[str]:
    return ["x" * (1 + (k * 37) % 9) for k in range(n)]


def read(graph: Any, seed: int = 4) -> list[Any]:
    loader = DataLoader2(graph)
    loader.seed(seed)
    try:
        return list(loader)
    finally:
        loader.shutdown()


@pytest.mark.parametrize("use_in_batch_shuffle", [True, False])
def test_bucketbatch_batches_sorted_buckets_of_every_item(use_in_batch_shuffle: bool) -> None:
    items = words(60)
    batches = read(
        IterableWrapper(items).bucketbatch(
            batch_size=4, batch_num=3, bucket_num=2, sort_key=by_length, use_in_batch_shuffle=use_in_batch_shuffle
        )
    )
    assert sorted(x for b in batches for x in b) == sorted(items)
    assert all(len(b) == 4 for b in batches)
    assert all([len(x) for x in b] == sorted(len(x) for x in b) for b in batches)  # sorted within buckets
    spread = sum(len(b[-1]) - len(b[0]) for b in batches) / len(batches)
    assert spread < 8 / 2  # similar lengths share a batch (random batches of 4 from 1..9 spread ~5)


def test_bucketbatch_without_sort_key_shuffles_then_batches() -> None:
    batches = read(IterableWrapper(range(25)).bucketbatch(batch_size=4, drop_last=True, batch_num=2))
    assert [len(b) for b in batches] == [4] * 6
    assert sorted(x for b in batches for x in b) != list(range(24)) or batches != [
        list(range(k, k + 4)) for k in range(0, 24, 4)
    ]


def test_bucketbatch_resumes_at_every_cut_of_two_epochs() -> None:
    def make() -> Any:
        return IterableWrapper(words(17)).bucketbatch(batch_size=3, batch_num=2, bucket_num=2, sort_key=by_length)

    check_resume_at_every_cut(make, seed=5, cut_epochs=(0, 1))


@pytest.mark.parametrize(
    "kwargs", [{"batch_size": 0}, {"batch_size": 2, "batch_num": 0}, {"batch_size": 2, "bucket_num": -1}]
)
def test_bucketbatch_refuses_sizes_below_one(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="must be a positive int"):
        IterableWrapper(range(3)).bucketbatch(**kwargs)
