"""A per-item stage holds no item it has handed out while it makes the next: its result
and its input go before the next call (a generator's locals would otherwise live on, and
a worker would hold two large items, or two batches, where one would do)."""

from __future__ import annotations

import collections
import weakref

import pytest

from conveyor import DataLoader2
from conveyor.pipes import IterableWrapper


class Big:
    """Stands for a large item (an array, a decoded image, a batch)."""

    def __init__(self, i: int):
        self.i = i


class Made:
    """Weak references to every value a stage made, to check the earlier ones are gone."""

    def __init__(self) -> None:
        self.refs: list[weakref.ref[Big]] = []
        self.alive_at_next: list[int] = []  # for each value made: how many earlier ones were still alive

    def make(self, i: int) -> Big:
        self.alive_at_next.append(sum(ref() is not None for ref in self.refs))
        value = Big(i)
        self.refs.append(weakref.ref(value))
        return value


def drain(pipe) -> None:
    """Consume every item without holding any (a loop variable would hold the last)."""
    collections.deque(pipe, maxlen=0)


@pytest.mark.parametrize("stage", ["map", "random_map", "collate"])
def test_a_stage_lets_go_of_what_it_made_before_it_makes_the_next(stage):
    made = Made()
    source = IterableWrapper(range(6))
    if stage == "map":
        pipe = source.map(made.make)
    elif stage == "random_map":
        pipe = source.random_map(lambda i, rng: made.make(i))
    else:  # the batch (its input) and the collated batch (its result)
        inputs = Made()
        pipe = source.map(inputs.make).batch(2).collate(lambda batch: made.make(batch[0].i))
    drain(pipe)
    assert len(made.refs) == (3 if stage == "collate" else 6)
    assert made.alive_at_next == [0] * len(made.refs)
    if stage == "collate":  # the map's items were let go of with their batch
        assert inputs.alive_at_next == [0, 1, 0, 1, 0, 1]


LOADED = Made()  # a module's: the loader copies its graph, and a function is copied as a reference


def make_loaded(i: int) -> Big:
    return LOADED.make(i)


def test_through_a_loader_too():
    with DataLoader2(IterableWrapper(range(5)).map(make_loaded)) as loader:
        drain(loader)
    assert LOADED.alive_at_next == [0] * 5
