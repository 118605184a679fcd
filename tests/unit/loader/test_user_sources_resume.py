"""A source written the torchdata way (``__iter__`` of its own, no input) resumes a
mid-epoch state by replaying: a fresh ``__iter__`` past the items it had yielded. Before,
its state was empty and a resume yielded the whole epoch again."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.errors import ResumeError
from conveyor.pipes import IterDataPipe


class Squares(IterDataPipe):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        for i in range(self.n):
            yield i * i


class Shrinking(IterDataPipe):
    """Yields fewer items each time it is iterated: it cannot be replayed."""

    def __init__(self) -> None:
        self.n = 6

    def __iter__(self) -> Iterator[int]:
        self.n -= 3
        yield from range(self.n)


class Feed(Squares):
    replayable = False


def increment(x: int) -> int:
    return x + 1


def graph(source: Any) -> Any:
    return source.sharding_filter().map(increment)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 2])
def test_a_user_source_resumes_exactly_at_every_cut(workers: int) -> None:
    def loader() -> DataLoader2:
        service = MultiProcessingReadingService(num_workers=workers) if workers else None
        return DataLoader2(graph(Squares(12)), reading_service=service)

    reference = loader()
    expected = list(reference)
    reference.shutdown()
    assert expected == [i * i + 1 for i in range(12)]
    for cut in range(len(expected) + 1):
        first = loader()
        iterator = iter(first)
        head = [next(iterator) for _ in range(cut)]
        state = json.loads(json.dumps(first.state_dict()))
        first.shutdown()
        resumed = loader()
        resumed.load_state_dict(state)
        # After the last item, the first iter() goes on into the next epoch (the same order here).
        assert (head if cut < len(expected) else []) + list(resumed) == expected, cut
        resumed.shutdown()


def test_a_source_that_replays_short_is_a_resume_error_naming_it() -> None:
    source = Shrinking()
    first = DataLoader2(source.map(increment))
    iterator = iter(first)
    next(iterator), next(iterator)
    state = first.state_dict()
    first.shutdown()
    resumed = DataLoader2(Shrinking().map(increment))
    resumed._graph.source.n = 4  # the copy the loader owns: one item on replay, two needed
    resumed.load_state_dict(state)
    with pytest.raises(ResumeError, match=r"Shrinking.*yielded 1 items when replayed"):
        list(resumed)
    resumed.shutdown()


def test_a_source_that_does_not_replay_refuses_a_mid_epoch_state() -> None:
    first = DataLoader2(Feed(5).map(increment))
    iterator = iter(first)
    next(iterator)
    state = first.state_dict()
    first.shutdown()
    resumed = DataLoader2(Feed(5).map(increment))
    resumed.load_state_dict(state)
    with pytest.raises(ResumeError, match="does not replay"):
        list(resumed)
    resumed.shutdown()
    between = DataLoader2(Feed(5).map(increment))
    assert list(between) == [1, 2, 5, 10, 17]  # between epochs it reads as any source
    between.shutdown()
