"""The merge's choice of which workers to wait for, and a pool that listens only to them."""

from __future__ import annotations

import itertools
import os
import signal
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conveyor.errors import WorkerError
from conveyor.pipes import IterableWrapper
from conveyor.random import SeedGenerator
from conveyor.workers.parent.merge import POSITION, Merge
from conveyor.workers.parent.pool import WorkerPool
from conveyor.workers.transport.chunk_states import ChunkStates
from conveyor.workers.transport.protocol import Chunk, Ready
from hypothesis_profiles import scaled

pytestmark = pytest.mark.timeout(60)


def chunk(*positions: int) -> tuple[tuple[object, ...], tuple[object, ...], ChunkStates]:
    """A worker's chunk of those positions, as the main process receives it."""
    states = ChunkStates.of(tuple({"at": p} for p in positions)).snapshot()
    return tuple(f"item {p}" for p in positions), tuple((p,) for p in positions), states


def decoded(pool: WorkerPool, received: list[tuple[int, object]]) -> list[tuple[int, object]]:
    """What ``pool.receive`` returned, decoded as the merge reads it, without the Ready
    messages (which the pool is told of, as the merge does)."""
    messages = []
    for worker, frame in received:
        message = pool.decoder(worker)(frame)
        if isinstance(message, Ready):
            pool.ready(worker)
        else:
            messages.append((worker, message))
    return messages


def test_by_position_it_awaits_the_worker_whose_next_item_comes_first():
    merge = Merge(2, in_order=True, positional=True)
    merge.add_chunk(1, *chunk(1, 3, 5))
    run, _ = merge.take_run()
    assert [entry[POSITION] for entry in run] == []  # worker 0 owes position 0 first
    assert merge.awaited() == [0]
    merge.add_chunk(0, *chunk(0, 2))
    run, _ = merge.take_run()
    assert [entry[POSITION] for entry in run] == [(0,), (1,), (2,)]
    assert merge.awaited() == [0]  # worker 1 sent up to 5; worker 0 only up to 2
    merge.end_lane(0)
    run, _ = merge.take_run()
    assert [entry[POSITION] for entry in run] == [(3,), (5,)]
    assert merge.awaited() == [1]


def test_without_sub_positions_a_slow_worker_does_not_hold_back_earlier_items():
    """Worker 0 handed out 0 and is stuck in 2; worker 1's 1 comes before anything worker
    0 can still send (no op makes several items of one position), so it leaves."""
    merge = Merge(2, in_order=True, positional=True, sub_positions=False)
    merge.add_chunk(0, *chunk(0))
    assert [entry[POSITION] for entry in merge.take_run()[0]] == [(0,)]
    merge.add_chunk(1, *chunk(1, 3))
    assert [entry[POSITION] for entry in merge.take_run()[0]] == [(1,)]
    assert merge.awaited() == [0]  # 2 must come before 3
    with_sub_positions = Merge(2, in_order=True, positional=True)
    with_sub_positions.add_chunk(0, *chunk(0))
    with_sub_positions.take_run()
    with_sub_positions.add_chunk(1, *chunk(1, 3))
    assert with_sub_positions.take_run()[0] == []  # worker 0 might still send (0, 1)


def test_a_failed_worker_raises_once_the_items_before_its_failure_left():
    merge = Merge(2, in_order=True, positional=True)
    merge.add_chunk(0, *chunk(0, 2))
    merge.fail_lane(0, KeyError("at 4"), [4])
    merge.add_chunk(1, *chunk(1, 3, 5))
    left = []
    with pytest.raises(KeyError, match="at 4"):
        while True:
            left += [entry[POSITION] for entry in merge.take_run()[0]]
    assert left == [(0,), (1,), (2,), (3,)]
    round_robin = Merge(2, in_order=True, positional=False)
    round_robin.add_chunk(0, *chunk(0))
    round_robin.fail_lane(1, KeyError("lane 1"), None)
    assert len(round_robin.take_run()[0]) == 1
    with pytest.raises(KeyError, match="lane 1"):
        round_robin.awaited()


def test_a_worker_that_has_shown_nothing_may_come_first_so_all_are_awaited():
    merge = Merge(3, in_order=True, positional=True)
    merge.lanes[2].floor = None  # as if nothing were known of worker 2's first position
    merge.add_chunk(0, *chunk(0))
    merge.take_run()
    assert merge.awaited() is None


def test_round_robin_awaits_the_worker_whose_turn_it_is():
    merge = Merge(3, in_order=True, positional=False)
    merge.add_chunk(0, *chunk(0))
    merge.add_chunk(2, *chunk(2))
    run, _ = merge.take_run()
    assert len(run) == 1 and merge.awaited() == [1]


