"""How a worker cuts its output into chunks (``WorkerStateMachine.produce``): the first
chunk of an epoch holds one item and each next one up to twice as many, up to
``CHUNK_MAX_ITEMS``; a chunk also leaves once ``CHUNK_MAX_SECONDS`` have passed since it
was begun. A fake clock, advanced by the items themselves, makes the cuts exact."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from conveyor.core.worker_info import WorkerInfo
from conveyor.pipes import IterableWrapper
from conveyor.random import SeedGenerator
from conveyor.workers.child import state_machine
from conveyor.workers.child.state_machine import CHUNK_MAX_ITEMS, CHUNK_MAX_SECONDS, Phase, WorkerStateMachine
from conveyor.workers.transport.codec import Decoder, EncodedFrame, Encoder
from conveyor.workers.transport.protocol import Chunk, EpochEnd, StartEpoch


class FakeClock:
    """Seconds that pass only when an item says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(state_machine, "time", SimpleNamespace(perf_counter=fake, monotonic=fake))
    return fake


def chunk_sizes(n: int, clock: FakeClock, seconds_per_item: float) -> list[int]:
    """The sizes of the chunks one worker cuts ``range(n)`` into, each item taking
    ``seconds_per_item`` of the fake clock; checks every item came once, in order."""

    def take_time(i: int) -> int:
        clock.now += seconds_per_item
        return i

    machine = WorkerStateMachine(IterableWrapper(range(n)).map(take_time), WorkerInfo(1, 0), Encoder(None))
    decoder = Decoder(None, worker_id=0)
    assert machine.start_epoch(StartEpoch(0, SeedGenerator(0), None, 1 << 30, False)) == []
    sizes: list[int] = []
    items: list[int] = []
    try:
        while machine.phase is Phase.RUNNING:
            for message in machine.produce():
                if type(message) is EncodedFrame:
                    chunk = decoder.decode_frame(memoryview(b"".join(message.parts)))
                    assert type(chunk) is Chunk
                    chunk_items = chunk.items
                    sizes.append(len(chunk_items))
                    items.extend(chunk_items)
                else:
                    assert type(message) is EpochEnd
    finally:
        machine.close()
    assert items == list(range(n))
    return sizes


def test_fast_items_fill_chunks_up_to_the_item_cap(clock):
    sizes = chunk_sizes(300, clock, 0.0)
    assert sizes[:8] == [1, 2, 4, 8, 16, 32, 64, 64] and CHUNK_MAX_ITEMS == 64
    assert max(sizes) == CHUNK_MAX_ITEMS and sum(sizes) == 300


def test_a_chunk_leaves_once_its_time_is_up(clock):
    """Items of 3 ms: a chunk takes the items of its first 20 ms and the one that
    crossed it, however many more its item cap would allow."""
    assert CHUNK_MAX_SECONDS == 0.02
    sizes = chunk_sizes(100, clock, 0.003)
    assert sizes[:6] == [1, 2, 4, 7, 7, 7]
    assert max(sizes) == 7 and sum(sizes) == 100


def test_items_slower_than_the_time_limit_travel_one_per_chunk(clock):
    assert chunk_sizes(5, clock, CHUNK_MAX_SECONDS * 1.5) == [1, 1, 1, 1, 1]
