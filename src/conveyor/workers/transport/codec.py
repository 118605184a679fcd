"""Encoding a worker's chunk for the main process, and decoding it there.

Pickle protocol 5, with large buffers (numpy arrays, torch CPU tensors, ``bytes``, from
:data:`OUT_OF_BAND_MIN_BYTES` up) taken out of band. The worker's :class:`Encoder` puts
each one where it travels best:

1. its worker's page ring (:mod:`conveyor.workers.transport.ring`): one copy, reused pages;
2. where it does not fit there (larger than the ring, or the ring full of leases the user
   still holds), a shared file of its own (:mod:`conveyor.workers.transport.spill`): one copy;
3. where neither can be had (no shared memory on this system, or it could not be
   reserved), in the chunk's frame, through the response pipe: a few copies, slow.

The main process's :class:`Decoder` turns each back into a buffer the user owns: ring
pages and spilled files as writable arrays over the shared memory itself (no copy),
pipe bytes as a copy of the bytes that arrived. An array or tensor arrives writable even when the
worker's was read-only (see :class:`~conveyor.workers.transport.buffers.Placed`): it is a copy.
"""

from __future__ import annotations

import io
import pickle
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from conveyor.errors import WorkerError
from conveyor.workers.transport.buffers import (
    OUT_OF_BAND_MIN_BYTES,
    SCALARS,
    BytesOutOfBand,
    Placed,
    prepare_item,
    reduce_out_of_band,
    writable_reduction,
)
from conveyor.workers.transport.chunk_states import ChunkStates
from conveyor.workers.transport.frame import (
    HEADER,
    MESSAGE,
    Piped,
    chunk_parts,
    frame_error,
    read_descriptors,
    read_header,
)
from conveyor.workers.transport.in_place import InPlaceArrays
from conveyor.workers.transport.protocol import Chunk
from conveyor.workers.transport.ring import ShmRing
from conveyor.workers.transport.spill import Spilled, SpillReceiver, SpillSender


def _main_class(qualname: str) -> type:
    """The main process's own class of that name in ``__main__``."""
    target: Any = sys.modules["__main__"]
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


class _Pickler(pickle.Pickler):
    """Protocol-5 pickler that sends large numpy arrays, torch CPU tensors and bytes out of
    band, and classes of the user's script (``__main__``) by name: under ``spawn`` a
    worker holds a by-value copy of them, which must become the main process's class.

    Arrays and tensors are reduced to ``(buffer, dtype name, shape)``: leaner than numpy's
    and torch's own reductions on both sides, and a tensor travels as its raw bytes, so
    dtypes numpy lacks (``bfloat16``, ``float8``) go out of band too. What does not fit
    that form (strided views, structured or object dtypes, subclasses, tensors that need
    grad or carry a conjugate bit) takes the library's own reduction.
    """

    def reducer_override(self, obj: Any) -> Any:
        kind = type(obj)
        if kind is Placed:
            return obj.rebuild, (pickle.PickleBuffer(obj), *obj.args)
        reduced = reduce_out_of_band(obj)
        if reduced is not NotImplemented:
            return writable_reduction(reduced)
        if isinstance(obj, type) and obj.__module__ in ("__main__", "__mp_main__"):
            return _main_class, (obj.__qualname__,)
        return NotImplemented


class EncodedFrame(NamedTuple):
    """A chunk's frame, as the parts to write one after the other (the buffers among
    them stay referenced until it is written)."""

    parts: list[Any]


