"""A chunk's frame (:mod:`conveyor.workers.transport.frame`): what the worker's encoder
writes reads back, through the pipe's framing, as the same typed chunk; a frame that does
not add up raises a typed error naming the worker."""

from __future__ import annotations

import os
import pickle
import threading
from typing import Any

import numpy as np
import pytest

from conveyor.errors import FrameError, WorkerError
from conveyor.workers.transport.buffers import OUT_OF_BAND_MIN_BYTES
from conveyor.workers.transport.chunk_states import ChunkStates
from conveyor.workers.transport.codec import Decoder, EncodedFrame, Encoder
from conveyor.workers.transport.frame import HEADER, MAGIC, message_parts, read_header
from conveyor.workers.transport.framing import FrameReader, write_frame
from conveyor.workers.transport.protocol import Chunk, EpochEnd
from conveyor.workers.transport.ring import PAGE, ShmRing
from conveyor.workers.transport.spill import Spilled, SpillReceiver, SpillSender, spill_channel

WORKER = 3


def a_chunk(items: tuple[Any, ...], sequence: int = 0, generation: int = 7) -> Chunk:
    """A worker's chunk of ``items`` at positions 0, 1, ...; the state after item i is
    ``{"after": i}`` (None after a ``None`` item, as after a skipped item's record)."""
    states = tuple(None if item is None else {"after": i} for i, item in enumerate(items))
    positions = tuple((i,) for i in range(len(items)))
    return Chunk(WORKER, generation, sequence, items, positions, ChunkStates.of(states))


def frame_of(sent: EncodedFrame) -> memoryview:
    """The frame as the main process reads it: through a pipe (written by a thread: a
    frame may be larger than the pipe holds), as one frame."""
    reader, writer = os.pipe()
    thread = threading.Thread(target=write_frame, args=(writer, *sent.parts))
    try:
        thread.start()
        frames = FrameReader(reader)
        got: list[memoryview] = []
        while not got:
            got = frames.read()
        [frame] = got
        return frame
    finally:
        thread.join(10)
        os.close(reader)
        os.close(writer)


@pytest.fixture
def rings():
    owner = ShmRing.create(64 * PAGE, tag="frame")
    worker = ShmRing.attach(os.dup(owner.handle().fd))
    owner.handed_over()
    yield owner, worker
    worker.close()
    owner.close()


def test_a_chunk_of_small_items_reads_back_as_the_same_typed_chunk():
    sent = a_chunk((1, "two", None, 4.0), sequence=0)
    encoded, size = Encoder(None).encode_chunk(sent)
    assert size == 0
    got = Decoder(None, worker_id=WORKER).decode_frame(frame_of(encoded))
    assert type(got) is Chunk
    assert (got.worker_id, got.generation, got.sequence) == (WORKER, 7, 0)
    assert got.items == (1, "two", None, 4.0) and got.positions == ((0,), (1,), (2,), (3,))
    assert got.states.last == 3 and got.states[1] == {"after": 1} and got.states[2] is None


def test_large_buffers_travel_by_ring_by_spilled_file_and_in_the_frame(rings):
    owner, worker = rings
    channel = spill_channel()
    assert channel is not None
    main, worker_end = channel
    in_ring = np.arange(OUT_OF_BAND_MIN_BYTES, dtype=np.uint8)
    spilled = np.ones(128 * PAGE, dtype=np.uint8)  # larger than the ring: a file of its own
    sender = SpillSender(worker_end)
    receiver = SpillReceiver(main, WORKER)
    try:
        encoder = Encoder(worker, sender)
        items = tuple(encoder.prepare(item)[0] for item in (in_ring, spilled, b"b" * OUT_OF_BAND_MIN_BYTES))
        encoded, size = encoder.encode_chunk(a_chunk(items))
        assert size == in_ring.nbytes + spilled.nbytes + OUT_OF_BAND_MIN_BYTES
        got = Decoder(owner, receiver, worker_id=WORKER).decode_frame(frame_of(encoded))
        assert (got.items[0] == in_ring).all() and (got.items[1] == spilled).all()
        assert got.items[2] == b"b" * OUT_OF_BAND_MIN_BYTES
        assert got.items[0].flags.writeable and got.items[1].flags.writeable
    finally:
        sender.close()
        receiver.close()


class RefusingSpill:
    """A spill channel that can have no file: every buffer takes the pipe."""

    def send(self, raw: memoryview) -> str:
        return "no file (a test)"


