"""``threadpool_map``: ``map`` in a pool of threads, in order, bounded, exactly resumable,
its threads owned by its pass."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.pipes import IterableWrapper, ThreadPoolMapper
from resume_checks import check_resume_at_every_cut

pytestmark = pytest.mark.timeout(120)


def pool_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("conveyor-threadpool-map")]


def wait_for_no_pool_threads(seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while pool_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    return not pool_threads()


def jittery_square(x: int) -> int:
    time.sleep(0.001 * ((x * 7) % 5))  # later items often finish first
    return x * x


def test_results_come_in_the_inputs_order() -> None:
    pipe = IterableWrapper(range(200)).threadpool_map(jittery_square, max_workers=8)
    assert isinstance(pipe, ThreadPoolMapper) and len(pipe) == 200
    assert list(pipe) == [x * x for x in range(200)]
    assert wait_for_no_pool_threads()


class Gauge:
    """Counts calls running at once, and the most seen."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = self.most = 0

    def __call__(self, x: int) -> int:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(0.002)
        with self.lock:
            self.now -= 1
        return x


@pytest.mark.parametrize(("scheduled", "workers", "bound"), [(128, 4, 4), (3, 16, 3), (10, None, 10)])
def test_calls_at_once_are_bounded_by_the_threads_and_the_tasks_in_flight(
    scheduled: int, workers: int | None, bound: int
) -> None:
    gauge = Gauge()
    out = list(IterableWrapper(range(60)).threadpool_map(gauge, scheduled_tasks=scheduled, max_workers=workers))
    assert out == list(range(60))
    assert 1 <= gauge.most <= bound


def test_input_and_output_columns_are_maps() -> None:
    rows = [(i, i + 1) for i in range(5)]
    assert list(IterableWrapper(rows).threadpool_map(str, input_col=1)) == [(i, str(i + 1)) for i in range(5)]
    assert list(IterableWrapper(rows).threadpool_map(str, input_col=0, output_col=-1)) == [
        (i, i + 1, str(i)) for i in range(5)
    ]


def fails_at_seven(x: int) -> int:
    if x == 7:
        raise ValueError("seven")
    time.sleep(0.001 * (x % 3))
    return x


def test_an_error_raises_in_the_inputs_order_naming_the_pipe() -> None:
    got: list[int] = []
    with pytest.raises(ValueError, match="seven") as raised:
        for x in IterableWrapper(range(30)).threadpool_map(fails_at_seven, max_workers=4):
            got.append(x)
    assert got == list(range(7))
    assert any("ThreadPoolMapper" in note for note in getattr(raised.value, "__notes__", []))
    assert wait_for_no_pool_threads()


def test_a_call_stuck_in_user_code_does_not_hold_up_the_loader() -> None:
    release = threading.Event()

    def stuck_on_two(x: int) -> int:
        if x == 2:
            release.wait(60)
        return x

    loader = DataLoader2(IterableWrapper(range(10)).threadpool_map(stuck_on_two, max_workers=2))
    it = iter(loader)
    assert [next(it), next(it)] == [0, 1]
    # shutdown() returns while the call is still stuck (it would be for 60 s): it does not
    # wait for it. The join's bound only keeps a regression from hanging the suite.
    closing = threading.Thread(target=loader.shutdown)
    closing.start()
    closing.join(30)
    assert not closing.is_alive() and not release.is_set()
    release.set()
    assert wait_for_no_pool_threads()


@pytest.mark.parametrize("tasks", [1, 4])
def test_it_resumes_at_every_cut_of_two_epochs(tasks: int) -> None:
    check_resume_at_every_cut(
        lambda: IterableWrapper(range(12)).shuffle(buffer_size=5).threadpool_map(jittery_square, scheduled_tasks=tasks),
        seed=8,
        cut_epochs=(0, 1),
    )


def test_the_output_does_not_depend_on_the_worker_count() -> None:
    def read(workers: int) -> list[Any]:
        graph = IterableWrapper(range(40)).sharding_filter().threadpool_map(jittery_square, max_workers=3)
        loader = DataLoader2(graph, reading_service=MultiProcessingReadingService(workers) if workers else None)
        try:
            return list(loader)
        finally:
            loader.shutdown()

    assert read(0) == read(2) == [x * x for x in range(40)]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"fn": 3}, "needs a callable"), ({"scheduled_tasks": 0}, "scheduled_tasks"), ({"max_workers": 0}, "max_workers")],
)
def test_it_checks_its_arguments(kwargs: dict[str, Any], message: str) -> None:
    arguments = {"fn": jittery_square, **kwargs}
    with pytest.raises((TypeError, ValueError), match=message):
        IterableWrapper(range(3)).threadpool_map(**arguments)
