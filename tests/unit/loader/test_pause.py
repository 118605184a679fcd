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


# --- pause() and resume() on the prefetch and fullsync pipes --------------------------------


class Counted:
    """A map function that counts the items it was called on (read in the prefetch thread)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, x: int) -> int:
        self.calls += 1
        return x


def wait_for(condition: Callable[[], bool], seconds: float = 20.0) -> bool:
    import time

    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.mark.timing
@pytest.mark.timeout(60)
def test_a_paused_prefetch_reads_nothing_ahead_and_still_yields_on_demand() -> None:
    import time

    counted = Counted()
    pipe = IterableWrapper(range(100)).map(counted).prefetch(5)
    it = iter(pipe)
    assert next(it) == 0
    assert wait_for(lambda: counted.calls >= 6)  # the thread filled its buffer
    pipe.pause()
    settled = counted.calls
    time.sleep(0.3)
    assert counted.calls - settled <= 1  # at most the item it was reading when paused
    ahead = counted.calls
    assert [next(it) for _ in range(ahead + 3)] == list(range(1, ahead + 4))  # buffered, then on demand
    assert counted.calls == ahead + 4  # on demand: items 0 to ahead + 3, exactly what was asked for
    pipe.resume()
    assert next(it) == ahead + 4
    assert wait_for(lambda: counted.calls >= ahead + 4 + 5)  # reading ahead again
    assert list(it) == list(range(ahead + 5, 100))


@pytest.mark.timeout(60)
def test_a_new_iteration_of_a_paused_prefetch_does_not_wait() -> None:
    pipe = IterableWrapper(range(20)).prefetch(2)
    it = iter(pipe)
    next(it)
    pipe.pause()
    again = iter(pipe)  # torchdata's "reset while paused"
    assert list(again) == list(range(20))
    pipe.resume()  # a fresh pass is not paused: resuming it changes nothing
    assert list(it) == list(range(1, 20))


@pytest.mark.timeout(60)
def test_a_state_taken_while_a_prefetch_is_paused_resumes_exactly() -> None:
    def graph() -> Any:
        return IterableWrapper(range(30)).shuffle(buffer_size=8).prefetch(4).map(lambda x: x * 2)

    uninterrupted = DataLoader2(graph())
    uninterrupted.seed(0)
    full = list(uninterrupted)
    uninterrupted.shutdown()
    loader = DataLoader2(graph())
    loader.seed(0)
    it = iter(loader)
    head = [next(it) for _ in range(9)]
    loader.pause()
    state = loader.state_dict()
    loader.shutdown()
    again = DataLoader2(graph())
    again.load_state_dict(state)
    assert head + list(again) == full
    again.shutdown()


@pytest.mark.timing
@pytest.mark.timeout(60)
def test_pausing_the_loader_stops_the_graphs_prefetch_threads() -> None:
    import time

    loader = DataLoader2(IterableWrapper(range(60)).map(Counted()).prefetch(5))
    it = iter(loader)
    counted = loader.datapipe.source.fn  # the loader's own copy of the graph
    next(it)
    assert wait_for(lambda: counted.calls >= 6)
    loader.pause()
    settled = counted.calls
    time.sleep(0.3)
    assert counted.calls - settled <= 1
    with pytest.raises(PauseIteration):
        next(it)
    loader.resume()
    assert list(it) == list(range(1, 60))
    loader.shutdown()
