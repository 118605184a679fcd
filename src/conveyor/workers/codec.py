"""Encoding a worker's chunk for the main process, and decoding it there.

Pickle protocol 5, with large buffers (numpy arrays, torch CPU tensors, ``bytes``, from
:data:`OUT_OF_BAND_MIN_BYTES` up) taken out of band. The worker's :class:`Encoder` puts
each one where it travels best:

1. its worker's page ring (:mod:`conveyor.workers.ring`): one copy, reused pages;
2. where it does not fit there (larger than the ring, or the ring full of leases the user
   still holds), a shared file of its own (:mod:`conveyor.workers.spill`): one copy;
3. where neither can be had (no shared memory on this system, or it could not be
   reserved), in the chunk's message, through the response pipe: a few copies, slow.

The main process's :class:`Decoder` turns each back into a buffer the user owns: ring
pages and spilled files as writable arrays over the shared memory itself (no copy),
pipe bytes as the bytes that arrived.
"""

from __future__ import annotations

import functools
import io
import pickle
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from conveyor.workers.ring import ShmRing
from conveyor.workers.spill import Spilled, SpillReceiver, SpillSender

#: Buffers smaller than this stay inside the pickle stream.
OUT_OF_BAND_MIN_BYTES = 64 * 1024


class _BytesOutOfBand:
    """Marks a large ``bytes`` object so the pickler sends it out of band."""

    __slots__ = ("data",)

    def __init__(self, data: bytes):
        self.data = data


def _rebuild_bytes(buffer: Any) -> bytes:
    return bytes(buffer)


def _raw_bytes(buffer: Any) -> np.ndarray:
    """A buffer as a uint8 array: a lease (ring or spill) already is one; pipe bytes are viewed."""
    return buffer if type(buffer) is np.ndarray else np.frombuffer(buffer, dtype=np.uint8)


