"""Self-healing workers: MultiProcessingReadingService(max_worker_restarts=n) replaces a
worker that dies with a new process resuming from the last item received from it; the
epoch's output is the same as without the death."""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.core.base import IterDataPipe
from conveyor.errors import WorkerError
from conveyor.pipes import IterableWrapper
from process_helpers import alive

pytestmark = pytest.mark.timeout(240)


def die(how: str) -> None:
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "exit":
        os._exit(3)
    elif how == "segv":
        faulthandler.disable()  # a crash in native code, without pytest's traceback dump
        os.kill(os.getpid(), signal.SIGSEGV)
    raise AssertionError(f"unknown way to die: {how}")


class DiesOnceAt:
    """``x * 2``, but the worker dies (``how``) the first time it meets each value in
    ``values``: a file in ``marks`` remembers the deaths across processes."""

    def __init__(self, marks: Path, values: tuple[int, ...] = (), how: str = "kill") -> None:
        self.marks, self.values, self.how = str(marks), values, how

    def __call__(self, x: int) -> int:
        if x in self.values:
            mark = Path(self.marks) / f"died-at-{x}"
            if not mark.exists():
                mark.touch()
                die(self.how)
        return x * 2


class BigArray:
    def __init__(self, dies: DiesOnceAt) -> None:
        self.dies = dies

    def __call__(self, x: int) -> np.ndarray:
        self.dies(x)
        return np.full(1 << 20, x % 251, dtype=np.uint8)


def always_dies_at_13(x: int) -> int:
    if x == 13:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def ints(dies: DiesOnceAt | None = None) -> IterDataPipe:
    fn = dies if dies is not None else DiesOnceAt(Path("/nonexistent"))
    return IterableWrapper(range(200)).shuffle(buffer_size=32).sharding_filter().map(fn)


def read(pipe: IterDataPipe, **service: Any) -> tuple[list[Any], tuple[dict[str, Any], ...], list[int]]:
    dl = DataLoader2(pipe, reading_service=MultiProcessingReadingService(**service))
    dl.seed(11)
    try:
        items = list(dl)
        stats = dl.stats()
        pool = dl.reading_service._pool  # type: ignore[attr-defined]
        return items, tuple(stats.worker_restarts), list(pool.pids) if pool is not None else []
    finally:
        dl.shutdown()


@pytest.fixture
def deaths(tmp_path: Path) -> Any:
    """``deaths(values, how)``: a function that makes workers die once at each value."""

    def plan(values: list[int], how: str = "kill") -> DiesOnceAt:
        return DiesOnceAt(tmp_path, tuple(values), how)

    return plan


@pytest.fixture(scope="module")
def uninterrupted() -> list[int]:
    items, restarts, _ = read(ints(), num_workers=2)
    assert not restarts
    return items


def test_the_argument_is_checked() -> None:
    for bad in (-1, True, 1.5, "2"):
        with pytest.raises(ValueError, match="max_worker_restarts"):
            MultiProcessingReadingService(2, max_worker_restarts=bad)  # type: ignore[arg-type]
    assert MultiProcessingReadingService(2).max_worker_restarts == 0


@pytest.mark.parametrize("main_prefetch_cnt", [0, 10])
@pytest.mark.parametrize("death_at", [5, 117, 198])
def test_a_killed_worker_is_replaced_and_the_epoch_is_unchanged(
    deaths: Any, uninterrupted: list[int], start_method: str, main_prefetch_cnt: int, death_at: int, caplog: Any
) -> None:
    dies = deaths([death_at])
    with caplog.at_level(logging.WARNING, logger="conveyor.workers"):
        items, restarts, pids = read(
            ints(dies),
            num_workers=2,
            multiprocessing_context=start_method,
            main_prefetch_cnt=main_prefetch_cnt,
            max_worker_restarts=1,
        )
    assert items == uninterrupted
    assert len(restarts) == 1
    (restart,) = restarts
    assert restart["worker_id"] in (0, 1) and "SIGKILL" in restart["death"] and restart["restart"] == 1
    (logged,) = [r for r in caplog.records if r.name == "conveyor.workers"]
    assert logged.levelno == logging.WARNING
    message = logged.getMessage()
    assert f"worker {restart['worker_id']}" in message and "SIGKILL" in message and "pid " in message
    assert not any(alive(pid) for pid in pids)  # the replacement ended with the loader


@pytest.mark.parametrize("how", ["exit", "segv"])
def test_any_kind_of_death_is_healed(deaths: Any, uninterrupted: list[int], how: str) -> None:
    items, restarts, _ = read(ints(deaths([40, 150], how)), num_workers=2, max_worker_restarts=5)
    assert items == uninterrupted
    assert len(restarts) == 2
    expected = "exited with code 3" if how == "exit" else "SIGSEGV"
    assert all(expected in r["death"] for r in restarts)


