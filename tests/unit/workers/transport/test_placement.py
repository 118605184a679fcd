"""A worker places an item's large buffers in its ring as the item is made
(``Encoder.prepare``), not when the chunk is encoded: the buffer is copied while it is
still in the cache and freed at once. The main process cannot tell: the same arrays,
bytes and tensors arrive, writable, and pages of a chunk that is never sent go back."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

from conveyor.workers.transport.buffers import OUT_OF_BAND_MIN_BYTES, Placed, prepare_item
from conveyor.workers.transport.codec import Decoder, Encoder
from conveyor.workers.transport.ring import PAGE, ShmRing
from conveyor.workers.transport.spill import Spilled, SpillReceiver, SpillSender, spill_channel

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs POSIX shared memory")

RING_PAGES = 256


@pytest.fixture
def rings():
    owner = ShmRing.create(RING_PAGES * PAGE, tag="test")
    worker = ShmRing.attach(os.dup(owner.handle().fd))
    owner.handed_over()
    yield owner, worker
    worker.close()
    owner.close()


def array_of(value: int, pages: int = 20) -> np.ndarray:
    return np.full(pages * PAGE // 8, value, dtype=np.int64)


def send(encoder: Encoder, decoder: Decoder, items: list) -> list:
    """Prepare ``items`` one by one, as a worker reads them, then encode and decode them
    as one chunk."""
    chunk = [(encoder.prepare(item)[0], None, (i,)) for i, item in enumerate(items)]
    payload, descriptors, _ = encoder.encode(chunk)
    return [item for item, _, _ in decoder.decode(payload, descriptors)]


def test_large_buffers_are_placed_when_the_item_is_made_and_arrive_unchanged(rings):
    owner, worker = rings
    encoder = Encoder(worker)
    item = {"array": array_of(3), "raw": b"r" * OUT_OF_BAND_MIN_BYTES, "pair": (array_of(4, 17), "small")}
    prepared, large = encoder.prepare(item)
    assert large == 20 * PAGE + OUT_OF_BAND_MIN_BYTES + 17 * PAGE
    assert type(prepared["array"]) is Placed and type(prepared["pair"][0]) is Placed
    assert type(prepared["raw"]) is Placed and prepared["pair"][1] == "small"
    assert type(item["array"]) is np.ndarray, "the user's item is not changed"
    payload, descriptors, size = encoder.encode([(prepared, None, (0,))])
    placed = (prepared["array"], prepared["raw"], prepared["pair"][0])
    assert size == large and descriptors == [p.descriptor for p in placed]
    [(got, _, _)] = Decoder(owner).decode(payload, descriptors)
    assert (got["array"] == 3).all() and got["array"].flags.writeable and got["array"].dtype == np.int64
    assert got["raw"] == item["raw"] and (got["pair"][0] == 4).all() and got["pair"][1] == "small"
    got["array"][:] = -1  # the user's, writable
    assert (item["array"] == 3).all()


def test_a_buffer_an_item_holds_twice_is_placed_once_and_arrives_as_one_array(rings):
    owner, worker = rings
    encoder = Encoder(worker)
    shared = array_of(5)
    prepared, _ = encoder.prepare([shared, shared])
    assert prepared[0] is prepared[1]
    payload, descriptors, _ = encoder.encode([(prepared, None, (0,))])
    assert len(descriptors) == 1
    [(got, _, _)] = Decoder(owner).decode(payload, descriptors)
    assert got[0] is got[1] and (got[0] == 5).all()


def test_small_and_unusual_values_are_left_to_the_chunk_encoding(rings):
    _, worker = rings
    encoder = Encoder(worker)
    strided = array_of(1)[::2]  # not contiguous: numpy's own reduction
    small = np.ones(10)
    deep = [[[[array_of(2)]]]]  # deeper than prepare_item looks
    for value in (strided, small, deep, 7, "text"):
        prepared, _ = encoder.prepare(value)
        assert prepared is value


def test_items_that_miss_a_full_ring_still_arrive(rings):
    owner, worker = rings
    encoder, decoder = Encoder(worker), Decoder(owner)
    held = send(encoder, decoder, [array_of(i, 60) for i in range(4)])  # 240 of 256 pages, leased
    later = send(encoder, decoder, [array_of(9, 60)])  # no room: through the pipe
    assert [int(a[0]) for a in held] == [0, 1, 2, 3] and (later[0] == 9).all()


def test_the_pages_of_a_chunk_that_is_never_sent_go_back(rings):
    owner, worker = rings
    encoder, decoder = Encoder(worker), Decoder(owner)
    for value in range(3):  # three times the ring's size, abandoned chunk after chunk
        prepared = [encoder.prepare(array_of(value, 100))[0] for _ in range(2)]
        assert all(type(p) is Placed for p in prepared)
        encoder.discard()
    prepared, _ = encoder.prepare(array_of(8, 100))
    assert prepared.descriptor[0] == 0, "the first pages are free again"
    [got] = send(encoder, decoder, [array_of(6, 100)])
    assert (got == 6).all()


class Unpicklable:
    def __reduce__(self):
        raise TypeError("cannot pickle this")


def test_a_chunk_that_fails_to_encode_gives_its_pages_back(rings):
    _, worker = rings
    encoder = Encoder(worker)
    chunk = [(encoder.prepare(array_of(1, 100))[0], None, (0,)), (Unpicklable(), None, (1,))]
    with pytest.raises(TypeError, match="cannot pickle"):
        encoder.encode(chunk)
    prepared, _ = encoder.prepare(array_of(2, 100))
    assert prepared.descriptor[0] == 0


def test_tensors_are_placed_too(rings):
    torch = pytest.importorskip("torch")
    owner, worker = rings
    encoder, decoder = Encoder(worker), Decoder(owner)
    tensor = torch.full((20 * PAGE // 2,), 1.5, dtype=torch.bfloat16)
    assert type(encoder.prepare(tensor)[0]) is Placed
    [got] = send(encoder, decoder, [tensor])
    assert isinstance(got, torch.Tensor) and got.dtype == torch.bfloat16 and bool((got == 1.5).all())
    # beside a small tensor (which travels in the stream) and a small array, as images and labels do
    label, small = torch.tensor([3, 4]), np.arange(5)
    prepared = encoder.prepare({"image": tensor, "label": label, "small": small})[0]
    assert type(prepared["image"]) is Placed and prepared["label"] is label and prepared["small"] is small
    [got] = send(encoder, decoder, [{"image": tensor, "label": label, "small": small}])
    assert got["label"].tolist() == [3, 4] and got["small"].tolist() == [0, 1, 2, 3, 4]
    assert bool((got["image"] == 1.5).all())


def test_a_worker_leaving_a_chunk_half_built_gives_its_pages_back(rings):
    from conveyor.core.worker_info import WorkerInfo
    from conveyor.pipes import IterableWrapper
    from conveyor.random import SeedGenerator
    from conveyor.workers.child.state_machine import WorkerStateMachine
    from conveyor.workers.transport.protocol import StartEpoch

    _, worker = rings
    encoder = Encoder(worker)
    machine = WorkerStateMachine(IterableWrapper(range(4)).map(array_of), WorkerInfo(1, 0), encoder)
    machine.start_epoch(StartEpoch(0, SeedGenerator(0), None, 8))
    encoder.prepare(array_of(1, 200))  # a pipeline interrupted here (a new epoch, the end)
    machine.start_epoch(StartEpoch(1, SeedGenerator(0), None, 8))
    assert encoder.prepare(array_of(2, 200))[0].descriptor[0] == 0
    machine.close()


def read_only_array(value: int, pages: int) -> np.ndarray:
    array = np.frombuffer(bytes([value]) * pages * PAGE, dtype=np.uint8)
    assert not array.flags.writeable
    return array


@pytest.mark.parametrize("path", ["placed", "ring", "spilled", "pipe"])
def test_a_read_only_array_arrives_writable_whichever_way_it_travels(rings, path):
    """The main process's array is the user's own copy: writable, as torch's tensors are,
    whether its buffer was placed as the item was made, in the ring or a file of its own
    when the chunk was encoded, or in the chunk's message."""
    owner, worker = rings
    main_end, worker_end = spill_channel()
    sender, receiver = SpillSender(worker_end), SpillReceiver(main_end, worker_id=0)
    try:
        array = read_only_array(7, RING_PAGES + 1 if path == "spilled" else 20)
        encoder = Encoder(None) if path == "pipe" else Encoder(worker, sender)
        prepared = encoder.prepare(array)[0] if path == "placed" else prepare_item(array)[0]
        assert (type(prepared) is Placed) == (path == "placed")
        payload, descriptors, _ = encoder.encode([(prepared, None, (0,))])
        kinds = {"placed": tuple, "ring": tuple, "spilled": Spilled, "pipe": pickle.PickleBuffer}
        assert [type(d) for d in descriptors] == [kinds[path]]
        descriptors = pickle.loads(pickle.dumps(descriptors, protocol=5))  # as the chunk's message carries them
        [(got, _, _)] = Decoder(owner, receiver).decode(payload, descriptors)
        assert got.flags.writeable and got.dtype == np.uint8 and (got == 7).all()
        got[:] = 1
        assert (array == 7).all()
    finally:
        sender.close()
        receiver.close()