class Encoder:
    """Worker side: turns an object into ``(pickle bytes, buffer descriptors, bytes of
    large buffers)``.

    A descriptor is ``(first page, length)`` for a buffer in the ring, :class:`Spilled`
    for one in a file of its own, :class:`Piped` for one that travels in the message
    because neither could be had, or the :class:`pickle.PickleBuffer` itself where this
    worker has no shared memory at all (the main process knew it when it started the
    worker). Buffers that travel in the frame are written into it by the caller
    (:meth:`encode_chunk`), without a copy.
    One pickler serves every chunk (its memo cleared each time): building a pickler costs
    more than pickling a chunk of a few large items.
    """

    def __init__(self, ring: ShmRing | None, spill: SpillSender | None = None):
        self._ring = ring
        self._spill = spill
        self._stream = io.BytesIO()
        self._buffers: list[pickle.PickleBuffer | Placed] = []
        self._pickler = _Pickler(self._stream, protocol=5, buffer_callback=self._out_of_band)
        self._unsent: dict[int, Placed] = {}  # buffers placed by prepare(), by id, until encoded
        self._placed: dict[int, Placed] = {}  # the item being prepared: its placed buffers (see _place)
        # Arrays made in the ring by conveyor.shared_empty, sent from where they are.
        self._in_place = InPlaceArrays(ring, OUT_OF_BAND_MIN_BYTES) if ring is not None else None

    @property
    def ring_capacity(self) -> int:
        """Bytes of this worker's ring (0 without one)."""
        return self._ring.capacity if self._ring is not None else 0

    def allocate(self, nbytes: int) -> Any:
        """A writable uint8 array of ``nbytes`` in this worker's ring, which an item then
        carries to the main process without a copy; None where an ordinary array is the
        better place (no ring, a small size, or no free run of pages)."""
        return self._in_place.allocate(nbytes) if self._in_place is not None else None

    def prepare(self, item: Any) -> tuple[Any, int]:
        """``(item ready to encode, bytes of large buffers it carries)`` (see
        :func:`prepare_item`); each large buffer that the ring takes is copied there now,
        and stands in the item as a :class:`Placed`."""
        if type(item) in SCALARS:  # the common small item: nothing to look into or place
            return item, 0
        if self._ring is None:
            return prepare_item(item)
        try:
            return prepare_item(item, self._place)
        finally:
            self._placed.clear()

    def _place(self, value: Any) -> Any:
        """A large value of the item being prepared, in the ring: its :class:`Placed`, or
        the value itself where the ring cannot take it (``_placed``: the item's buffers
        placed so far, by id of what the item holds, so that a buffer it holds twice
        travels once, as the pickler's memo would have it; a ``bytes`` value's wrapper is
        new on each call, and freed once placed, so its bytes are the key)."""
        placed = self._placed
        key = id(value.data) if type(value) is BytesOutOfBand else id(value)
        done = placed.get(key)
        if done is not None:
            return done
        reduced = reduce_out_of_band(value)
        if reduced is NotImplemented:
            return value
        rebuild, (buffer, *args) = reduced
        if type(buffer) is not pickle.PickleBuffer:
            return value  # a small tensor: its bytes travel in the stream
        raw = buffer.raw()
        if raw.nbytes < OUT_OF_BAND_MIN_BYTES:
            return value
        where = self._made_in_place(raw) or self._ring.write(raw)  # type: ignore[union-attr]
        if where is None:
            return value  # the ring is full: the chunk's encoding finds it another place
        marker = placed[key] = Placed.make(rebuild, tuple(args), raw.nbytes, descriptor=where)
        self._unsent[id(marker)] = marker
        return marker

    def discard(self) -> None:
        """The chunk being built will not be sent: give its placed buffers' pages back."""
        unsent, self._unsent = self._unsent, {}
        for marker in unsent.values():
            assert self._ring is not None and marker.descriptor is not None  # only the ring places markers
            self._ring.unclaim(*marker.descriptor)

    def encode(self, obj: Any) -> tuple[bytes, list[Any], int]:
        """Encode ``obj``; large ``bytes`` in it must already be wrapped by :func:`prepare_item`."""
        stream, buffers, ring, spill = self._stream, self._buffers, self._ring, self._spill
        size = 0
        sent: list[Placed] = []
        try:
            self._pickler.dump(obj)
            payload = stream.getvalue()
            descriptors: list[Any] = []
            for buffer in buffers:
                if isinstance(buffer, Placed):
                    if buffer.descriptor is not None:
                        descriptors.append(buffer.descriptor)
                        size += buffer.nbytes
                        sent.append(buffer)
                        continue
                    assert buffer.source is not None  # a Placed not in the ring stands for a source
                    buffer = buffer.source  # a read-only buffer: placed now, as any other
                raw = buffer.raw()
                size += raw.nbytes
                placed: Any = (self._made_in_place(raw) or ring.write(raw)) if ring is not None else None
                if placed is None:
                    if spill is None:
                        placed = buffer
                    else:
                        placed = spill.send(raw)
                        if type(placed) is str:
                            placed = Piped(buffer, placed)
                descriptors.append(placed)
        except BaseException:
            self.discard()  # the chunk will not be sent: its placed buffers' pages go back
            raise
        finally:
            # Nothing of this chunk may stay referenced here (its arrays, in the memo or the
            # list): the descriptors hold what still has to travel, until it is sent.
            self._pickler.clear_memo()
            buffers.clear()
            stream.seek(0)
            stream.truncate()
        for marker in sent:
            del self._unsent[id(marker)]
        return payload, descriptors, size

    def encode_chunk(self, chunk: Chunk) -> tuple[EncodedFrame, int]:
        """``(chunk's frame, bytes of large buffers in it)``: see
        :mod:`conveyor.workers.transport.frame`."""
        states = chunk.states.pickled  # first: a state that does not pickle leaves nothing placed
        payload, descriptors, size = self.encode((chunk.items, chunk.positions))
        return EncodedFrame(chunk_parts(chunk, payload, states, descriptors)), size

    def _made_in_place(self, raw: memoryview) -> tuple[int, int] | None:
        """Where ``raw`` already is in the ring, when an array made there holds it."""
        in_place = self._in_place
        if in_place is None or not in_place.pending():
            return None
        return in_place.take(np.frombuffer(raw, dtype=np.uint8).ctypes.data, raw.nbytes)

    def idle(self) -> None:
        """The worker is idle: free the spill files it keeps for reuse."""
        if self._spill is not None:
            self._spill.idle()

    def close(self) -> None:
        """Unmap the ring and close the spill channel (the worker's end)."""
        if self._in_place is not None:
            self._in_place.close()
        if self._ring is not None:
            self._ring.close()
        if self._spill is not None:
            self._spill.close()

    def _out_of_band(self, buffer: pickle.PickleBuffer) -> bool:
        raw = buffer.raw()
        if type(raw.obj) is Placed:
            self._buffers.append(raw.obj)  # in the ring already: its descriptor goes
            return False
        if raw.nbytes < OUT_OF_BAND_MIN_BYTES:
            return True  # true: keep it in band
        self._buffers.append(buffer)
        return False


