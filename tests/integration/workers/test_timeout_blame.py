"""A timeout names the workers that hold the epoch up, and says what the others wait for.

In dispatch mode the reader listens to every worker (the dispatcher needs each one's
progress), so when one is stuck every worker has been silent: the error used to name
them all, the healthy ones too. Bounds are liveness bounds, never timings.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from conveyor import DataLoader, DataLoader2, MultiProcessingReadingService
from conveyor.errors import WorkerError
from conveyor.pipes import IterableWrapper
from conveyor.workers.parent.merge import Merge
from conveyor.workers.transport.chunk_states import ChunkStates

pytestmark = pytest.mark.timeout(120)

STUCK = 7  # dispatched round-robin to worker 1 of 2


def stuck_at_seven(x: int) -> int:
    if x == STUCK:
        time.sleep(3600)  # shutdown() ends it
    return x


class StuckAtSeven:
    """A map-style dataset whose item 7 never comes."""

    def __len__(self) -> int:
        return 400

    def __getitem__(self, i: int) -> int:
        return stuck_at_seven(i)


def timeout_error(kind: str) -> tuple[WorkerError, list[int]]:
    """Read until the timeout: ``(the error, the workers' pids)``."""
    if kind == "DataLoader":  # torch's interface: the main process dispatches the keys
        loader: Any = DataLoader(StuckAtSeven(), batch_size=1, num_workers=2, timeout=2, multiprocessing_context="fork")
    else:
        pipe = IterableWrapper(range(400)).sharding_round_robin_dispatch().map(stuck_at_seven)
        service = MultiProcessingReadingService(
            2, multiprocessing_context="fork", timeout=2, in_order=kind == "DataLoader2 in order"
        )
        loader = DataLoader2(pipe, reading_service=service)
    try:
        with pytest.raises(WorkerError) as raised:
            list(loader)
        inner = loader if isinstance(loader, DataLoader2) else loader._loader
        return raised.value, list(inner.reading_service._pool.pids)
    finally:
        loader.shutdown()


@pytest.mark.timing
@pytest.mark.parametrize("kind", ["DataLoader2 in order", "DataLoader2 first come", "DataLoader"])
def test_a_timeout_in_dispatch_mode_names_the_stuck_worker_and_what_the_other_waits_for(kind: str) -> None:
    error, (healthy, stuck) = timeout_error(kind)
    message = str(error)
    assert message.startswith(f"worker 1 (pid {stuck}) sent nothing within 2.0s (the timeout)"), message
    # The healthy worker is named only with what it waits for: the stuck one's next item
    # (its own output comes after it), or nothing at all, its share sent.
    waits = re.search(rf"Meanwhile worker 0 \(pid {healthy}\) (waits for worker 1|has sent its whole share)", message)
    assert waits, message
    assert message.count(f"pid {healthy}") == 1
    assert len(message) < 1000
    assert type(error).__name__ == "WorkerTimeoutError" and error.worker_ids == [1]  # type: ignore[attr-defined]


class Worker:
    """What the pool's error needs of a worker."""

    def __init__(self, worker_id: int) -> None:
        self.worker_id = worker_id
        self.label = f"worker {worker_id} (pid {1000 + worker_id})"


def send(merge: Merge, lane: int, positions: list[int]) -> None:
    merge.add_chunk(lane, positions, [(p,) for p in positions], ChunkStates([{}] * len(positions), len(positions) - 1))


def test_an_in_order_merge_blames_the_lane_it_waits_for_and_the_message_stays_short() -> None:
    from conveyor.workers.parent.pool_errors import silence_error

    workers = [Worker(w) for w in range(40)]
    merge = Merge(40, in_order=True, positional=True)
    for lane in range(40):
        if lane != 3:  # every lane but 3 sent its first item and the next round's
            send(merge, lane, [lane, lane + 40])
    merge.end_lane(0)
    run, _ = merge.take_run()
    assert [entry[3] for entry in run] == [(0,), (1,), (2,)]  # then position 3 is awaited
    error = silence_error(workers, None, set(), 2.0, merge)
    message = str(error)
    assert error.worker_ids == [3]
    assert message.startswith("worker 3 (pid 1003) sent nothing within 2.0s (the timeout) and holds the epoch up")
    ahead = "after worker 3's next item"
    assert f"worker 0 (pid 1000) has sent its whole share of the epoch; the item it sent comes {ahead};" in message
    assert f"worker 1 (pid 1001) waits for worker 3: the item it sent comes {ahead} in the output order" in message
    assert f"worker 4 (pid 1004) waits for worker 3: the 2 items it sent come {ahead} in the output order" in message
    assert "35 more workers hold nothing up either" in message and "pid 1039" not in message
    assert len(message) < 1500


def test_a_worker_still_starting_holds_things_up_and_without_a_merge_every_silent_worker_is_named() -> None:
    from conveyor.workers.parent.pool_errors import silence_error

    workers = [Worker(w) for w in range(3)]
    merge = Merge(3, in_order=True, positional=False)  # a strict round robin: lane 0's turn
    error = silence_error(workers, None, {2}, 1.0, merge)
    assert error.worker_ids == [0, 2]
    assert "Meanwhile worker 1 (pid 1001) waits its turn: its next item comes after their next items." in str(error)
    plain = silence_error(workers, [1], set(), 1.0, None)
    assert str(plain).startswith("worker 1 (pid 1001) sent nothing within 1.0s (the timeout); a stage may be stuck.")