def page_array(i: int) -> np.ndarray:
    """An array of 20 pages that names its item in every element."""
    return np.arange(20 * PAGE // 8, dtype=np.int64) + i * 1_000_003


@pytest.mark.parametrize("dispatch", [False, True])
def test_epochs_left_early_leave_the_ring_whole(dispatch):
    """Epochs abandoned after a few items, then full ones: every array arrives whole and
    in order, whatever the earlier epochs left in flight or in the workers' rings."""
    from conveyor import DataLoader2, MultiProcessingReadingService
    from conveyor.pipes import IterableWrapper

    source = IterableWrapper(range(120))
    pipe = (source.sharding_round_robin_dispatch() if dispatch else source.sharding_filter()).map(page_array)
    loader = DataLoader2(pipe, reading_service=MultiProcessingReadingService(2))
    try:
        for stop in (1, 5, 17, 3, 40):
            for count, _ in enumerate(loader):
                if count == stop:
                    break
        for _ in range(2):
            arrays = list(loader)
            assert [int(a[0]) // 1_000_003 for a in arrays] == list(range(120))
            assert all((a == page_array(i)).all() for i, a in enumerate(arrays))
    finally:
        loader.shutdown()


def test_distinct_bytes_in_one_item_each_travel_and_a_repeated_one_once(rings):
    """A ``bytes`` value's out-of-band wrapper is made afresh and freed once placed: the
    next value's wrapper may reuse its id, which must not make it the same buffer."""
    owner, worker = rings
    encoder = Encoder(worker)
    first, second = b"a" * OUT_OF_BAND_MIN_BYTES, b"b" * OUT_OF_BAND_MIN_BYTES
    item = [first, second, b"c" * OUT_OF_BAND_MIN_BYTES, second]
    prepared, large = encoder.prepare(item)
    assert large == 4 * OUT_OF_BAND_MIN_BYTES
    assert len({id(p) for p in prepared}) == 3 and prepared[1] is prepared[3]
    payload, descriptors, _ = encoder.encode([(prepared, None, (0,))])
    assert len(descriptors) == 3
    [(got, _, _)] = Decoder(owner).decode(payload, descriptors)
    assert got == item


def test_scalars_are_prepared_as_they_are_with_or_without_a_ring(rings):
    """The common small item returns at the first check: nothing placed, nothing kept."""
    _, worker = rings
    for encoder in (Encoder(worker), Encoder(None)):
        for item in (7, 2.5, "text" * 100_000, True, None):
            prepared, large = encoder.prepare(item)
            assert prepared is item and large == 0
        assert not encoder._unsent and not encoder._placed
    payload, descriptors, size = Encoder(worker).encode([(7, None, (0,))])
    assert Decoder(None).decode(payload, descriptors) == [(7, None, (0,))] and size == 0