class Decoder:
    """Main side: the inverse of :class:`Encoder`; ring and spilled buffers arrive as
    leases. ``notice(cause)`` hears why a buffer had to take the pipe. :meth:`decode_frame`
    reads worker ``worker_id``'s frames (and checks that its chunks come in sequence)."""

    def __init__(
        self,
        ring: ShmRing | None,
        spill: SpillReceiver | None = None,
        notice: Callable[[str], None] | None = None,
        worker_id: int = -1,
    ):
        self._ring = ring
        self._spill = spill
        self._notice = notice
        self.worker_id = worker_id
        self._sequence = 0  # the next chunk's

    def decode(self, payload: Any, descriptors: list[Any]) -> Any:
        # Every buffer is taken before unpickling, so that a payload that fails to unpickle
        # still consumes its spilled descriptors (and its leases end with it).
        return pickle.loads(payload, buffers=[self._buffer(d) for d in descriptors])

    def decode_frame(self, frame: memoryview) -> Any:
        """A frame as the :class:`Chunk` or the message it carries. Raises
        :class:`~conveyor.errors.FrameError` when it does not read as a frame, and
        :class:`~conveyor.errors.WorkerError` when what it carries does not unpickle here."""
        worker_id = self.worker_id
        _, _, kind, _, sequence, generation, count, last, buffers, items_bytes, states_bytes = header = read_header(
            frame, worker_id
        )
        start = HEADER.size
        end = start + items_bytes
        if kind == MESSAGE:
            return self._unpickled(frame[start:end], [])
        if sequence != self._sequence:
            raise frame_error(worker_id, f"chunk {sequence} came where chunk {self._sequence} was due")
        self._sequence = sequence + 1
        descriptors = read_descriptors(frame, header, worker_id) if buffers else []
        items, positions = self._unpickled(frame[start:end], descriptors)
        if len(items) != count or len(positions) != count:
            raise frame_error(worker_id, f"{len(items)} items where its header says {count}")
        states = ChunkStates(bytes(frame[end : end + states_bytes]), last)
        return Chunk(worker_id, generation, sequence, items, positions, states)

    def _unpickled(self, payload: memoryview, descriptors: list[Any]) -> Any:
        try:
            return self.decode(payload, descriptors)
        except Exception as error:
            raise WorkerError(
                f"an item from worker {self.worker_id} could not be unpickled in the main process "
                f"({type(error).__name__}: {error}); its class must be importable here"
            ) from error

    def _buffer(self, descriptor: Any) -> Any:
        kind = type(descriptor)
        if kind is tuple:
            return self._ring.lease(*descriptor)  # type: ignore[union-attr]
        if kind is Spilled:
            return self._spill.take(descriptor)  # type: ignore[union-attr]
        if kind is Piped:
            if self._notice is not None:
                self._notice(descriptor.cause)
            descriptor = descriptor.data
        # A buffer that travelled in the frame (or, in tests, was pickled in band) is
        # copied, so that arrays over it are writable and own their memory; a writable
        # one pickled in band arrived as a bytearray already: the user's, writable.
        return descriptor if type(descriptor) is bytearray else bytearray(descriptor)