def test_first_come_first_served_awaits_every_worker():
    merge = Merge(2, in_order=False, positional=True)
    assert merge.awaited() is None


def slow_on_worker_0(x: int) -> int:
    if x % 2 == 0:
        time.sleep(0.3)
    return x


@pytest.mark.timing
def test_a_pool_listening_to_one_worker_leaves_the_others_messages_waiting_but_sees_their_death():
    pool = WorkerPool(IterableWrapper(range(4)).sharding_filter().map(slow_on_worker_0), 2, None, None, None, 10.0)
    try:
        pool.start_epoch(1, SeedGenerator(0).for_epoch(0), [None, None], credits=4)
        pool.start_remaining()
        seen: list[int] = []
        deadline = time.monotonic() + 5
        while 0 not in seen and time.monotonic() < deadline:
            seen += [worker for worker, _ in decoded(pool, pool.receive(None, awaited=[0]))]
        # Worker 1 was quick and has sent its items long ago; only worker 0's arrived.
        assert seen and set(seen) == {0}
        os.kill(pool.pids[1], signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(WorkerError, match=r"worker 1 \(pid \d+\) was killed by signal SIGKILL"):
            while True:
                pool.receive(None, awaited=[0])
        assert time.monotonic() - started < 1.0
    finally:
        pool.close()


def test_a_pool_hands_out_one_message_per_worker_per_call_even_when_a_read_brings_more():
    pool = WorkerPool(IterableWrapper(range(2000)).sharding_filter(), 2, None, None, None, 10.0)
    try:
        pool.start_epoch(1, SeedGenerator(0).for_epoch(0), [None, None], credits=8)
        pool.start_remaining()
        time.sleep(0.3)  # both send their 8 chunks: each pipe holds several frames
        received: list[int] = []
        ended = 0
        while ended < 2:
            messages = pool.receive(None)
            assert len({worker for worker, _ in messages}) == len(messages)
            for worker, message in decoded(pool, messages):
                received.append(worker)
                if isinstance(message, Chunk):  # more credits
                    pool.grant(worker, 1)
                else:
                    ended += type(message).__name__ == "EpochEnd"
        assert received.count(0) > 8 and received.count(1) > 8
    finally:
        pool.close()


def stall_at_ten(x: int) -> int:
    if x == 10:
        time.sleep(2.5)  # longer than the timeout; shutdown waits for the rest
    return x


def test_a_timeout_names_only_the_workers_that_were_awaited():
    from conveyor import DataLoader2, MultiProcessingReadingService

    loader = DataLoader2(
        IterableWrapper(range(40)).sharding_filter().map(stall_at_ten),
        reading_service=MultiProcessingReadingService(2, timeout=1.0),
    )
    try:
        received = []
        with pytest.raises(WorkerError) as raised:
            for item in loader:
                received.append(item)
        assert received == list(range(len(received))) and len(received) < 10  # in order, up to the stall
        message = str(raised.value)
        assert "worker 0 (pid" in message and "worker 1" not in message
        assert "sent nothing within 1.0s" in message
    finally:
        loader.shutdown()


@settings(max_examples=scaled(200), deadline=None)
@given(data=st.data(), lanes=st.integers(1, 4), mode=st.sampled_from(["position", "round robin", "first come"]))
def test_a_run_takes_everything_that_may_leave_until_a_message_arrives(data, lanes, mode):
    """The reader goes straight back to the workers after a run: a second look at the
    merge must find nothing, and the lanes it waits for must not change."""
    merge = Merge(lanes, in_order=mode != "first come", positional=mode != "round robin")
    # Each lane's share of positions 0..39 (a filter may drop some), cut into chunks.
    pending = []
    for lane in range(lanes):
        kept = [p for p in range(lane, 40, lanes) if data.draw(st.booleans(), label=f"keep {p}")]
        cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(kept) - 1)), max_size=4), label="cuts"))
        bounds = [0, *[c for c in cuts if c < len(kept)], len(kept)]
        pending.append([kept[a:b] for a, b in itertools.pairwise(bounds) if b > a])
    handed: list[int] = []
    while not merge.finished:
        open_lanes = [lane for lane in range(lanes) if pending[lane] or not merge.lanes[lane].ended]
        lane = data.draw(st.sampled_from(open_lanes), label="next message from")
        if pending[lane]:
            merge.add_chunk(lane, *chunk(*pending[lane].pop(0)))
        else:
            merge.end_lane(lane)
        run, _ = merge.take_run()
        if run:
            awaited = merge.awaited()
            assert merge.take_run() == ([], [])
            assert merge.awaited() == awaited
        handed.extend(entry[POSITION][0] for entry in run)
    if mode == "position":
        assert handed == sorted(handed)
