"""Moving items from a worker to the main process: pickle protocol 5, large buffers out
of band through a reused shared-memory ring, handed to the user without a copy.

Each worker has one ring, created by the main process (its owner) as an anonymous shared
file (``memfd_create``; where that is missing, a ``/dev/shm`` file unlinked the moment it
is made) and handed to the worker as a file descriptor, so no name exists that a killed
process could leave behind. The worker writes each large buffer (numpy array, torch tensor,
``bytes``) into the ring and sends its offset. The main process gives the user an array
that *leases* those pages: the memory is the user's (writable, unchanged by later items,
valid after ``shutdown()``) for as long as anything refers to it. When the last
reference goes, the lease ends and the pages return to the worker, whatever the order. A
buffer that does not fit (too large, or the ring is full of leases the user still holds)
travels through the pipe instead: slower, never stuck.
"""

from __future__ import annotations

import contextlib
import functools
import io
import mmap
import os
import pickle
import secrets
import sys
import weakref
from multiprocessing import reduction
from typing import Any

import numpy as np

SHM_DIR = "/dev/shm"
SHM_PREFIX = "conveyor-"
#: Buffers smaller than this stay inside the pickle stream.
OUT_OF_BAND_MIN_BYTES = 64 * 1024
_MIN_RING = 4 * 1024 * 1024
PAGE = 4096  # the ring's allocation unit
#: Pages the worker's first look for free pages covers (the bytes in flight fit in them).
_FIRST_LOOK_PAGES = 1024
#: Flips a claim or release byte (``bytes.translate`` table): a page is free while its two agree.
_FLIP = bytes(value ^ 1 for value in range(256))


def shared_memory_available() -> bool:
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


def ring_capacity(wanted: int, rings: int) -> int:
    """The ring size to use so that ``rings`` rings fit in half of /dev/shm's free space
    (tmpfs allocates lazily: a ring it cannot back would kill the worker with SIGBUS);
    0 when not even a small one fits (then buffers go through the pipes)."""
    stats = os.statvfs(SHM_DIR)
    budget = stats.f_bavail * stats.f_frsize // 2 // max(rings, 1)
    capacity = wanted
    while capacity > budget and capacity >= 2 * _MIN_RING:
        capacity //= 2
    return capacity if capacity <= budget else 0


