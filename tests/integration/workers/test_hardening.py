"""Failures are errors, never hangs, orphans or wrong order: shutdown with a stage stuck
forever, errors after the items before them, a death raised at once, workers that end
with their parent, no fork while a thread of ours runs.

Bounds here are liveness bounds (pytest's timeout, or a generous deadline for a process
to be gone), never performance assertions.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from typing import Any

import pytest

from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.errors import WorkerError
from conveyor.pipes import IterableWrapper, IterDataPipe
from process_helpers import alive

pytestmark = [pytest.mark.timeout(120), pytest.mark.timing]


def stuck_on_three(pair: tuple[int, bytes]) -> int:
    if pair[0] == 3:
        time.sleep(3600)
    return pair[0]


def big_items(count: int) -> IterableWrapper:
    return IterableWrapper([(i, bytes(200_000)) for i in range(count)], deepcopy=False)


# --- 1. shutdown and interpreter exit with a stage stuck forever -------------------------


def test_shutdown_returns_with_a_stage_stuck_forever_in_dispatch_mode(start_method: str) -> None:
    """The timeout error arrives; then shutdown() must return although the worker sleeps
    for an hour and its request pipe is full of dispatched items (it hung forever)."""
    pipe = big_items(1000).sharding_round_robin_dispatch().map(stuck_on_three)
    loader = DataLoader2(
        pipe, reading_service=MultiProcessingReadingService(1, multiprocessing_context=start_method, timeout=3)
    )
    with pytest.raises(WorkerError, match=r"within 3\.0s"):
        list(loader)
    loader.shutdown()
    assert not multiprocessing.active_children()


def test_shutdown_returns_with_a_stage_stuck_forever_when_sharded(start_method: str) -> None:
    pipe = big_items(40).sharding_filter().map(stuck_on_three)
    loader = DataLoader2(
        pipe, reading_service=MultiProcessingReadingService(2, multiprocessing_context=start_method, timeout=3)
    )
    with pytest.raises(WorkerError, match=r"within 3\.0s"):
        list(loader)
    loader.shutdown()
    assert not multiprocessing.active_children()


EXIT_WITHOUT_SHUTDOWN = """
import sys, time
from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.pipes import IterableWrapper

def stuck(pair):
    if pair[0] == 3:
        time.sleep(3600)
    return pair[0]

if __name__ == "__main__":
    pipe = IterableWrapper([(i, bytes(200_000)) for i in range(1000)], deepcopy=False)
    pipe = pipe.sharding_round_robin_dispatch().map(stuck)
    service = MultiProcessingReadingService(1, multiprocessing_context=sys.argv[1], timeout=2)
    loader = DataLoader2(pipe, reading_service=service)
    try:
        list(loader)
    except Exception as error:
        print("raised", type(error).__name__, flush=True)
    print("pids", *loader.reading_service._pool.pids, flush=True)
    # no shutdown(): the interpreter's exit must end the worker
