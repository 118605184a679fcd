"""Reading services written by users: ``initialize()`` may hand back any iterable, and a
service that is not checkpointable still lets the loader save its own state (the
service's part is ``None``), as torchdata's ``DataLoader2`` does."""

from __future__ import annotations

import json
from typing import Any

import pytest

from conveyor import DataLoader2, ReadingServiceInterface
from conveyor.errors import StateError
from conveyor.graph import apply_random_seed
from conveyor.pipes import IterableWrapper


class AsList(ReadingServiceInterface):
    """Reads the whole graph into a list at initialize()."""

    def initialize(self, datapipe: Any) -> Any:
        return [item * 10 for item in datapipe]


class AsIs(ReadingServiceInterface):
    """Hands the graph back, seeds it each epoch, and counts the epochs."""

    def __init__(self) -> None:
        self.iterations = 0
        self.graph: Any = None

    def initialize(self, datapipe: Any) -> Any:
        self.graph = datapipe
        return datapipe

    def initialize_iteration(self, seed_generator: Any, iter_reset_fn: Any = None) -> Any:
        self.iterations += 1
        apply_random_seed(self.graph, seed_generator)
        return None


def test_initialize_may_return_any_iterable() -> None:
    loader = DataLoader2(IterableWrapper(range(5)), reading_service=AsList())
    assert list(loader) == [0, 10, 20, 30, 40]
    assert list(loader) == [0, 10, 20, 30, 40]  # each epoch iterates it again
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    assert state["in_progress"] and state["reading_service"] is None and state["pipeline"] is None
    json.dumps(state)
    loader.shutdown()
    # Where a list stood is not known: such a state is refused, never resumed wrongly.
    fresh = DataLoader2(IterableWrapper(range(5)), reading_service=AsList())
    with pytest.raises(StateError, match="save between epochs"):
        fresh.load_state_dict(state)
    fresh.shutdown()


def test_a_service_that_is_not_checkpointable_still_saves_and_resumes_the_loader() -> None:
    def graph() -> Any:
        return IterableWrapper(range(20)).shuffle().map(str)

    loader = DataLoader2(graph(), reading_service=AsIs())
    loader.seed(9)
    assert loader.state_dict()["reading_service"] is None  # before the first epoch
    iterator = iter(loader)
    head = [next(iterator) for _ in range(7)]
    state = json.loads(json.dumps(loader.state_dict()))
    rest = list(iterator)
    between = loader.state_dict()
    loader.shutdown()
    assert state["reading_service"] is None and state["in_progress"]
    assert sorted(head + rest, key=int) == [str(i) for i in range(20)]

    resumed = DataLoader2(graph(), reading_service=AsIs())
    resumed.load_state_dict(state)
    assert list(resumed) == rest
    assert resumed.reading_service.iterations == 1
    resumed.shutdown()

    after = DataLoader2(graph(), reading_service=AsIs())
    after.load_state_dict(between)
    assert after.state_dict()["epoch"] == 1 and len(list(after)) == 20
    after.shutdown()


def test_a_mid_epoch_state_without_the_services_part_is_refused_by_a_checkpointable_service() -> None:
    loader = DataLoader2(IterableWrapper(range(10)), reading_service=AsIs())
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    loader.shutdown()
    checkpointable = DataLoader2(IterableWrapper(range(10)))
    with pytest.raises(StateError, match="without a reading service's state"):
        checkpointable.load_state_dict(state)
    checkpointable.shutdown()


class Tagged(IterableWrapper):
    tag = "from the pipe"

    def describe(self) -> str:
        return f"{self.tag}: {len(self._iterable)} items"


class Items:
    """An iterator with a method of its own, as a service might hand back."""

    def __init__(self, n: int) -> None:
        self._left = iter(range(n))
        self.remaining_hint = n

    def __iter__(self) -> Items:
        return self

    def __next__(self) -> int:
        return next(self._left)


class HandsBackItems(ReadingServiceInterface):
    def initialize(self, datapipe: Any) -> Any:
        return Items(3)


def test_the_iterator_delegates_unknown_attributes_to_what_it_reads() -> None:
    loader = DataLoader2(Tagged(range(4)))
    iterator = iter(loader)
    assert iterator.describe() == "from the pipe: 4 items" and iterator.tag == "from the pipe"
    with pytest.raises(AttributeError, match="nor has the pipe it reads"):
        iterator.no_such_thing  # noqa: B018
    loader.shutdown()
    other = DataLoader2(IterableWrapper(range(3)), reading_service=HandsBackItems())
    iterator = iter(other)
    assert iterator.remaining_hint == 3 and list(iterator) == [0, 1, 2]
    other.shutdown()


class OneArgument(ReadingServiceInterface):
    """torchdata's own tests write ``initialize_iteration(self, seed_generator)``."""

    def __init__(self) -> None:
        self.seeds: list[int] = []

    def initialize(self, datapipe: Any) -> Any:
        return datapipe

    def initialize_iteration(self, seed_generator: Any) -> None:  # type: ignore[override]
        self.seeds.append(seed_generator.generate_shared_seed())


def test_initialize_iteration_with_one_parameter_works_alone_and_in_sequence() -> None:
    from conveyor import SequentialReadingService

    loader = DataLoader2(IterableWrapper(range(3)), reading_service=OneArgument())
    loader.seed(1)
    assert [list(loader), list(loader)] == [[0, 1, 2], [0, 1, 2]]
    alone = loader.reading_service.seeds  # the loader works on its own copy of the service
    assert len(alone) == 2 and alone[0] != alone[1]
    loader.shutdown()
    sequence = SequentialReadingService(OneArgument(), OneArgument())
    loader = DataLoader2(IterableWrapper(range(3)), reading_service=sequence)
    loader.seed(1)
    assert list(loader) == [0, 1, 2]
    first, second = loader.reading_service.reading_services
    assert len(first.seeds) == len(second.seeds) == 1  # each was called, with one argument
    loader.shutdown()