class ShmRing:
    """Pages of shared memory that a worker fills and the main process leases to the user.

    Layout: one *release* byte per page, then the pages. A page is free when the worker's
    own claim byte for it (private to the worker) equals its release byte. The worker
    claims a run of free pages (first fit) by flipping their claim bytes; the main process
    releases a buffer's pages by flipping their release bytes when the user's last
    reference to it goes, in any order: an array the user keeps pins its own pages only.

    No byte of shared memory has two writers, and the worker never searches the shared
    bytes in place. A store can land twice: glibc's ``memcpy`` writes a small range as
    two overlapping stores, and a CPU taken away between them lets the worker see the
    first, claim the pages, and only then meet the second. With one flag per page that
    both processes wrote (0 free, 1 in use), that second store of a release erased the
    worker's next claim, and the pages of a live lease were handed out again (an item
    read as a later one, under CPU load). A repeated flip stores the value it stored
    before. ``mmap.find`` is no reader of bytes that change under it either: it ends with
    a ``memcmp`` whose result comes from a second read of the bytes it saw differ.

    The main process creates the ring (``ShmRing.create``) and owns it: :meth:`handle`
    gives the worker its file descriptor, :meth:`handed_over` closes the main process's
    once the worker is started, ``close()`` unmaps. The worker maps the descriptor it
    received (``ShmRing.attach``).
    """

    def __init__(self, name: str, mapping: mmap.mmap, pages: int, fd: int | None = None):
        self.name = name  # a label (the descriptor is the ring's only handle)
        self._map = mapping
        self.pages = pages
        self._data = -(-pages // PAGE) * PAGE  # the flags fill whole pages, then the data
        self._fd = fd  # the owner's, until the worker has its own copy
        self._view = memoryview(mapping)
        # Live leases by id of their weak reference: (the reference, first page, pages).
        self._leases: dict[int, tuple[weakref.ref[np.ndarray], int, int]] = {}
        self._claims: _Claims | None = None  # the worker's side, made at its first write

    @property
    def capacity(self) -> int:
        return self.pages * PAGE

    @staticmethod
    def _size(pages: int) -> int:
        return -(-pages // PAGE) * PAGE + pages * PAGE

    @classmethod
    def create(cls, capacity: int, tag: str) -> ShmRing:
        pages = max(1, capacity // PAGE)
        name = f"{SHM_PREFIX}{os.getpid()}-{tag}-{secrets.token_hex(4)}"
        fd = _anonymous_shared_file(name)
        try:
            os.ftruncate(fd, cls._size(pages))  # zero-filled: every page starts free
            mapping = mmap.mmap(fd, cls._size(pages))
            # Forked children (other loaders' workers) must not keep this memory alive.
            if hasattr(mmap, "MADV_DONTFORK"):
                mapping.madvise(mmap.MADV_DONTFORK)
        except BaseException:
            os.close(fd)
            raise
        return cls(name, mapping, pages, fd)

    @classmethod
    def attach(cls, fd: int) -> ShmRing:
        """Map the ring whose descriptor a worker received (and close the descriptor)."""
        try:
            size = os.fstat(fd).st_size
            mapping = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        pages = size // (PAGE + 1)
        while cls._size(pages) > size:
            pages -= 1
        return cls(f"fd {fd}", mapping, pages)

    def handle(self) -> RingHandle:
        """The descriptor to start a worker with (owner only, before :meth:`handed_over`)."""
        if self._fd is None:
            raise RuntimeError(f"ring {self.name} was already handed over")
        return RingHandle(self._fd)

    def handed_over(self) -> None:
        """The worker is started with its own copy of the descriptor: close ours."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    # --- producer (worker) ---------------------------------------------------------------

    def write(self, data: memoryview) -> tuple[int, int] | None:
        """Copy ``data`` into free pages; ``(first page, length)`` or None when no run of
        free pages is long enough (then the caller sends it through the pipe)."""
        length = data.nbytes
        count = max(1, -(-length // PAGE))
        if count > self.pages:
            return None
        if self._claims is None:
            self._claims = _Claims(self._map, self.pages)
        found = self._claims.claim(count)
        if found < 0:
            return None
        start = self._data + found * PAGE
        self._view[start : start + length] = data.cast("B")
        return found, length

    # --- consumer (main) -----------------------------------------------------------------

    def lease(self, page: int, length: int) -> np.ndarray:
        """The buffer at ``page`` as a writable uint8 array that owns its pages until it
        (and every view of it) is garbage-collected."""
        array = np.frombuffer(self._map, dtype=np.uint8, count=length, offset=self._data + page * PAGE)
        # A plain weak reference with a callback: a third of what weakref.finalize costs,
        # on every large item the main process receives.
        reference = weakref.ref(array, self._lease_ended)
        self._leases[id(reference)] = (reference, page, max(1, -(-length // PAGE)))
        return array

    def _lease_ended(self, reference: weakref.ref[np.ndarray]) -> None:
        """The user's last reference to a leased buffer went: its pages are free for the
        worker again (their release bytes flip; only this process writes them)."""
        _, page, count = self._leases.pop(id(reference))
        if not self._map.closed:
            self._map[page : page + count] = self._map[page : page + count].translate(_FLIP)

    # --- ownership -----------------------------------------------------------------------

    def close(self) -> None:
        """Unmap; while the user still holds leased arrays the mapping stays until the last
        of them is collected (the memory goes with it)."""
        self.handed_over()
        self._claims = None  # its view of the release bytes exports the mapping
        self._view.release()
        with contextlib.suppress(BufferError):  # leases still exported: the GC unmaps later
            self._map.close()


class _Claims:
    """A worker's side of its ring: a claim byte per page, private to the worker, and the
    first-fit search for a run of free pages (claim byte equal to the release byte)."""

    def __init__(self, mapping: mmap.mmap, pages: int):
        self.pages = pages
        self._claims = bytearray(pages)
        self._free = bytearray(pages)  # a snapshot: 0 where a page was free at the last look
        self._arrays = (np.frombuffer(self._claims, dtype=np.uint8), np.frombuffer(self._free, dtype=np.uint8))
        self._released = np.frombuffer(mapping, dtype=np.uint8, count=pages)  # the shared bytes
        self._first_look = self._look(min(pages, _FIRST_LOOK_PAGES))

    def _look(self, end: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self._arrays[0][:end], self._released[:end], self._arrays[1][:end]

    def claim(self, count: int) -> int:
        """Claim the first run of ``count`` free pages; its first page, or -1 if none.

        First fit: reusing the lowest free pages keeps the touched (already faulted-in)
        part of the ring as small as the data in flight, so the first look covers only
        the low pages. Each look reads the release bytes once into the private snapshot;
        pages the main process releases meanwhile are seen at the next look.
        """
        mine, released, snapshot = self._first_look
        wanted = bytes(count)
        while True:
            np.bitwise_xor(mine, released, out=snapshot)
            found = self._free.find(wanted, 0, len(mine))
            if found >= 0:
                break
            if len(mine) == self.pages:
                return -1
            mine, released, snapshot = self._look(min(self.pages, 4 * len(mine)))
        self._claims[found : found + count] = self._claims[found : found + count].translate(_FLIP)
        return found


def _anonymous_shared_file(name: str) -> int:
    """A descriptor of shared memory that no path names (``name`` is only a label)."""
    if hasattr(os, "memfd_create"):
        return os.memfd_create(name)
    path = os.path.join(SHM_DIR, name)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.unlink(path)  # named for an instant, in this call: nothing can be left behind
    return fd


class RingHandle:
    """A ring's descriptor on its way to a worker: inherited as is under ``fork``, passed
    along with the process's arguments under ``spawn`` and ``forkserver``."""

    __slots__ = ("fd",)

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild_handle, (reduction.DupFd(self.fd),)


def _rebuild_handle(duplicate: Any) -> RingHandle:
    return RingHandle(duplicate.detach())


class _BytesOutOfBand:
    """Marks a large ``bytes`` object so the pickler sends it out of band."""

    __slots__ = ("data",)

    def __init__(self, data: bytes):
        self.data = data


def _rebuild_bytes(buffer: Any) -> bytes:
    return bytes(buffer)


def _raw_bytes(buffer: Any) -> np.ndarray:
    """A buffer as a uint8 array: a ring lease already is one; pipe bytes are viewed."""
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
        or tensor.nbytes < OUT_OF_BAND_MIN_BYTES
    ):
        return NotImplemented
    dtype = tensor.dtype
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


class Encoder:
    """Worker side: turns an object into ``(pickle bytes, buffer descriptors)``.

    A descriptor is ``(first page, length)`` for a buffer in the ring, or the raw bytes
    of a buffer that could not go there. One pickler serves every chunk (its memo cleared
    each time): building a pickler costs more than pickling a chunk of a few large items.
    """

    def __init__(self, ring: ShmRing | None):
        self._ring = ring
        self._stream = io.BytesIO()
        self._buffers: list[pickle.PickleBuffer] = []
        self._pickler = _Pickler(self._stream, protocol=5, buffer_callback=self._out_of_band)

    def encode(self, obj: Any) -> tuple[bytes, list[Any]]:
        """Encode ``obj``; large ``bytes`` in it must already be wrapped by :func:`prepare_item`."""
        stream, buffers = self._stream, self._buffers
        try:
            self._pickler.dump(obj)
            payload = stream.getvalue()
            descriptors: list[Any] = []
            for buffer in buffers:
                raw = buffer.raw()
                placed = self._ring.write(raw) if self._ring is not None else None
                descriptors.append(placed if placed is not None else bytes(raw))
        finally:
            # Nothing of this chunk may stay referenced (its arrays, in the memo or here).
            self._pickler.clear_memo()
            buffers.clear()
            stream.seek(0)
            stream.truncate()
        return payload, descriptors

    def _out_of_band(self, buffer: pickle.PickleBuffer) -> bool:
        if buffer.raw().nbytes < OUT_OF_BAND_MIN_BYTES:
            return True  # true: keep it in band
        self._buffers.append(buffer)
        return False


class Decoder:
    """Main side: the inverse of :class:`Encoder`; ring buffers arrive as leases."""

    def __init__(self, ring: ShmRing | None):
        self._ring = ring

    def decode(self, payload: bytes, descriptors: list[Any]) -> Any:
        buffers = [
            bytearray(d) if isinstance(d, bytes) else self._ring.lease(*d)  # type: ignore[union-attr]
            for d in descriptors
        ]
        return pickle.loads(payload, buffers=buffers)