"""


def test_interpreter_exit_ends_a_stuck_worker(tmp_path: Any, start_method: str) -> None:
    script = tmp_path / "exit_without_shutdown.py"
    script.write_text(EXIT_WITHOUT_SHUTDOWN)
    done = subprocess.run(
        [sys.executable, str(script), start_method], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "raised WorkerTimeoutError" in done.stdout  # a WorkerError: the one for a timeout
    pids = [int(p) for p in done.stdout.split("pids", 1)[1].split()]
    assert wait_until_gone(pids, 30) == []


# --- 6. errors in order -------------------------------------------------------------------


class BreaksAtEight(IterDataPipe):
    """A once-only source whose 8th item cannot be read."""

    def __init__(self, source: IterDataPipe) -> None:
        self.source = source

    def __iter__(self):
        for item in self.source:
            if item == 7:
                raise OSError("the stream broke at its 8th item")
            yield item


def items_before_the_error(loader: DataLoader2) -> list[Any]:
    got: list[Any] = []
    with pytest.raises(Exception, match=r"8th item|bad item 7"):
        for item in loader:
            got.append(item)
    return got


def test_a_dispatchers_error_comes_after_every_item_read_before_it() -> None:
    in_process = DataLoader2(BreaksAtEight(IterableWrapper(range(20))).sharding_round_robin_dispatch())
    assert items_before_the_error(in_process) == list(range(7))
    for workers, prefetch in ((1, 10), (3, 0), (2, 1)):
        service = MultiProcessingReadingService(workers, worker_prefetch_cnt=prefetch)
        with DataLoader2(
            BreaksAtEight(IterableWrapper(range(20))).sharding_round_robin_dispatch(), reading_service=service
        ) as loader:
            assert sorted(items_before_the_error(loader)) == list(range(7)), (workers, prefetch)


def bad_seven(x: int) -> int:
    if x == 7:
        raise ValueError(f"bad item {x}")
    return x


@pytest.mark.parametrize("workers", [2, 3])
def test_a_workers_error_comes_after_the_items_before_it(workers: int) -> None:
    """In order: the single-process output up to the failing item, then the error, whoever
    ran it and whenever its message came."""
    in_process = DataLoader2(IterableWrapper(range(20)).sharding_filter().map(bad_seven))
    assert items_before_the_error(in_process) == list(range(7))
    for prefetch in (0, 1, 10):
        service = MultiProcessingReadingService(workers, worker_prefetch_cnt=prefetch)
        with DataLoader2(
            IterableWrapper(range(20)).sharding_filter().map(bad_seven), reading_service=service
        ) as loader:
            assert items_before_the_error(loader) == list(range(7)), prefetch


# --- 10. a death reported at once ---------------------------------------------------------


def test_a_death_is_raised_at_the_next_item_and_the_state_names_the_last_one() -> None:
    """A consumer that takes its time: the workers have sent far more than it read when
    one is killed; the next item raises, and the state resumes exactly."""
    pipe = IterableWrapper(range(400)).sharding_filter().map(lambda x: x * 3)
    service = MultiProcessingReadingService(2)
    loader = DataLoader2(pipe, reading_service=service)
    iterator = iter(loader)
    head = []
    for _ in range(4):
        head.append(next(iterator))
        time.sleep(0.3)  # a training step: the workers run far ahead meanwhile
    victim = loader.reading_service._pool._workers[1].process
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(30)
    with pytest.raises(WorkerError, match=r"worker 1 \(pid \d+\) was killed by signal SIGKILL"):
        next(iterator)
    state = json.loads(json.dumps(loader.state_dict()))
    loader.shutdown()
    with DataLoader2(
        IterableWrapper(range(400)).sharding_filter().map(lambda x: x * 3),
        reading_service=MultiProcessingReadingService(2),
    ) as resumed:
        resumed.load_state_dict(state)
        assert head + list(resumed) == [x * 3 for x in range(400)]


# --- 9. no orphans ------------------------------------------------------------------------

ORPHANS = """
import os, signal, sys, threading, time
from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.pipes import IterableWrapper

context, starter, stage, marks = sys.argv[1:]

def long_call(x):
    if x >= 2:
        open(os.path.join(marks, str(os.getpid())), "w").close()  # inside the call from here on
        if stage == "sleep":
            time.sleep(300)  # lets the GIL go
        else:
            sum(range(10**12))  # one C call that never lets the GIL go (hours)
    return x

def run():
    pipe = IterableWrapper(range(100)).sharding_filter().map(long_call)
    service = MultiProcessingReadingService(2, multiprocessing_context=context, max_worker_restarts=1)
    loader = DataLoader2(pipe, reading_service=service)
    iterator = iter(loader)
    next(iterator)
    next(iterator)
    pool = loader.reading_service._pool
    pool.start_remaining()
    if starter == "restart":  # worker 1 is killed, then replaced by another thread's next()
        first = pool.pids
        os.kill(first[1], signal.SIGKILL)
        pool._workers[1].process.join(30)
        threading.Thread(target=next, args=(iterator,), daemon=True).start()
        deadline = time.monotonic() + 60
        while pool.pids == first and time.monotonic() < deadline:
            time.sleep(0.01)
    print("pids", *pool.pids, flush=True)
    time.sleep(300)

if __name__ == "__main__":
    if starter == "thread":  # joined: from 3.12 on, a process that is exiting cannot fork
        loader_thread = threading.Thread(target=run)
        loader_thread.start()
        loader_thread.join()
    else:
        run()
