"""Moving buffers from a worker: the shared-memory ring (leases own their pages until
collected, in any order), a shared file of its own for a buffer that misses the ring, the
pipe where neither can be had, and the codec over them."""

from __future__ import annotations

import errno
import gc
import os
import pickle
import random
import weakref

import numpy as np
import pytest

from conveyor.errors import SharedMemoryError, WorkerError
from conveyor.workers.transport.buffers import OUT_OF_BAND_MIN_BYTES, prepare_item
from conveyor.workers.transport.codec import Decoder, Encoder, Piped
from conveyor.workers.transport.ring import PAGE, RESERVED_AT_CREATION, ShmRing
from conveyor.workers.transport.shared_files import reserve
from conveyor.workers.transport.spill import REUSE_MIN_BYTES, Spilled, SpillReceiver, SpillSender, spill_channel

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


def test_a_ring_handle_travels_with_a_process_s_arguments(start_method):
    import multiprocessing

    owner = ShmRing.create(8 * PAGE, tag=start_method)
    context = multiprocessing.get_context(start_method)
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


def _allocated(fd: int) -> int:
    return os.fstat(fd).st_blocks * 512


def test_a_ring_reserves_its_first_pages_and_the_worker_reserves_more_as_it_needs_them():
    unit = RESERVED_AT_CREATION // 4  # three fit in what creation reserves
    owner = ShmRing.create(4 * RESERVED_AT_CREATION, tag="test")
    fd = owner.handle().fd
    worker = ShmRing.attach(os.dup(fd))
    try:
        assert owner.reserved == worker.reserved == RESERVED_AT_CREATION // PAGE
        created = _allocated(fd)
        assert RESERVED_AT_CREATION <= created < RESERVED_AT_CREATION + 64 * PAGE, "flags and the first pages"
        kept = [owner.lease(*worker.write(memoryview(bytes([i]) * unit))) for i in range(3)]
        assert _allocated(fd) == created, "what fits in the first pages reserves nothing more"
        kept.append(owner.lease(*worker.write(memoryview(b"\x03" * (3 * unit)))))
        assert worker.reserved == 2 * RESERVED_AT_CREATION // PAGE, "doubled"
        kept.append(owner.lease(*worker.write(memoryview(b"\x04" * (3 * unit)))))
        assert worker.reserved == worker.pages, "doubled again, up to the ring's size"
        assert _allocated(fd) >= worker.reserved * PAGE, "every page written was reserved first"
        assert [int(k[0]) for k in kept] == [0, 1, 2, 3, 4] and all((k == k[0]).all() for k in kept)
    finally:
        worker.close()
        owner.close()


def test_a_worker_whose_ring_cannot_grow_keeps_it_as_it_is():
    owner = ShmRing.create(16 << 20, tag="test")
    worker = ShmRing.attach(os.dup(owner.handle().fd), fallocate=_failing_fallocate)
    try:
        unit = RESERVED_AT_CREATION // 4
        held = owner.lease(*worker.write(memoryview(b"\x01" * (3 * unit))))
        assert worker.write(memoryview(b"\x02" * (3 * unit))) is None, "refused: it goes another way"
        assert worker.reserved == RESERVED_AT_CREATION // PAGE
        assert worker.write(memoryview(b"\x03" * unit)) is not None, "the reserved part still serves"
        assert (held == 1).all()
    finally:
        worker.close()
        owner.close()


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


def test_a_view_of_a_lease_keeps_its_pages(rings):
    owner, worker = rings
    lease = owner.lease(*worker.write(memoryview(b"\x09" * (2 * PAGE))))
    view = lease.view(np.int32).reshape(2, -1)  # what a decoded array is: a view of its lease
    del lease
    gc.collect()
    for _ in range(64):  # had the lease ended, these would land on its pages
        owner.lease(*worker.write(memoryview(b"\x01" * PAGE)))
    assert (view == 0x09090909).all()


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


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "bool", "int64", "uint8"])
def test_small_tensors_travel_in_band_as_their_bytes(rings, dtype):
    """Below the out-of-band size a tensor is pickled as its raw bytes, not through torch's
    own reduction (which goes through torch.load: ~130 us per tensor, measured)."""
    torch = pytest.importorskip("torch")
    dtype = getattr(torch, dtype)
    for original in (
        torch.tensor(3).to(dtype),
        torch.arange(6).reshape(2, 3).to(dtype),
        torch.zeros(0, 2, dtype=dtype),
    ):
        got, through_ring = _round_trip(rings, original)
        assert through_ring == 0
        assert got.dtype == dtype and got.shape == original.shape and torch.equal(got, original)
        if got.numel():
            got.reshape(-1)[0] = 1  # the user's, writable


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


