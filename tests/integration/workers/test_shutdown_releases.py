"""``shutdown()`` ends every thread and closes every descriptor the loader owns before it
returns, on every path: here, a worker killed while the training loop is slow (the
workers' reader then reads ahead in a thread, and the death is seen between items).

Counts are taken right after ``shutdown()`` returns, with the error (and so its
traceback) still held, as a training loop's ``except`` block holds it: nothing may be
left for the garbage collector to end. Bounds are liveness bounds, never timings.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from typing import Any

import pytest

from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.core.read_ahead import ReadAheadCosts
from conveyor.errors import WorkerError
from conveyor.observe.run_delay import run_delay_ns
from conveyor.pipes import IterableWrapper
from conveyor.workers.parent.descriptors import WakePipe

pytestmark = [pytest.mark.timeout(180), pytest.mark.timing]

READER = "conveyor-worker-reader"


def triple(x: int) -> int:
    return x * 3


def open_fds() -> dict[int, str]:
    """This process's descriptors and what each refers to."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            found[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except FileNotFoundError:  # the directory's own descriptor, closed by now
            continue
    return found


@pytest.fixture
def reads_ahead(monkeypatch: Any) -> None:
    """The workers' reader reads ahead in a thread from its first decision on, as it does
    after 16 runs when the consumer is away (a slow loop) and receiving is work: the
    verdict no longer depends on the measured costs, so the thread is there every time."""
    monkeypatch.setattr(ReadAheadCosts, "thread_pays", property(lambda self: True))
    monkeypatch.setattr(ReadAheadCosts, "thread_costs", property(lambda self: False))
    monkeypatch.setattr("conveyor.core.read_ahead._ENTRIES_PER_DECISION", 1)


def slow_loop_until_a_death(loader: DataLoader2, kill_at: int) -> tuple[WorkerError, bool]:
    """Iterate as a slow training loop does (10 ms per item), SIGKILL worker 1 at item
    ``kill_at``, go on until the death is raised; ``(the error, whether the reader's
    thread ran)``."""
    reader_ran = False
    with pytest.raises(WorkerError) as raised:
        for index, _ in enumerate(loader):
            time.sleep(0.01)
            reader_ran = reader_ran or any(t.name.startswith(READER) for t in threading.enumerate())
            if index == kill_at:
                victim = loader.reading_service._pool._workers[1].process  # type: ignore[attr-defined]
                os.kill(victim.pid, signal.SIGKILL)
    return raised.value, reader_ran


@pytest.mark.parametrize("round_", range(2))
@pytest.mark.parametrize("dispatch", [False, True], ids=["sharded", "dispatched"])
def test_after_a_death_in_a_slow_loop_shutdown_leaves_no_thread_and_no_pipe(
    reads_ahead: None, dispatch: bool, round_: int
) -> None:
    run_delay_ns()  # this thread's run-delay counter stays open by design (one per thread): open it first
    threads_before = set(threading.enumerate())
    fds_before = open_fds()
    source = IterableWrapper(range(5000))
    pipe = (source.sharding_round_robin_dispatch() if dispatch else source.sharding_filter()).map(triple)
    service = MultiProcessingReadingService(2, multiprocessing_context="fork", main_prefetch_cnt=10)
    loader = DataLoader2(pipe, reading_service=service)
    try:
        error, reader_ran = slow_loop_until_a_death(loader, kill_at=20 + 15 * round_)
    finally:
        loader.shutdown()
    threads_left = [t.name for t in threading.enumerate() if t not in threads_before]
    fds_left = {fd: what for fd, what in open_fds().items() if fds_before.get(fd) != what}
    assert "worker 1" in str(error) and "SIGKILL" in str(error)  # the error is still held here
    assert reader_ran  # the case at stake: a read-ahead thread was running when the worker died
    assert (threads_left, fds_left) == ([], {})


def test_a_wake_pipe_is_opened_and_closed_by_its_reader_and_a_wake_is_never_lost_or_misdirected() -> None:
    before = set(open_fds().items())
    wake = WakePipe()
    wake.wake()  # before the reader waits: it must still wake at once
    reader = wake.open()
    assert select.select([reader], [], [], 30)[0] == [reader]  # a liveness bound: readable at once
    ends = set(open_fds().items()) - before
    assert len(ends) == 2
    wake.close()
    wake.close()  # idempotent: whoever ends the reading may call it
    wake.wake()  # after: writes nothing (the numbers may belong to someone else by now)
    assert not ends & set(open_fds().items())
