"""An item's large buffers: which values travel out of band and how (each kind's
reduction to one buffer and the function that rebuilds it in the main process), finding
them in an item (:func:`prepare_item`), and the marker of a buffer already placed in the
worker's ring (:class:`Placed`). :mod:`conveyor.workers.transport.codec` encodes with them.

The rebuilding functions run in the main process, on a lease of ring pages, a spilled
file's array, or the bytes that came through the pipe.
"""

from __future__ import annotations

import functools
import pickle
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

#: Buffers smaller than this stay inside the pickle stream.
OUT_OF_BAND_MIN_BYTES = 64 * 1024


class BytesOutOfBand:
    """Marks a large ``bytes`` object so the pickler sends it out of band."""

    __slots__ = ("data",)

    def __init__(self, data: bytes):
        self.data = data


def rebuild_bytes(buffer: Any) -> bytes:
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


class Placed(bytearray):
    """A stand-in for a large buffer in a chunk's pickle stream, rebuilt in the main
    process with ``rebuild(buffer, *args)`` as the buffer itself would have been. Either
    the buffer was copied into the worker's ring when its item was made
    (:meth:`~conveyor.workers.transport.codec.Encoder.prepare`: ``descriptor`` says where; the
    worker's own buffer is then free at once, and was copied while still in the cache),
    or it is a read-only buffer (``source``) that the encoder places as any other. An
    empty ``bytearray``, so that a :class:`pickle.PickleBuffer` can wrap it, the buffer
    callback can tell it apart, and the buffer arrives writable: the stream marks a
    read-only buffer, and the main process would rebuild a read-only array over what is
    the user's own copy."""

    descriptor: tuple[int, int] | None
    source: pickle.PickleBuffer | None
    rebuild: Callable[..., Any]
    args: tuple[Any, ...]
    nbytes: int

    @classmethod
    def make(
        cls,
        rebuild: Callable[..., Any],
        args: tuple[Any, ...],
        nbytes: int,
        descriptor: tuple[int, int] | None = None,
        source: pickle.PickleBuffer | None = None,
    ) -> Placed:
        marker = cls()
        marker.rebuild, marker.args, marker.nbytes = rebuild, args, nbytes
        marker.descriptor, marker.source = descriptor, source
        return marker


def writable_reduction(reduced: Any) -> Any:
    """``reduced`` (an out-of-band reduction, or NotImplemented), with a large read-only
    buffer (an array over ``bytes``) behind a :class:`Placed` stand-in, so that it
    arrives writable like every other."""
    if reduced is NotImplemented:
        return reduced
    rebuild, (buffer, *args) = reduced
    if type(buffer) is not pickle.PickleBuffer:
        return reduced
    raw = buffer.raw()
    if not raw.readonly or raw.nbytes < OUT_OF_BAND_MIN_BYTES:
        return reduced
    marker = Placed.make(rebuild, tuple(args), raw.nbytes, source=buffer)
    return rebuild, (pickle.PickleBuffer(marker), *args)


def reduce_out_of_band(value: Any) -> Any:
    """``(rebuild, (PickleBuffer, *args))`` for a value that travels out of band as one
    buffer (an array, a tensor, large bytes), or NotImplemented."""
    kind = type(value)
    if kind is np.ndarray:
        return reduce_array(value)
    if kind is BytesOutOfBand:
        return rebuild_bytes, (pickle.PickleBuffer(value.data),)
    if kind.__name__ == "Tensor" and kind.__module__ == "torch":
        return reduce_tensor(value)
    return NotImplemented


def reduce_array(array: np.ndarray) -> Any:
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
    flat = array.reshape(-1).view(np.uint8)
    return _rebuild_array, (pickle.PickleBuffer(flat), dtype.str, array.shape)  # type: ignore[arg-type]  # numpy's stubs give arrays the buffer protocol from Python 3.12 on


def reduce_tensor(tensor: Any) -> Any:
    if (
        not tensor.is_cpu
        or tensor.is_nested  # strided in layout, but not one buffer: torch's own reduction
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


#: Item types that never carry a large buffer: returned as they are, at the first check.
SCALARS = frozenset({int, float, str, bool, type(None)})


def prepare_item(item: Any, place: Callable[[Any], Any] | None = None, depth: int = 0) -> tuple[Any, int]:
    """``(item ready to encode, bytes of large buffers it carries)``.

    Large ``bytes`` values are wrapped so that they travel out of band (containers are
    copied only when something inside changes); tuples, lists and dicts are looked into
    three levels deep. Scalars, the common small item, return at the first check.
    ``place``, when given, is called on each large value found (an array, a tensor, the
    wrapped bytes) and its result stands in the value's place (see
    :meth:`~conveyor.workers.transport.codec.Encoder.prepare`).
    """
    kind = type(item)
    if kind in SCALARS:
        return item, 0
    if kind is bytes:
        size = len(item)
        if size < OUT_OF_BAND_MIN_BYTES:
            return item, 0
        wrapped = BytesOutOfBand(item)
        return (wrapped if place is None else place(wrapped)), size
    nbytes = getattr(item, "nbytes", None)  # numpy arrays and torch tensors
    if isinstance(nbytes, int):
        if nbytes < OUT_OF_BAND_MIN_BYTES:
            return item, 0
        return (item if place is None else place(item)), nbytes
    if depth >= 3:
        return item, 0
    if kind is tuple or kind is list:
        for value in item:
            if type(value) not in SCALARS:
                break
        else:  # scalars only (an id and a label): a tenth of the cost of looking into each
            return item, 0
        prepared = [prepare_item(value, place, depth + 1) for value in item]
        large = sum(size for _, size in prepared)
        if any(new is not old for (new, _), old in zip(prepared, item, strict=True)):
            return kind(new for new, _ in prepared), large
        return item, large
    if kind is dict:
        for value in item.values():
            if type(value) not in SCALARS:
                break
        else:
            return item, 0
        prepared_d = {key: prepare_item(value, place, depth + 1) for key, value in item.items()}
        large = sum(size for _, size in prepared_d.values())
        if any(prepared_d[key][0] is not value for key, value in item.items()):
            return {key: new for key, (new, _) in prepared_d.items()}, large
        return item, large
    return item, 0