def test_nested_tensors_take_torchs_own_reduction(rings):
    """A nested tensor's layout says strided, but it is not one buffer to reshape."""
    torch = pytest.importorskip("torch")
    large = OUT_OF_BAND_MIN_BYTES // 4
    for sizes in ([5], [3, 7], [large, large + 1]):
        nested = torch.nested.nested_tensor([torch.arange(n, dtype=torch.float32) for n in sizes])
        got, _ = _round_trip(rings, nested)
        assert got.is_nested and [list(t) for t in got.unbind()] == [list(t) for t in nested.unbind()]


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


# --- buffers that miss the ring: a shared file each ---------------------------------------


@pytest.fixture
def channel():
    main, worker = spill_channel()
    sender, receiver = SpillSender(worker), SpillReceiver(main, worker_id=0)
    yield sender, receiver
    sender.close()
    receiver.close()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_buffer_larger_than_the_ring_travels_in_a_file_of_its_own(rings, channel):
    owner, worker = rings
    sender, receiver = channel
    gc.collect()  # earlier tests' garbage is not this test's
    before = _open_fds()
    item = {"big": np.arange(1_000_000, dtype=np.int64), "small": np.ones(20_000, dtype=np.int64)}
    payload, buffers, size = Encoder(worker, sender).encode(prepare_item(item)[0])
    assert [type(b) for b in buffers] == [Spilled, tuple], "the big one spilled, the small one fit the ring"
    assert size == item["big"].nbytes + item["small"].nbytes
    got = Decoder(owner, receiver).decode(payload, buffers)
    assert (got["big"] == item["big"]).all() and (got["small"] == 1).all()
    got["big"][:] = 7  # the user's, writable
    assert (got["big"] == 7).all() and item["big"][1] == 1
    assert not conveyor_shm_entries()
    del got
    gc.collect()
    assert _open_fds() == before, "no descriptor is left behind"


def test_a_view_of_a_spilled_array_keeps_its_file(channel):
    sender, receiver = channel
    array = receiver.take(sender.send(memoryview(b"\x04" * REUSE_MIN_BYTES)))
    view = array.view(np.int64)[::2]
    del array
    gc.collect()
    assert not receiver._held or all(ref() is not None for ref, _ in receiver._held.values())
    assert (view == 0x0404040404040404).all()
    for _ in range(4):  # had the file gone back, one of these would reuse it
        receiver.take(sender.send(memoryview(b"\x01" * REUSE_MIN_BYTES)))
    assert (view == 0x0404040404040404).all()


def test_a_dropped_file_goes_back_to_its_worker_and_is_reused(channel):
    sender, receiver = channel
    first = receiver.take(sender.send(memoryview(b"\x01" * REUSE_MIN_BYTES)))
    inode = os.fstat(receiver._held[next(iter(receiver._held))][1]).st_ino
    second = receiver.take(sender.send(memoryview(b"\x02" * REUSE_MIN_BYTES)))
    assert (first == 1).all() and (second == 2).all(), "a file the user holds is never reused"
    del first
    gc.collect()
    third = receiver.take(sender.send(memoryview(b"\x03" * REUSE_MIN_BYTES)))
    assert (second == 2).all() and (third == 3).all()
    reused = [os.fstat(fd).st_ino for _, fd in receiver._held.values()]
    assert inode in reused, "the first file came back for the third buffer"
    sender.idle()
    assert not sender._idle


def test_a_file_given_back_after_shutdown_is_just_freed(channel):
    sender, receiver = channel
    kept = receiver.take(sender.send(memoryview(b"\x05" * REUSE_MIN_BYTES)))
    before = _open_fds()
    receiver.close()
    assert _open_fds() == before - 2, "the held descriptor and the main end are closed"
    assert (kept == 5).all(), "the user's array stays valid"
    kept[:] = 6
    del kept
    gc.collect()


def test_descriptors_of_a_chunk_that_failed_to_encode_are_skipped(channel):
    sender, receiver = channel
    orphan = sender.send(memoryview(b"\x01" * 100_000))  # its chunk never came
    wanted = sender.send(memoryview(b"\x02" * 100_000))
    assert isinstance(orphan, Spilled) and wanted.seq == orphan.seq + 1
    before = _open_fds()
    assert (receiver.take(wanted) == 2).all()
    assert _open_fds() == before, "the orphan's descriptor was closed"


