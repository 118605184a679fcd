"""Pause, resume and limit on the loader (torchdata's ``_pause``/``_resume``/``_limit``,
public here) and on its iterator; ``PauseIteration`` is the ``StopIteration`` of a paused
epoch; ``PrefetchTimeoutError`` is the ``DistributedError`` of a stalled agreement."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import pytest

from conveyor import (
    DataLoader2,
    InProcessReadingService,
    MultiProcessingReadingService,
    PauseIteration,
    PrefetchTimeoutError,
)
from conveyor.errors import DistributedError
from conveyor.pipes import IterableWrapper

N = 10

SERVICES: dict[str, Callable[[], Any]] = {
    "in-process": InProcessReadingService,
    "in-process, read ahead": lambda: InProcessReadingService(5),
    "2 workers": lambda: MultiProcessingReadingService(num_workers=2),
}
GRAPHS: dict[str, Callable[[], Any]] = {
    "plain": lambda: IterableWrapper(range(N)).sharding_filter(),
    "two prefetches": lambda: IterableWrapper(range(N)).sharding_filter().prefetch().prefetch(),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("graph", list(GRAPHS))
@pytest.mark.parametrize("service", list(SERVICES))
def test_pause_then_resume_inside_a_loop_loses_nothing(service: str, graph: str) -> None:
    loader = DataLoader2(GRAPHS[graph](), reading_service=SERVICES[service]())
    seen = []
    for i, item in enumerate(loader):
        seen.append(item)
        if i in (2, N - 2):
            loader.pause()
            loader.resume()
    loader.shutdown()
    assert sorted(seen) == list(range(N))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("service", list(SERVICES))
def test_a_paused_loader_stops_yielding_until_resumed_and_saves_exactly(service: str) -> None:
    loader = DataLoader2(GRAPHS["plain"](), reading_service=SERVICES[service]())
    seen = []
    iterator = iter(loader)
    for i, item in enumerate(iterator):
        seen.append(item)
        if i == 2:
            loader.pause()
    assert len(seen) == 3
    with pytest.raises(PauseIteration, match="resume"):
        next(iterator)
    state = loader.state_dict()
    loader.resume()
    rest = list(iterator)
    loader.shutdown()
    assert seen + rest == list(range(N))
    again = DataLoader2(GRAPHS["plain"](), reading_service=SERVICES[service]())
    again.load_state_dict(state)
    assert list(again) == rest
    again.shutdown()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("service", list(SERVICES))
def test_limit_pauses_after_n_items_each_time_until_cleared(service: str) -> None:
    loader = DataLoader2(GRAPHS["two prefetches"](), reading_service=SERVICES[service]())
    iterator = iter(loader)
    loader.limit(3)
    first = list(iterator)
    with pytest.raises(StopIteration):
        next(iterator)
    iterator.resume()  # the limit holds again from here
    second = list(iterator)
    loader.limit(4)  # a new limit before resuming
    loader.resume()
    third = list(iterator)
    loader.limit(None)
    loader.resume()
    last = list(iterator)
    loader.shutdown()
    assert [len(first), len(second), len(third)] == [3, 3, 4]
    assert first + second + third + last == list(range(N))


def test_resume_and_pause_need_an_epoch_and_a_pause() -> None:
    loader = DataLoader2(IterableWrapper(range(3)))
    with pytest.raises(RuntimeError, match="no epoch is in progress to pause"):
        loader.pause()
    iterator = iter(loader)
    next(iterator)
    with pytest.raises(RuntimeError, match="not paused"):
        loader.resume()
    assert list(iterator) == [1, 2]
    with pytest.raises(RuntimeError, match="no epoch is in progress to limit"):
        loader.limit(1)  # the epoch ended
    loader.shutdown()


def test_the_error_types_are_torchdatas() -> None:
    assert issubclass(PauseIteration, StopIteration)
    error = PrefetchTimeoutError("rank 1 of 2: fullsync timed out", 30)
    assert isinstance(error, DistributedError) and isinstance(error, RuntimeError) and error.timeout == 30
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is PrefetchTimeoutError and again.timeout == 30 and str(again) == str(error)


def test_torchdatas_private_names_are_the_same_methods() -> None:
    loader = DataLoader2(IterableWrapper(range(5)))
    iterator = iter(loader)
    seen = []
    for i, item in enumerate(iterator):
        seen.append(item)
        if i == 1:
            loader._pause()
    loader._resume()
    loader._limit(2)
    seen.extend(iterator)
    loader._resume()
    seen.extend(iterator)
    loader.shutdown()
    assert seen == [0, 1, 2, 3, 4]
