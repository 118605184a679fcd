"""The layout of one response frame: what a worker writes for a chunk or a message.

A frame is, in this order:

1. a fixed header (:data:`HEADER`): magic and version, the kind of frame, the worker,
   the chunk's sequence number and generation, its item count, the index of its last
   state, how many out-of-band buffers it carries, and the sizes of the two sections
   that follow;
2. the *items section*: one pickle of ``(items, positions)`` (a chunk), or of the message
   (any other kind), its large buffers out of band (pickle protocol 5);
3. the *states section*: one pickle of the chunk's states, side by side with the items,
   not inside them: the main process unpickles it only when it needs a state (see
   :mod:`conveyor.workers.transport.chunk_states`);
4. the descriptor table: one fixed-size record (:data:`DESCRIPTOR`) per out-of-band
   buffer, in the order the items' pickle takes them: in the worker's ring (first page,
   length), in a spilled file (sequence number on the spill channel, length), or in this
   frame (its length);
5. the bytes of the buffers that travel in the frame (where shared memory could not be
   had), each followed, for one that took the pipe because of a failure, by the text of
   the cause.

The pipe's own framing (:mod:`conveyor.workers.transport.framing`) delimits frames; this
module only lays them out and reads them back, and checks what it reads: a frame that
does not add up raises :class:`~conveyor.errors.FrameError` naming the worker.
"""

from __future__ import annotations

import pickle
import struct
from functools import partial
from typing import Any, NamedTuple

from conveyor.errors import FrameError
from conveyor.workers.transport.protocol import Chunk
from conveyor.workers.transport.spill import Spilled

MAGIC = b"CF"
VERSION = 1
#: A frame's kinds: a chunk of items, or any other message (pickled whole).
CHUNK, MESSAGE = 1, 2
#: magic, version, kind, worker id, sequence, generation, items, last state, buffers,
#: items section bytes, states section bytes.
HEADER = struct.Struct("<2sBBiIqiiIQQ")
#: A buffer's descriptor: where (:data:`RING`, :data:`SPILLED`, :data:`INLINE`,
#: :data:`PIPED`) and two numbers whose meaning depends on it (see the module).
DESCRIPTOR = struct.Struct("<BQQ")
RING, SPILLED, INLINE, PIPED = range(4)


class Piped(NamedTuple):
    """A chunk's descriptor of a buffer that travels in its frame because shared memory
    could not be had for it; ``cause`` says why (the main process warns once)."""

    data: Any  # a pickle.PickleBuffer in the worker, a memoryview of the frame in the main process
    cause: str


class Header(NamedTuple):
    """A frame's header, read (see :data:`HEADER`)."""

    magic: bytes
    version: int
    kind: int
    worker_id: int
    sequence: int
    generation: int
    item_count: int
    last: int
    buffers: int
    items_bytes: int
    states_bytes: int


#: ``_header(fields)``: a :class:`Header`, made in C (once per frame: ``_make`` is Python).
_header = partial(tuple.__new__, Header)


def chunk_parts(chunk: Chunk, items: bytes, states: bytes, buffers: list[Any]) -> list[Any]:
    """``chunk``'s frame as the parts to write one after the other (no copy of the
    pickles or of buffers that travel in the frame): ``items``, the pickle of its items
    and positions, whose out-of-band buffers ``buffers`` describes (the encoder's
    descriptors, see :class:`~conveyor.workers.transport.codec.Encoder`), and ``states``,
    the pickle of its states."""
    count, last = len(chunk.items), chunk.states.last
    header = HEADER.pack(
        MAGIC, VERSION, CHUNK, chunk.worker_id, chunk.sequence, chunk.generation, count, last, len(buffers),
        len(items), len(states),
    )  # fmt: skip
    if not buffers:
        return [header, items, states]
    table = bytearray()
    inline: list[Any] = []
    for descriptor in buffers:
        kind = type(descriptor)
        if kind is tuple:
            table += DESCRIPTOR.pack(RING, *descriptor)
        elif kind is Spilled:
            table += DESCRIPTOR.pack(SPILLED, descriptor.seq, descriptor.length)
        elif kind is Piped:
            raw = descriptor.data.raw()
            cause = descriptor.cause.encode("utf-8")
            table += DESCRIPTOR.pack(PIPED, raw.nbytes, len(cause))
            inline += (raw, cause)
        else:  # a pickle.PickleBuffer: this worker has no shared memory
            raw = descriptor.raw()
            table += DESCRIPTOR.pack(INLINE, raw.nbytes, 0)
            inline.append(raw)
    return [header, items, states, table, *inline]


def message_parts(message: Any, worker_id: int) -> list[bytes]:
    """Any other message's frame, as the parts to write."""
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return [HEADER.pack(MAGIC, VERSION, MESSAGE, worker_id, 0, 0, 0, -1, 0, len(body), 0), body]


def read_header(frame: memoryview, worker_id: int) -> Header:
    """The header of ``frame`` from worker ``worker_id``, checked against the frame's
    length (the descriptor table's inline sizes are checked by :func:`read_descriptors`)."""
    if len(frame) < HEADER.size:
        raise frame_error(worker_id, f"{len(frame)} bytes, fewer than a header's {HEADER.size}")
    header = _header(HEADER.unpack_from(frame))
    magic, version, kind, sender, _, _, _, _, buffers, items_bytes, states_bytes = header
    if magic != MAGIC or version != VERSION:
        raise frame_error(worker_id, f"it starts with {bytes(frame[:3])!r}, not a version {VERSION} frame's {MAGIC!r}")
    if kind != CHUNK and kind != MESSAGE:
        raise frame_error(worker_id, f"unknown kind {kind}")
    if kind == CHUNK and sender != worker_id:
        raise frame_error(worker_id, f"it names worker {sender}")
    least = HEADER.size + items_bytes + states_bytes + buffers * DESCRIPTOR.size
    if len(frame) != least and (not buffers or len(frame) < least):
        raise frame_error(worker_id, f"{len(frame)} bytes where its header says {least}")
    return header


def read_descriptors(frame: memoryview, header: Header, worker_id: int) -> list[Any]:
    """The buffer descriptors of a chunk's ``frame``, in the forms the encoder made
    them, with the buffers that travel in the frame as views of it."""
    at = HEADER.size + header.items_bytes + header.states_bytes
    inline = at + header.buffers * DESCRIPTOR.size
    descriptors: list[Any] = []
    for kind, first, second in DESCRIPTOR.iter_unpack(frame[at:inline]):
        if kind == RING:
            descriptors.append((first, second))
        elif kind == SPILLED:
            descriptors.append(Spilled(first, second))
        elif kind == INLINE:
            descriptors.append(frame[inline : inline + first])
            inline += first
        elif kind == PIPED:
            cause = bytes(frame[inline + first : inline + first + second]).decode("utf-8", "replace")
            descriptors.append(Piped(frame[inline : inline + first], cause))
            inline += first + second
        else:
            raise frame_error(worker_id, f"unknown buffer kind {kind}")
    if inline != len(frame):
        raise frame_error(worker_id, f"{len(frame)} bytes where its header and buffers say {inline}")
    return descriptors


def frame_error(worker_id: int, what: str) -> FrameError:
    return FrameError(
        worker_id,
        f"worker {worker_id} sent a frame that does not read as one: {what}. The response pipe is out of "
        "step (a worker of another conveyor version, or memory corrupted): shut the loader down and start again.",
    )