def test_a_worker_dying_on_the_same_item_counts_each_time_then_the_error_comes() -> None:
    pipe = IterableWrapper(range(40)).sharding_filter().map(always_dies_at_13)
    dl = DataLoader2(pipe, reading_service=MultiProcessingReadingService(2, max_worker_restarts=3))
    try:
        with pytest.raises(WorkerError, match=r"worker 1 .*SIGKILL") as info:
            list(dl)
        assert "ends the epoch" in str(info.value)
        restarts = dl.stats().worker_restarts
        assert [r["restart"] for r in restarts] == [1, 2, 3]
        assert all(r["worker_id"] == 1 for r in restarts)
    finally:
        dl.shutdown()


def test_without_restarts_a_death_is_an_error_as_before(deaths: Any) -> None:
    dl = DataLoader2(ints(deaths([60])), reading_service=MultiProcessingReadingService(2))
    try:
        with pytest.raises(WorkerError, match="SIGKILL"):
            list(dl)
        assert dl.stats().worker_restarts == ()
    finally:
        dl.shutdown()


def test_large_items_through_the_ring_survive_a_restart(deaths: Any) -> None:
    def pipe(dies: DiesOnceAt) -> IterDataPipe:
        return IterableWrapper(range(60)).sharding_filter().map(BigArray(dies))

    kept = []  # arrays the user holds across the death stay valid
    expected = [int(a[0]) for a in read(pipe(deaths([])), num_workers=2)[0]]
    dl = DataLoader2(pipe(deaths([23, 41])), reading_service=MultiProcessingReadingService(2, max_worker_restarts=2))
    try:
        for array in dl:
            kept.append(array)
        assert [int(a[0]) for a in kept] == expected
        assert all(a.shape == (1 << 20,) and int(a[-1]) == int(a[0]) for a in kept)
        assert len(dl.stats().worker_restarts) == 2
    finally:
        dl.shutdown()


def test_a_round_robin_merge_is_unchanged_too(deaths: Any) -> None:
    def pipe(dies: DiesOnceAt) -> IterDataPipe:
        return IterableWrapper(range(120)).sharding_filter().map(dies).batch(7)

    expected = read(pipe(deaths([])), num_workers=3)[0]
    items, restarts, _ = read(pipe(deaths([50])), num_workers=3, max_worker_restarts=1)
    assert items == expected and len(restarts) == 1


def test_skipped_items_are_not_recorded_twice_across_a_restart(deaths: Any) -> None:
    def read_skipping(dies: DiesOnceAt) -> tuple[list[int], list[str]]:
        def fails_or_dies(x: int) -> int:
            if x % 9 == 4:
                raise ValueError(f"bad {x}")
            return dies(x)

        pipe = IterableWrapper(range(100)).sharding_filter().map(fails_or_dies)
        dl = DataLoader2(
            pipe,
            reading_service=MultiProcessingReadingService(2, multiprocessing_context="fork", max_worker_restarts=2),
            on_error="skip",
            max_skipped=50,
        )
        try:
            return list(dl), [r["message"] for r in dl.stats().skipped]
        finally:
            dl.shutdown()

    expected = read_skipping(deaths([]))
    assert read_skipping(deaths([24, 71])) == expected


def test_a_state_taken_after_a_restart_resumes_exactly(deaths: Any, uninterrupted: list[int]) -> None:
    service = MultiProcessingReadingService(2, max_worker_restarts=1)
    dl = DataLoader2(ints(deaths([30])), reading_service=service)
    dl.seed(11)
    it = iter(dl)
    head = [next(it) for _ in range(120)]
    assert len(dl.stats().worker_restarts) == 1
    state = json.loads(json.dumps(dl.state_dict()))
    dl.shutdown()
    resumed = DataLoader2(ints(deaths([30])), reading_service=MultiProcessingReadingService(2))
    resumed.load_state_dict(state)
    try:
        assert head + list(resumed) == uninterrupted
    finally:
        resumed.shutdown()


def test_the_replacement_serves_the_next_epochs(deaths: Any) -> None:
    dl = DataLoader2(ints(deaths([77])), reading_service=MultiProcessingReadingService(2, max_worker_restarts=1))
    dl.seed(4)
    try:
        epochs = [list(dl) for _ in range(3)]
    finally:
        dl.shutdown()
    reference = DataLoader2(ints(deaths([77])), reading_service=MultiProcessingReadingService(2))
    reference.seed(4)
    try:
        assert epochs == [list(reference) for _ in range(3)]
    finally:
        reference.shutdown()


def test_dispatch_mode_does_not_restart(deaths: Any) -> None:
    pipe = IterableWrapper(range(60)).sharding_round_robin_dispatch().map(deaths([20]))
    dl = DataLoader2(pipe, reading_service=MultiProcessingReadingService(2, max_worker_restarts=3))
    try:
        with pytest.raises(WorkerError, match="SIGKILL"):
            list(dl)
    finally:
        dl.shutdown()