def test_a_missing_descriptor_is_an_error_not_a_hang(channel):
    _, receiver = channel
    with pytest.raises(WorkerError, match="did not arrive"):
        receiver.take(Spilled(1, 100_000))


def _failing_fallocate(fd: int, offset: int, length: int) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_file_that_cannot_be_reserved_sends_the_buffer_through_the_pipe_with_its_cause(rings):
    owner, worker = rings
    main, worker_end = spill_channel()
    sender = SpillSender(worker_end, fallocate=_failing_fallocate)
    causes: list[str] = []
    try:
        array = np.arange(1_000_000, dtype=np.int32)
        payload, buffers, _ = Encoder(worker, sender).encode(prepare_item([array])[0])
        assert type(buffers[0]) is Piped and "ENOSPC" in buffers[0].cause
        sent = pickle.loads(pickle.dumps(buffers, protocol=5))  # what the pipe carries
        got = Decoder(owner, SpillReceiver(main, 0), causes.append).decode(payload, sent)
        assert (got[0] == array).all() and got[0].flags.writeable
        assert len(causes) == 1 and "ENOSPC" in causes[0]
    finally:
        sender.close()
        main.close()


def test_without_shared_memory_buffers_travel_in_the_message_writable():
    array = np.arange(100_000, dtype=np.float64)
    raw = b"r" * 100_000
    payload, buffers, size = Encoder(None).encode(prepare_item([array, raw])[0])
    assert size == array.nbytes + len(raw)
    sent = pickle.loads(pickle.dumps(buffers, protocol=5))
    got = Decoder(None).decode(payload, sent)
    assert (got[0] == array).all() and got[0].flags.writeable and got[1] == raw


# --- reserving memory ---------------------------------------------------------------------


def test_reserve_raises_a_typed_error_naming_the_cause():
    fd = os.memfd_create("test")
    try:
        with pytest.raises(SharedMemoryError, match=r"4 MiB of shared memory could not be reserved \(ENOSPC") as info:
            reserve(fd, 4 << 20, _failing_fallocate)
        assert info.value.errno == errno.ENOSPC and isinstance(info.value, OSError)
    finally:
        os.close(fd)


def test_reserve_writes_zeros_where_fallocate_is_unsupported():
    def unsupported(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.EOPNOTSUPP, "not supported")

    fd = os.memfd_create("test")
    try:
        reserve(fd, 3 * PAGE + 5, unsupported)
        assert os.fstat(fd).st_size == 3 * PAGE + 5
    finally:
        os.close(fd)


def test_a_ring_that_cannot_be_reserved_fails_at_creation():
    before = _open_fds()
    with pytest.raises(SharedMemoryError, match="ENOSPC"):
        ShmRing.create(64 * PAGE, tag="test", fallocate=_failing_fallocate)
    assert _open_fds() == before


def conveyor_shm_entries() -> list[str]:
    return [name for name in os.listdir("/dev/shm") if name.startswith("conveyor-")]


@pytest.mark.timeout(60)
def test_a_release_store_landing_again_late_cannot_free_pages_claimed_since(rings):
    """The interleaving behind items seen twice (one lost) under CPU load: the user drops
    item A; the main process releases A's pages; the worker sees them free and writes item
    B there; the release's store lands again, late (``memcpy``/``memset`` write a small range
    as two overlapping stores, and a CPU taken away between them delays the second); the
    worker must not find B's pages free again and write item C over B while B is leased.
    With one flag per page written by both processes (0 free, 1 in use) it did."""
    owner, worker = rings
    first = worker.write(memoryview(b"\x0a" * (4 * PAGE)))
    assert first is not None
    owner.lease(*first)  # dropped at once: the main process releases its pages
    released = owner._map[first[0] : first[0] + 4].copy()  # what that release stored
    second = worker.write(memoryview(b"\x0b" * (4 * PAGE)))
    assert second is not None and second[0] == first[0], "first fit reuses the released pages"
    kept = owner.lease(*second)
    owner._map[first[0] : first[0] + 4] = released  # the release's store, performed a second time, late
    third = worker.write(memoryview(b"\x0c" * (4 * PAGE)))
    assert third is not None and third[0] != second[0], "pages of a live lease were handed out again"
    assert kept[0] == 0x0B and kept[-1] == 0x0B
