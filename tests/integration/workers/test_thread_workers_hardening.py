"""Thread workers never hang the caller: a stage stuck forever still lets ``shutdown()``
return (the thread is left to end on its own, harmless), the interpreter's exit does not
wait for it, nothing is left after a normal shutdown, and every wait is bounded.

Bounds here are liveness bounds (``shutdown()``'s documented two seconds, pytest's timeout,
a generous deadline for a thread to be gone), never performance assertions."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.errors import WorkerError
from conveyor.pipes import IterableWrapper

pytestmark = [pytest.mark.timeout(120), pytest.mark.timing]

#: What shutdown() promises whatever the stages do (it waits 0.5 s for thread workers).
SHUTDOWN_BOUND_S = 2.0

RELEASE = threading.Event()  # the stuck stages wait on it: "forever", until the test ends


def stuck_on_three(x: int) -> int:
    if x == 3:
        RELEASE.wait()
    return x


def worker_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("conveyor-thread-worker")]


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def gone_within(seconds: float) -> list[threading.Thread]:
    """The thread workers still running after waiting up to ``seconds`` for them to end."""
    deadline = time.monotonic() + seconds
    while worker_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    return worker_threads()


@pytest.fixture
def released() -> Iterator[None]:
    """Lets every stuck stage go at the end of the test; the thread must then end by itself."""
    RELEASE.clear()
    try:
        yield
    finally:
        RELEASE.set()
        assert gone_within(30) == []


def threads(workers: int = 2, **options: Any) -> MultiProcessingReadingService:
    return MultiProcessingReadingService(workers, worker_type="thread", **options)


def timed_shutdown(loader: DataLoader2) -> float:
    started = time.monotonic()
    loader.shutdown()
    return time.monotonic() - started


@pytest.mark.parametrize("dispatch", [False, True], ids=["sharded", "dispatched"])
def test_shutdown_returns_with_a_stage_stuck_forever(released: None, dispatch: bool) -> None:
    source = IterableWrapper(range(1000))
    pipe = (source.sharding_round_robin_dispatch() if dispatch else source.sharding_filter()).map(stuck_on_three)
    loader = DataLoader2(pipe, reading_service=threads(timeout=2))
    with pytest.raises(WorkerError, match=r"thread worker 1 sent nothing within 2\.0s"):
        list(loader)
    assert timed_shutdown(loader) < SHUTDOWN_BOUND_S
    stuck = worker_threads()
    assert [t.name for t in stuck] == ["conveyor-thread-worker-1"]  # left to end on its own ...
    RELEASE.set()
    assert gone_within(30) == []  # ... which it does at its next look


def test_shutdown_mid_epoch_with_a_stage_stuck_forever_and_no_timeout(released: None) -> None:
    loader = DataLoader2(IterableWrapper(range(100)).sharding_filter().map(stuck_on_three), reading_service=threads())
    iterator = iter(loader)
    assert [next(iterator) for _ in range(3)] == [0, 1, 2]  # the next one is stuck
    assert timed_shutdown(loader) < SHUTDOWN_BOUND_S
    with pytest.raises(RuntimeError, match="invalidated"):
        next(iterator)


@pytest.mark.parametrize("dispatch", [False, True], ids=["sharded", "dispatched"])
def test_nothing_is_left_after_a_normal_shutdown(dispatch: bool) -> None:
    before = open_fds()
    source = IterableWrapper(range(300))
    pipe = (source.sharding_round_robin_dispatch() if dispatch else source.sharding_filter()).map(abs)
    loader = DataLoader2(pipe, reading_service=threads(3))
    for _ in range(2):
        assert sorted(loader) == list(range(300))
    iterator = iter(loader)
    next(iterator)  # and mid-epoch
    assert len(worker_threads()) == 3
    assert timed_shutdown(loader) < SHUTDOWN_BOUND_S
    assert worker_threads() == []  # joined, not left behind
    assert open_fds() == before


def test_garbage_collection_ends_the_threads() -> None:
    loader = DataLoader2(IterableWrapper(range(100)).sharding_filter(), reading_service=threads())
    iterator = iter(loader)
    next(iterator)
    assert len(worker_threads()) == 2
    del loader, iterator
    gc.collect()
    assert gone_within(5) == []


EXITS = threading.Event()


def exits_on_five(x: int) -> int:
    """``sys.exit()`` in a stage, while :data:`EXITS` is set."""
    if x == 5 and EXITS.is_set():
        raise SystemExit(3)
    return x * 3


def test_an_ended_thread_is_raised_at_the_next_item_and_the_state_resumes_exactly() -> None:
    EXITS.set()
    loader = DataLoader2(IterableWrapper(range(100)).sharding_filter().map(exits_on_five), reading_service=threads())
    head = []
    try:
        with pytest.raises(WorkerError, match=r"thread worker 1 ended: SystemExit: 3 escaped its pipeline"):
            for item in loader:
                head.append(item)
    finally:
        EXITS.clear()
    # Raised as soon as it is seen (items that had arrived wait), the state naming the last
    # item handed out: a restart from it is exact.
    assert head == [x * 3 for x in range(len(head))] and len(head) <= 5
    state = json.loads(json.dumps(loader.state_dict()))
    loader.shutdown()
    assert worker_threads() == []
    rest = DataLoader2(IterableWrapper(range(100)).sharding_filter().map(exits_on_five), reading_service=threads())
    rest.load_state_dict(state)
    assert list(rest) == [x * 3 for x in range(len(head), 100)]
    rest.shutdown()


EXIT_WITH_A_STUCK_THREAD = """
import sys, time
from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.pipes import IterableWrapper

