"""The shared-memory ring: leases own their pages until collected, in any order."""

from __future__ import annotations

import gc
import os
import pickle
import random
import weakref

import numpy as np
import pytest

from conveyor.workers.codec import OUT_OF_BAND_MIN_BYTES, Decoder, Encoder, prepare_item
from conveyor.workers.ring import PAGE, ShmRing

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs POSIX shared memory")


@pytest.fixture
def rings():
    owner = ShmRing.create(64 * PAGE, tag="test")
    worker = ShmRing.attach(os.dup(owner.handle().fd))  # what a worker gets: its own descriptor
    owner.handed_over()
    yield owner, worker
    worker.close()
    owner.close()


def test_a_ring_has_no_name_to_leave_behind_and_sizes_agree(rings):
    owner, worker = rings
    assert worker.pages == owner.pages == 64
    assert not any(name.startswith(owner.name) for name in os.listdir("/dev/shm"))
    with pytest.raises(RuntimeError, match="already handed over"):
        owner.handle()


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_a_ring_handle_travels_with_a_process_s_arguments(method):
    import multiprocessing

    owner = ShmRing.create(8 * PAGE, tag=method)
    context = multiprocessing.get_context(method)
    reader, writer = context.Pipe(duplex=False)
    try:
        process = context.Process(target=_write_through_handle, args=(owner.handle(), writer))
        process.start()
        owner.handed_over()
        writer.close()
        assert reader.poll(60), "the worker never answered"
        placed = reader.recv()
        process.join(60)
        assert process.exitcode == 0 and placed is not None
        assert bytes(owner.lease(*placed)) == b"hello" * 1000
    finally:
        reader.close()
        owner.close()


def _write_through_handle(handle, answer):
    worker = ShmRing.attach(handle.fd)
    try:
        answer.send(worker.write(memoryview(b"hello" * 1000)))
    finally:
        worker.close()


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
    payload, buffers, _ = Encoder(worker).encode(prepared)
    assert all(not isinstance(b, bytes) for b in buffers), "both large buffers went through the ring"
    got = Decoder(owner).decode(payload, buffers)
    assert (got["array"] == item["array"]).all() and got["raw"] == item["raw"] and got["small"] == [1, "a"]
    got["array"][0] = -1  # the user's, writable
    assert item["array"][0] == 0


def _round_trip(rings, item):
    """``(decoded item, how many buffers went through the ring)``."""
    owner, worker = rings
    prepared, _ = prepare_item(item)
    payload, buffers, _ = Encoder(worker).encode(prepared)
    return Decoder(owner).decode(payload, buffers), sum(isinstance(b, tuple) for b in buffers)


@pytest.mark.parametrize("dtype", ["u1", "<f4", ">i8", "M8[s]", "U3", "S5", "?", "c16", "V8"])
def test_arrays_of_every_plain_dtype_travel_out_of_band_unchanged(rings, dtype):
    itemsize = np.dtype(dtype).itemsize
    columns = OUT_OF_BAND_MIN_BYTES // itemsize // 3 + 1
    raw = np.random.default_rng(0).bytes(3 * columns * itemsize)
    array = np.frombuffer(raw, dtype=dtype).reshape(3, columns).copy()
    got, through_ring = _round_trip(rings, array)
    assert through_ring == 1
    assert got.dtype == array.dtype and got.shape == array.shape and got.tobytes() == array.tobytes()
    assert got.flags.writeable


@pytest.mark.parametrize(
    "make",
    [
        lambda a: np.asfortranarray(a.reshape(256, -1)),
        lambda a: a[::2],
        lambda a: a.view([("x", "<i4"), ("y", "<f4")]),
        lambda a: a.view(np.recarray),
    ],
    ids=["fortran", "strided", "structured", "subclass"],
)
def test_arrays_outside_the_lean_form_take_numpys_own_reduction(rings, make):
    array = make(np.arange(2 * OUT_OF_BAND_MIN_BYTES // 4, dtype=np.int32))
    got, _ = _round_trip(rings, array)
    assert type(got) is type(array) and got.dtype == array.dtype and got.shape == array.shape
    assert got.tobytes() == array.tobytes()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "complex64", "bool", "int64", "uint8"])
def test_tensors_of_every_dtype_travel_out_of_band_unchanged(rings, dtype):
    torch = pytest.importorskip("torch")
    dtype = getattr(torch, dtype)
    columns = OUT_OF_BAND_MIN_BYTES // torch.empty((), dtype=dtype).element_size() // 4 + 1
    tensor = (torch.arange(4 * columns) % 7).reshape(4, columns).to(dtype)
    offset = torch.cat([torch.zeros(5, dtype=dtype), tensor.reshape(-1)])[5:].reshape(4, columns)  # storage offset
    for original in (tensor, offset, tensor.reshape(-1)):  # 2-D, an offset view, flat
        got, through_ring = _round_trip(rings, original)
        assert through_ring == 1
        assert got.dtype == dtype and got.shape == original.shape and torch.equal(got, original)
        got.reshape(-1)[0] = 1  # the user's, writable
        del got


def test_tensors_outside_the_lean_form_take_torchs_own_reduction(rings):
    torch = pytest.importorskip("torch")
    base = torch.arange(OUT_OF_BAND_MIN_BYTES // 2, dtype=torch.float32)
    complex_base = torch.complex(base, -base)
    cases = {
        "transposed": base.reshape(64, -1).t(),
        "conjugate view": complex_base.conj(),
        "needs grad": base.clone().requires_grad_(),
    }
    for name, tensor in cases.items():
        got, _ = _round_trip(rings, tensor)
        assert got.shape == tensor.shape, name
        assert torch.equal(got.detach().resolve_conj(), tensor.detach().resolve_conj()), name


def test_one_encoder_serves_chunk_after_chunk_and_keeps_nothing_of_the_last(rings):
    owner, worker = rings
    encoder, decoder = Encoder(worker), Decoder(owner)
    first = np.full(OUT_OF_BAND_MIN_BYTES, 3, dtype=np.uint8)
    shared = ("the same string in both chunks",)
    payload, buffers, _ = encoder.encode([(first, shared)])
    got = decoder.decode(payload, buffers)
    assert (got[0][0] == 3).all() and got[0][1] == shared
    kept = weakref.ref(first)
    del first, got
    gc.collect()
    assert kept() is None, "the encoder's memo let go of the last chunk's arrays"
    second = np.full(OUT_OF_BAND_MIN_BYTES, 4, dtype=np.uint8)
    payload, buffers, _ = encoder.encode([(second, shared)])  # the memo starts afresh: no dangling reference
    got = decoder.decode(payload, buffers)
    assert (got[0][0] == 4).all() and got[0][1] == shared


def test_an_encoder_recovers_from_an_item_that_does_not_pickle(rings):
    owner, worker = rings
    encoder = Encoder(worker)
    with pytest.raises((TypeError, AttributeError, pickle.PicklingError)):
        encoder.encode([np.zeros(OUT_OF_BAND_MIN_BYTES, dtype=np.uint8), lambda: None])
    payload, buffers, _ = encoder.encode([np.ones(OUT_OF_BAND_MIN_BYTES, dtype=np.uint8)])
    got = Decoder(owner).decode(payload, buffers)
    assert len(got) == 1 and (got[0] == 1).all(), "nothing of the failed chunk leaked into the next"