"""


def wait_until_gone(pids: list[int], seconds: float) -> list[int]:
    """The pids still running (not zombies) after waiting up to ``seconds`` for them."""
    deadline = time.monotonic() + seconds
    while True:
        remaining = [pid for pid in pids if alive(pid)]
        if not remaining or time.monotonic() > deadline:
            return remaining
        time.sleep(0.05)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("stage", ["sleep", "gil"])
@pytest.mark.parametrize("thread", ["main", "thread"])
def test_workers_end_with_their_parent_whatever_they_run(
    tmp_path: Any, start_method: str, thread: str, stage: str
) -> None:
    """The main process, having started its workers from its main thread or another one,
    is SIGKILLed while both workers are inside a long user call: one that sleeps, or one
    that holds the GIL (a C loop inside the interpreter, so no thread of the worker can
    run). They must end within seconds: before, they lived out the sleep, and the
    GIL-holding call under every start method but fork and spawn from the main thread."""
    assert orphan_drill(tmp_path, start_method, thread, stage) == []


@pytest.mark.timeout(180)
def test_a_replaced_worker_ends_with_its_parent_whatever_it_runs(tmp_path: Any, start_method: str) -> None:
    """``max_worker_restarts``: worker 1 is killed and replaced (by a thread that is not
    the main one) while the other holds the GIL; the main process is then SIGKILLed while
    both, the replacement included, hold the GIL. Both must end."""
    assert orphan_drill(tmp_path, start_method, "restart", "gil") == []


def orphan_drill(tmp_path: Any, context: str, starter: str, stage: str) -> list[int]:
    """Run :data:`ORPHANS`, SIGKILL its main process once both workers are inside their
    long call; the workers still running 20 s later (killed then, to leave nothing)."""
    script, marks = tmp_path / "orphans.py", tmp_path / "inside"
    script.write_text(ORPHANS)
    marks.mkdir()
    main = subprocess.Popen(
        [sys.executable, str(script), context, starter, stage, str(marks)], stdout=subprocess.PIPE, text=True
    )
    pids: list[int] = []
    try:
        line = main.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("pids"), line
        pids = [int(p) for p in line.split()[1:]]
        assert len(pids) == 2 and all(alive(pid) for pid in pids)
        assert wait_for_marks(marks, pids, 60) == sorted(pids)  # both are inside the call
        main.kill()
        main.wait(30)
        return wait_until_gone(pids, 20)
    finally:
        if main.poll() is None:
            main.kill()
            main.wait(30)
        for pid in pids:  # a failure leaves nothing spinning for hours
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def wait_for_marks(marks: Any, pids: list[int], seconds: float) -> list[int]:
    """The workers (of ``pids``) that marked entering their long call, once all did or
    after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        inside = sorted(int(name) for name in os.listdir(marks) if int(name) in pids)
        if inside == sorted(pids) or time.monotonic() > deadline:
            return inside
        time.sleep(0.02)


# --- 7. no fork while a thread of ours runs -----------------------------------------------


def conveyor_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("conveyor"))


class MainOnly(IterDataPipe):
    replicable = False

    def __init__(self, source: IterDataPipe) -> None:
        self.source = source

    def __iter__(self):
        yield from self.source


@pytest.mark.parametrize(
    "build",
    [
        lambda: IterableWrapper(range(300)).sharding_filter().map(abs),
        lambda: MainOnly(IterableWrapper(range(300)).sharding_filter().map(abs)).prefetch(4),
        lambda: IterableWrapper(range(300)).sharding_round_robin_dispatch().map(abs),
    ],
    ids=["sharded", "main-side prefetch", "dispatch"],
)
def test_no_worker_is_forked_while_a_thread_of_ours_runs(monkeypatch: Any, build: Any) -> None:
    import conveyor.workers.parent.process as process

    seen: list[list[str]] = []
    real_start = process.WorkerProcess.start

    def start(self: Any, *args: Any, **kwargs: Any) -> None:
        seen.append(conveyor_threads())
        real_start(self, *args, **kwargs)

    monkeypatch.setattr(process.WorkerProcess, "start", start)
    before = conveyor_threads()
    service = MultiProcessingReadingService(3, multiprocessing_context="fork", main_prefetch_cnt=2)
    with DataLoader2(build(), reading_service=service) as loader:
        for epoch in range(2):
            assert sorted(loader) == list(range(300)), epoch
    assert len(seen) == 3
    # Threads of earlier tests may still be ending: none of this loader's may run at a fork
    # (one of theirs that ended meanwhile is no fault).
    assert all(set(names) <= set(before) for names in seen), (before, seen)


@pytest.mark.parametrize(
    "build",
    [
        lambda: MainOnly(IterableWrapper(range(300)).sharding_filter().map(abs)).prefetch(4),
        lambda: IterableWrapper(range(300)).sharding_round_robin_dispatch().map(abs),
    ],
    ids=["main-side prefetch", "dispatch"],
)
def test_forking_workers_draws_no_warning_from_python(build: Any) -> None:
    """From Python 3.12 on, ``os.fork`` warns (DeprecationWarning) when the process has
    other threads; the suite runs under 3.12 and 3.13 too, where this would catch one."""
    service = MultiProcessingReadingService(3, multiprocessing_context="fork", main_prefetch_cnt=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with DataLoader2(build(), reading_service=service) as loader:
            for epoch in range(2):
                assert sorted(loader) == list(range(300)), epoch
    assert [str(w.message) for w in caught if "fork" in str(w.message)] == []