def stuck(x):
    if x == 3:
        time.sleep(3600)
    return x

if __name__ == "__main__":
    # A job started in the background by a non-interactive shell inherits SIGINT ignored,
    # and Python then installs no KeyboardInterrupt handler: install it (as a terminal has).
    import signal
    signal.signal(signal.SIGINT, signal.default_int_handler)
    source = IterableWrapper(range(1000))
    pipe = (source.sharding_round_robin_dispatch() if sys.argv[1] == "dispatched" else source.sharding_filter())
    service = MultiProcessingReadingService(2, worker_type="thread", timeout=float(sys.argv[2]) or None)
    loader = DataLoader2(pipe.map(stuck), reading_service=service)
    iterator = iter(loader)
    try:
        for item in iterator:
            print("item", item, flush=True)
    except Exception as error:
        print("raised", type(error).__name__, flush=True)
    # no shutdown(): the interpreter's exit must not wait for the stuck thread
"""


@pytest.mark.parametrize("dispatch", ["sharded", "dispatched"])
@pytest.mark.parametrize("timeout", [1.0, 0.0], ids=["after a timeout", "while waiting"])
def test_interpreter_exit_does_not_wait_for_a_stuck_thread_worker(tmp_path: Any, dispatch: str, timeout: float) -> None:
    script = tmp_path / "exit_with_a_stuck_thread.py"
    script.write_text(EXIT_WITH_A_STUCK_THREAD)
    if timeout:
        done = subprocess.run(
            [sys.executable, str(script), dispatch, str(timeout)], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        assert "raised WorkerTimeoutError" in done.stdout  # a WorkerError: the one for a timeout
        return
    # No timeout: the consumer waits for the stuck item; the process is told to exit (as
    # by Ctrl-C: SIGINT raises KeyboardInterrupt in the main thread) and must.
    process = subprocess.Popen(
        [sys.executable, str(script), dispatch, "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        assert [process.stdout.readline() for _ in range(3)] == ["item 0\n", "item 1\n", "item 2\n"]
        time.sleep(0.2)  # the consumer now waits on the workers
        process.send_signal(2)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
    assert "KeyboardInterrupt" in err, err
