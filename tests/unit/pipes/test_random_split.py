"""``random_split``: groups that partition the input exactly, the same on every run for a
seed, each resumable at any cut."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.pipes import IterableWrapper, RandomSplit
from conveyor.pipes.random_splits import split_sizes
from resume_checks import check_resume_at_every_cut

pytestmark = pytest.mark.timeout(120)


def test_the_groups_partition_the_input_in_its_order() -> None:
    groups = IterableWrapper(range(100)).random_split(weights={"a": 0.7, "b": 0.2, "c": 0.1}, seed=1)
    assert all(isinstance(g, RandomSplit) for g in groups)
    read = [list(g) for g in groups]
    assert [len(r) for r in read] == [len(g) for g in groups] == [70, 20, 10]
    assert sorted(x for r in read for x in r) == list(range(100))
    assert all(r == sorted(r) for r in read)  # each group keeps the input's order
    assert read[0] != list(range(70))


@pytest.mark.parametrize(
    ("weights", "total", "sizes"),
    [
        ([1, 1], 10, [5, 5]),
        ([1, 2, 3], 10, [2, 3, 5]),
        ([0.5, 0.5], 3, [2, 1]),
        ([3, 1], 0, [0, 0]),
        ([1] * 3, 7, [3, 2, 2]),
    ],
)
def test_sizes_follow_the_weights_and_add_up(weights: list[float], total: int, sizes: list[int]) -> None:
    assert split_sizes(weights, total) == sizes


def test_the_split_is_the_same_on_every_run_and_in_every_process() -> None:
    def split(seed: int) -> list[int]:
        return list(IterableWrapper(range(50)).random_split(weights={"x": 1, "y": 1}, seed=seed, target="x"))

    assert split(4) == split(4) != split(5)
    code = (
        "from conveyor.pipes import IterableWrapper; "
        "print(list(IterableWrapper(range(50)).random_split(weights={'x': 1, 'y': 1}, seed=4, target='x')))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "7"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == str(split(4))


def test_target_gives_that_group_and_override_seed_splits_anew() -> None:
    weights = {"train": 8, "valid": 2}
    train, valid = IterableWrapper(range(30)).random_split(weights=weights, seed=0)
    assert list(IterableWrapper(range(30)).random_split(weights=weights, seed=0, target="valid")) == list(valid)
    before = list(train)
    assert list(train.override_seed(1)) != before
    assert list(train.override_seed(0)) == before


def test_every_epoch_splits_alike_under_a_loader() -> None:
    loader = DataLoader2(IterableWrapper(range(20)).random_split(weights={"a": 1, "b": 1}, seed=2, target="a"))
    loader.seed(1)
    first, second = list(loader), list(loader)
    loader.shutdown()
    assert first == second


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda p: p.random_split(weights={}, seed=0), ValueError, "non-empty"),
        (lambda p: p.random_split(weights={"a": 0}, seed=0), ValueError, "positive numbers"),
        (lambda p: p.random_split(weights={"a": 1}, seed=0, target="b"), KeyError, "not a key of weights"),
        (lambda p: p.random_split(weights={"a": 1}, seed="s"), TypeError, "seed must be an int"),
        (lambda p: p.random_split(weights={"a": 1}, seed=0, total_length=-1), ValueError, "total_length"),
        (lambda p: p.filter(bool).random_split(weights={"a": 1}, seed=0), TypeError, "needs total_length"),
    ],
)
def test_bad_arguments_are_refused(call: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        call(IterableWrapper(range(5)))


def test_an_input_longer_than_total_length_is_an_error() -> None:
    group = IterableWrapper(range(6)).random_split(weights={"a": 1}, seed=0, total_length=4, target="a")
    with pytest.raises(ValueError, match="more than total_length=4"):
        list(group)


def test_each_group_resumes_at_every_cut_of_two_epochs() -> None:
    check_resume_at_every_cut(
        lambda: IterableWrapper(range(15)).random_split(weights={"a": 2, "b": 1}, seed=3, target="b").shuffle(),
        seed=5,
        cut_epochs=(0, 1),
    )


def test_split_before_the_sharding_point_reads_alike_on_any_worker_count() -> None:
    def read(workers: int) -> list[int]:
        group = IterableWrapper(range(40)).random_split(weights={"a": 3, "b": 1}, seed=9, target="a")
        service = MultiProcessingReadingService(workers) if workers else None
        loader = DataLoader2(group.sharding_filter(), reading_service=service)
        try:
            return list(loader)
        finally:
            loader.shutdown()

    whole = list(IterableWrapper(range(40)).random_split(weights={"a": 3, "b": 1}, seed=9, target="a"))
    assert len(whole) == 30
    assert read(0) == read(2) == whole
