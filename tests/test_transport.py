"""The shared-memory ring: leases own their pages until collected, in any order."""

from __future__ import annotations

import gc
import os
import random

import numpy as np
import pytest

from conveyor.workers.transport import PAGE, Decoder, Encoder, ShmRing, prepare_item

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs POSIX shared memory")


@pytest.fixture
def rings():
    owner = ShmRing.create(64 * PAGE, tag="test")
    worker = ShmRing.attach(owner.name)
    owner.unlink()
    yield owner, worker
    worker.close()
    owner.close()


def test_names_are_unlinked_and_sizes_agree(rings):
    owner, worker = rings
    assert worker.pages == owner.pages == 64
    assert not any(name == owner.name for name in os.listdir("/dev/shm"))


def test_leases_survive_later_writes_and_free_their_pages_in_any_order(rings):
    owner, worker = rings
    rng = random.Random(0)
    live: list[tuple[np.ndarray, int]] = []
    written = 0
    for step in range(2000):
        size = rng.choice([1, 100, PAGE, 3 * PAGE + 5, 9 * PAGE])
        value = step % 251
        placed = worker.write(memoryview(bytes([value]) * size))
        if placed is None:  # full: release a random lease and go on
            assert live, "an empty ring must accept a buffer that fits"
            live.pop(rng.randrange(len(live)))
            gc.collect()
            continue
        written += 1
        array = owner.lease(*placed)
        assert array.flags.writeable and array.nbytes == size
        live.append((array, value))
        for held, expected in live:  # nothing a later write did touched a live lease
            assert held[0] == expected and held[-1] == expected
        if len(live) > 6:
            live.pop(rng.randrange(len(live)))
    assert written > 1500, "pages are reused"


def test_a_buffer_larger_than_the_ring_is_refused(rings):
    _, worker = rings
    assert worker.write(memoryview(bytes(65 * PAGE))) is None


def test_a_kept_lease_pins_only_its_own_pages(rings):
    owner, worker = rings
    kept = owner.lease(*worker.write(memoryview(b"\x07" * PAGE)))
    for _ in range(500):
        placed = worker.write(memoryview(bytes(8 * PAGE)))
        assert placed is not None, "the ring keeps working around a lease the user keeps"
        owner.lease(*placed)  # dropped at once
    assert kept[0] == 7


def test_encoder_and_decoder_round_trip_through_the_ring(rings):
    owner, worker = rings
    item = {"array": np.arange(20_000, dtype=np.int64), "raw": b"x" * 70_000, "small": [1, "a"]}
    prepared, large = prepare_item(item)
    assert large
    payload, buffers = Encoder(worker).encode(prepared)
    assert all(not isinstance(b, bytes) for b in buffers), "both large buffers went through the ring"
    got = Decoder(owner).decode(payload, buffers)
    assert (got["array"] == item["array"]).all() and got["raw"] == item["raw"] and got["small"] == [1, "a"]
    got["array"][0] = -1  # the user's, writable
    assert item["array"][0] == 0