def _rebuild_array(buffer: Any, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    array = _raw_bytes(buffer)
    if dtype != "|u1":
        array = array.view(dtype)
    return array if len(shape) == 1 else array.reshape(shape)


def _rebuild_tensor(buffer: Any, dtype: str, shape: tuple[int, ...]) -> Any:
    import torch

    tensor = torch.from_numpy(_raw_bytes(buffer))
    if dtype != "uint8":
        tensor = tensor.view(getattr(torch, dtype))
    return tensor if len(shape) == 1 else tensor.reshape(shape)


def _rebuild_small_tensor(raw: bytes, dtype: str, shape: tuple[int, ...]) -> Any:
    import torch

    if not raw:
        return torch.empty(shape, dtype=getattr(torch, dtype))
    tensor = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    if dtype != "uint8":
        tensor = tensor.view(getattr(torch, dtype))
    return tensor if len(shape) == 1 else tensor.reshape(shape)


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
        if kind is np.ndarray:
            return _reduce_array(obj)
        if kind.__name__ == "Tensor" and kind.__module__ == "torch":
            return _reduce_tensor(obj)
        if kind is _BytesOutOfBand:
            return _rebuild_bytes, (pickle.PickleBuffer(obj.data),)
        if isinstance(obj, type) and obj.__module__ in ("__main__", "__mp_main__"):
            return _main_class, (obj.__qualname__,)
        return NotImplemented


def _reduce_array(array: np.ndarray) -> Any:
    dtype = array.dtype
    if (
        array.nbytes < OUT_OF_BAND_MIN_BYTES
        or not array.flags.c_contiguous
        or dtype.hasobject
        or dtype.fields is not None
        or dtype.subdtype is not None
        or dtype.metadata is not None
    ):
        return NotImplemented
    # As bytes: some dtypes (datetimes) cannot export a buffer of their own.
    return _rebuild_array, (pickle.PickleBuffer(array.reshape(-1).view(np.uint8)), dtype.str, array.shape)


def _reduce_tensor(tensor: Any) -> Any:
    if (
        not tensor.is_cpu
        or tensor.layout != _torch().strided
        or tensor.requires_grad
        or tensor.is_quantized
        or tensor.is_conj()
        or tensor.is_neg()
        or not tensor.is_contiguous()
    ):
        return NotImplemented
    dtype = tensor.dtype
    if tensor.nbytes < OUT_OF_BAND_MIN_BYTES:  # in band, as its bytes: torch's own reduction
        raw = tensor.reshape(-1).view(_torch().uint8).numpy().tobytes()  # goes through torch.load
        return _rebuild_small_tensor, (raw, _TORCH_DTYPE_NAMES[dtype], tuple(tensor.shape))
    if _has_numpy_twin(dtype):  # numpy's view of the memory: cheaper than torch's reshaping
        raw = tensor.numpy()
        if raw.ndim != 1:
            raw = raw.reshape(-1)
        if raw.dtype != np.uint8:
            raw = raw.view(np.uint8)
    else:
        raw = tensor.reshape(-1).view(_torch().uint8).numpy()
    return _rebuild_tensor, (pickle.PickleBuffer(raw), _TORCH_DTYPE_NAMES[dtype], tuple(tensor.shape))


def _torch() -> Any:
    return sys.modules["torch"]  # a tensor exists, so torch is loaded


class _TorchDtypeNames(dict):
    """``torch.bfloat16 -> "bfloat16"``, filled as dtypes are met."""

    def __missing__(self, dtype: Any) -> str:
        name = self[dtype] = str(dtype).removeprefix("torch.")
        return name


_TORCH_DTYPE_NAMES = _TorchDtypeNames()


@functools.cache
def _has_numpy_twin(dtype: Any) -> bool:
    """Whether ``Tensor.numpy()`` works for this torch dtype."""
    torch = _torch()
    return dtype in {
        *(torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool),
        *(torch.float16, torch.float32, torch.float64, torch.complex64, torch.complex128),
    }


_SCALARS = frozenset({int, float, str, bool, type(None)})


def prepare_item(item: Any, depth: int = 0) -> tuple[Any, int]:
    """``(item ready to encode, bytes of large buffers it carries)``.

    Large ``bytes`` values are wrapped so that they travel out of band (containers are
    copied only when something inside changes); tuples, lists and dicts are looked into
    three levels deep. Scalars, the common small item, return at the first check.
    """
    kind = type(item)
    if kind in _SCALARS:
        return item, 0
    if kind is bytes:
        size = len(item)
        return (_BytesOutOfBand(item), size) if size >= OUT_OF_BAND_MIN_BYTES else (item, 0)
    nbytes = getattr(item, "nbytes", None)  # numpy arrays and torch tensors
    if isinstance(nbytes, int):
        return item, nbytes if nbytes >= OUT_OF_BAND_MIN_BYTES else 0
    if depth >= 3:
        return item, 0
    if kind is tuple or kind is list:
        prepared = [prepare_item(value, depth + 1) for value in item]
        large = sum(size for _, size in prepared)
        if any(new is not old for (new, _), old in zip(prepared, item, strict=True)):
            return kind(new for new, _ in prepared), large
        return item, large
    if kind is dict:
        prepared_d = {key: prepare_item(value, depth + 1) for key, value in item.items()}
        large = sum(size for _, size in prepared_d.values())
        if any(prepared_d[key][0] is not value for key, value in item.items()):
            return {key: new for key, (new, _) in prepared_d.items()}, large
        return item, large
    return item, 0


class Piped(NamedTuple):
    """A chunk's descriptor of a buffer that travels in its message because shared memory
    could not be had for it; ``cause`` says why (the main process warns once)."""

    data: pickle.PickleBuffer
    cause: str


class Encoder:
    """Worker side: turns an object into ``(pickle bytes, buffer descriptors, bytes of
    large buffers)``.

    A descriptor is ``(first page, length)`` for a buffer in the ring, :class:`Spilled`
    for one in a file of its own, :class:`Piped` for one that travels in the message
    because neither could be had, or the :class:`pickle.PickleBuffer` itself where this
    worker has no shared memory at all (the main process knew it when it started the
    worker). Buffers that travel in the message are pickled into it by the caller, once.
    One pickler serves every chunk (its memo cleared each time): building a pickler costs
    more than pickling a chunk of a few large items.
    """

    def __init__(self, ring: ShmRing | None, spill: SpillSender | None = None):
        self._ring = ring
        self._spill = spill
        self._stream = io.BytesIO()
        self._buffers: list[pickle.PickleBuffer] = []
        self._pickler = _Pickler(self._stream, protocol=5, buffer_callback=self._out_of_band)

    @property
    def ring_capacity(self) -> int:
        """Bytes of this worker's ring (0 without one)."""
        return self._ring.capacity if self._ring is not None else 0

    #: ``(item ready to encode, bytes of large buffers it carries)``: see :func:`prepare_item`.
    prepare = staticmethod(prepare_item)

    def encode(self, obj: Any) -> tuple[bytes, list[Any], int]:
        """Encode ``obj``; large ``bytes`` in it must already be wrapped by :func:`prepare_item`."""
        stream, buffers, ring, spill = self._stream, self._buffers, self._ring, self._spill
        size = 0
        try:
            self._pickler.dump(obj)
            payload = stream.getvalue()
            descriptors: list[Any] = []
            for buffer in buffers:
                raw = buffer.raw()
                size += raw.nbytes
                placed: Any = ring.write(raw) if ring is not None else None
                if placed is None:
                    if spill is None:
                        placed = buffer
                    else:
                        placed = spill.send(raw)
                        if type(placed) is str:
                            placed = Piped(buffer, placed)
                descriptors.append(placed)
        finally:
            # Nothing of this chunk may stay referenced here (its arrays, in the memo or the
            # list): the descriptors hold what still has to travel, until it is sent.
            self._pickler.clear_memo()
            buffers.clear()
            stream.seek(0)
            stream.truncate()
        return payload, descriptors, size

    def idle(self) -> None:
        """The worker is idle: free the spill files it keeps for reuse."""
        if self._spill is not None:
            self._spill.idle()

    def close(self) -> None:
        """Unmap the ring and close the spill channel (the worker's end)."""
        if self._ring is not None:
            self._ring.close()
        if self._spill is not None:
            self._spill.close()

    def _out_of_band(self, buffer: pickle.PickleBuffer) -> bool:
        if buffer.raw().nbytes < OUT_OF_BAND_MIN_BYTES:
            return True  # true: keep it in band
        self._buffers.append(buffer)
        return False


class Decoder:
    """Main side: the inverse of :class:`Encoder`; ring and spilled buffers arrive as
    leases. ``notice(cause)`` hears why a buffer had to take the pipe."""

    def __init__(
        self,
        ring: ShmRing | None,
        spill: SpillReceiver | None = None,
        notice: Callable[[str], None] | None = None,
    ):
        self._ring = ring
        self._spill = spill
        self._notice = notice

    def decode(self, payload: bytes, descriptors: list[Any]) -> Any:
        # Every buffer is taken before unpickling, so that a payload that fails to unpickle
        # still consumes its spilled descriptors (and its leases end with it).
        return pickle.loads(payload, buffers=[self._buffer(d) for d in descriptors])

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
        # Pickled in band, a writable buffer arrives as a bytearray (the user's, writable);
        # a read-only one as bytes, copied so that arrays over it are writable as ever.
        return descriptor if type(descriptor) is bytearray else bytearray(descriptor)