def test_buffers_without_shared_memory_travel_in_the_frame_writable_and_say_why():
    array = np.arange(50_000, dtype=np.float64)
    causes: list[str] = []
    encoded, _ = Encoder(None, RefusingSpill()).encode_chunk(a_chunk((array, "small")))  # type: ignore[arg-type]
    got = Decoder(None, None, causes.append, worker_id=WORKER).decode_frame(frame_of(encoded))
    assert (got.items[0] == array).all() and got.items[0].flags.writeable and got.items[1] == "small"
    assert causes == ["no file (a test)"]
    without_channel, _ = Encoder(None).encode_chunk(a_chunk((array,)))
    [alone] = Decoder(None, worker_id=WORKER).decode_frame(frame_of(without_channel)).items
    assert (alone == array).all() and alone.flags.writeable


def test_a_message_travels_as_a_frame_of_its_own():
    frame = memoryview(b"".join(message_parts(EpochEnd(5), WORKER)))
    assert Decoder(None, worker_id=WORKER).decode_frame(frame) == EpochEnd(5)


def encoded_bytes(chunk: Chunk) -> bytes:
    return b"".join(bytes(part) for part in Encoder(None).encode_chunk(chunk)[0].parts)


def expect_frame_error(frame: bytes, match: str) -> None:
    with pytest.raises(FrameError, match=match) as raised:
        Decoder(None, worker_id=WORKER).decode_frame(memoryview(frame))
    assert raised.value.worker_id == WORKER and f"worker {WORKER}" in str(raised.value)
    assert isinstance(raised.value, WorkerError) and "start again" in str(raised.value)


def test_a_truncated_frame_raises_a_typed_error_naming_the_worker():
    whole = encoded_bytes(a_chunk((1, 2, 3)))
    for cut in (0, 1, HEADER.size - 1):
        expect_frame_error(whole[:cut], "fewer than a header")
    for cut in (HEADER.size, len(whole) - 1):
        expect_frame_error(whole[:cut], "where its header says")
    expect_frame_error(whole + b"\0", "where its header says")


def test_a_frame_with_buffers_cut_short_raises_a_typed_error():
    array = np.zeros(OUT_OF_BAND_MIN_BYTES, dtype=np.uint8)
    whole = encoded_bytes(a_chunk((array,)))
    expect_frame_error(whole[:-1], "where its header and buffers say")


def test_a_corrupt_header_raises_a_typed_error_naming_the_worker():
    whole = bytearray(encoded_bytes(a_chunk((1,))))
    expect_frame_error(b"XX" + whole[2:], "not a version 1 frame's")
    kind = whole[:]
    kind[3] = 9
    expect_frame_error(bytes(kind), "unknown kind 9")
    with pytest.raises(FrameError, match="it names worker 3") as raised:
        Decoder(None, worker_id=1).decode_frame(memoryview(whole))
    assert raised.value.worker_id == 1
    assert read_header(memoryview(whole), WORKER).magic == MAGIC


def test_a_chunk_out_of_sequence_raises_a_typed_error():
    decoder = Decoder(None, worker_id=WORKER)
    decoder.decode_frame(memoryview(encoded_bytes(a_chunk((1,), sequence=0))))
    with pytest.raises(FrameError, match="chunk 2 came where chunk 1 was due"):
        decoder.decode_frame(memoryview(encoded_bytes(a_chunk((1,), sequence=2))))


def test_an_item_whose_class_is_missing_here_names_the_worker():
    frame = bytearray(encoded_bytes(a_chunk((EpochEnd(1),))))
    at = frame.index(b"EpochEnd")
    frame[at : at + 8] = b"EpochXnd"  # a class the main process cannot import
    with pytest.raises(WorkerError, match=f"an item from worker {WORKER} could not be unpickled"):
        Decoder(None, worker_id=WORKER).decode_frame(memoryview(frame))


def test_frame_errors_survive_pickling():
    error = FrameError(2, "worker 2 sent a frame that does not read as one")
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is FrameError and again.worker_id == 2 and str(again) == str(error)


def test_spilled_descriptors_keep_their_numbers():
    chunk = a_chunk(("x",))
    from conveyor.workers.transport.frame import chunk_parts, read_descriptors

    raw = pickle.dumps((chunk.items, chunk.positions), protocol=5)
    parts = chunk_parts(chunk, raw, chunk.states.pickled, [(4, 100), Spilled(9, 5000)])
    frame = memoryview(b"".join(bytes(part) for part in parts))
    assert read_descriptors(frame, read_header(frame, WORKER), WORKER) == [(4, 100), Spilled(9, 5000)]
