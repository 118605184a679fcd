"""A worker's shared-memory page ring: anonymous, reserved before use, leased page by page.

Each worker has one ring, created by the main process (its owner) as an anonymous shared
file (:mod:`conveyor.workers.transport.shared_files`: ``memfd_create``, or a ``/dev/shm`` file that
no name outlives) and handed to the worker as a file descriptor, so no name exists that a
killed process could leave behind. Its memory is reserved (``posix_fallocate``) before any page
of it is written: a ring the system cannot back fails at creation with
:class:`~conveyor.errors.SharedMemoryError`, never later with ``SIGBUS`` in the middle of
a write. Creation reserves the first :data:`RESERVED_AT_CREATION` bytes (reserving all of
a 64 MiB ring took ~22 ms, before the first item); the worker reserves more, doubling,
before it first writes past them, and a refused extension only keeps the ring at the
size it has (buffers that miss it travel another way). The worker copies each large buffer
into free pages and sends their offset; the main process gives the user an array that
*leases* those pages: the memory is the user's (writable, unchanged by later items, valid
after ``shutdown()``) for as long as anything refers to it. When the last reference goes,
the lease ends and the pages return to the worker, whatever the order.

How large each ring is, and what happens when none can be had, is
:mod:`conveyor.workers.transport.shared_memory`'s business; how buffers reach it,
:mod:`conveyor.workers.transport.codec`'s.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import weakref
from typing import Any

import numpy as np

from conveyor.errors import SharedMemoryError
from conveyor.workers.transport.shared_files import (
    SHM_PREFIX,
    Fallocate,
    FdHandle,
    anonymous_shared_file,
    describe_os_error,
    map_file,
    reserve,
)

PAGE = 4096  # the ring's allocation unit
#: Pages the worker's first look for free pages covers (the bytes in flight fit in them).
_FIRST_LOOK_PAGES = 1024
#: Flips a claim byte (``bytes.translate`` table): a page is free while its claim and
#: release bytes agree.
_FLIP = bytes(value ^ 1 for value in range(256))
#: Bytes of pages a ring has reserved when created (more are reserved as the worker needs
#: them). Creation runs before the first item: reserving 4 MiB took 1.0-1.9 ms here, 1 MiB
#: 0.2-0.3 ms (first item with 2 workers, median of 12: 14.4 -> 13.2 ms).
RESERVED_AT_CREATION = 1024 * 1024


def pages_of(length: int) -> int:
    """Pages a buffer of ``length`` bytes takes in a ring (at least one)."""
    return max(1, -(-length // PAGE))


class ShmRing:
    """Pages of shared memory that a worker fills and the main process leases to the user.

    Layout: one *release* byte per page, then the pages. A page is free when the worker's
    own claim byte for it (private to the worker) equals its release byte. The worker
    claims a run of free pages (first fit) by flipping their claim bytes; the main process
    releases a buffer's pages by flipping their release bytes when the user's last
    reference to it goes, in any order: an array the user keeps pins its own pages only.

    No byte of shared memory has two writers, and the worker never searches the shared
    bytes in place. A store can land twice: ``memcpy``/``memset`` write a small range as
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
    received (``ShmRing.attach``) and keeps it to reserve more pages as it needs them:
    it only writes pages below ``reserved``, and the main process only reads pages the
    worker wrote.
    """

    def __init__(
        self,
        name: str,
        mapping: mmap.mmap | np.ndarray,
        pages: int,
        fd: int | None = None,
        grow: tuple[int, Fallocate | None] | None = None,
    ):
        self.name = name  # a label (the descriptor is the ring's only handle)
        # The worker's side is an mmap (its find() looks for free pages); the owner's an
        # array from map_file, which holds no descriptor while leases outlive the pool.
        self._map: Any = mapping
        self.pages = pages
        self._data = -(-pages // PAGE) * PAGE  # the flags fill whole pages, then the data
        self._fd = fd  # the owner's, until the worker has its own copy
        # The worker's: its descriptor and reserving function, to reserve more pages.
        self._grow_fd: int | None
        self._fallocate: Fallocate | None
        self._grow_fd, self._fallocate = grow if grow is not None else (None, None)
        self._can_grow = grow is not None
        self.reserved = min(pages, RESERVED_AT_CREATION // PAGE)  # pages backed by memory
        self._view = memoryview(mapping)  # type: ignore[arg-type]  # the worker's, to write through (see below)
        # Leases are arrays over a memoryview, never over the array itself: numpy would make
        # the array the base of the user's views (it skips arrays that own no data), so a
        # lease's weak reference would fire while views of it are still in use.
        # (numpy's stubs give arrays the buffer protocol only from Python 3.12 on.)
        self._lease_source: memoryview | None = memoryview(mapping)  # type: ignore[arg-type]
        # Live leases by id of their weak reference: (the reference, first page, pages).
        self._leases: dict[int, tuple[weakref.ref[np.ndarray], int, int]] = {}
        self._claims: _Claims | None = None  # the worker's side, made at its first write
        self._address: int | None = None  # where the worker's mapping starts (see page_of)

    @property
    def capacity(self) -> int:
        return self.pages * PAGE

    @staticmethod
    def size_of(pages: int) -> int:
        """Bytes of shared memory a ring of ``pages`` pages takes (flags included)."""
        return -(-pages // PAGE) * PAGE + pages * PAGE

    @classmethod
    def create(cls, capacity: int, tag: str, fallocate: Fallocate | None = None) -> ShmRing:
        """A ring of ``capacity`` bytes of pages, its memory reserved; raises
        :class:`SharedMemoryError` when the system cannot back it."""
        pages = max(1, capacity // PAGE)
        name = f"{SHM_PREFIX}ring-{tag}"
        try:
            fd = anonymous_shared_file(name)
        except OSError as error:
            raised = SharedMemoryError(f"a ring's shared file could not be made ({describe_os_error(error)})")
            raised.errno = error.errno
            raise raised from error
        try:
            os.ftruncate(fd, cls.size_of(pages))  # zero-filled: every page starts free
            flags = cls.size_of(pages) - pages * PAGE
            reserve(fd, flags + min(pages, RESERVED_AT_CREATION // PAGE) * PAGE, fallocate)  # and the first pages
            mapping = map_file(fd, cls.size_of(pages))  # not inherited by forks (other loaders' workers)
        except BaseException:
            os.close(fd)
            raise
        return cls(name, mapping, pages, fd)

    @classmethod
    def attach(cls, fd: int, fallocate: Fallocate | None = None) -> ShmRing:
        """Map the ring whose descriptor a worker received; the ring keeps the descriptor
        (to reserve more pages with ``fallocate``) until ``close()``."""
        try:
            size = os.fstat(fd).st_size
            mapping = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        pages = size // (PAGE + 1)
        while cls.size_of(pages) > size:
            pages -= 1
        return cls(f"fd {fd}", mapping, pages, grow=(fd, fallocate))

    def handle(self) -> FdHandle:
        """The descriptor to start a worker with (owner only, before :meth:`handed_over`)."""
        if self._fd is None:
            raise RuntimeError(f"ring {self.name} was already handed over")
        return FdHandle(self._fd)

    def handed_over(self) -> None:
        """The worker is started with its own copy of the descriptor: close ours."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    # --- producer (worker) ---------------------------------------------------------------

    def write(self, data: memoryview) -> tuple[int, int] | None:
        """Copy ``data`` into free pages; ``(first page, length)`` or None when no run of
        free pages is long enough (then the caller sends it another way)."""
        length = data.nbytes
        found = self.claim(length)
        if found is None:
            return None
        start = self._data + found * PAGE
        self._view[start : start + length] = data.cast("B")
        return found, length

    def claim(self, length: int) -> int | None:
        """Claim free pages for ``length`` bytes: the first page, or None when no run of
        free pages is long enough. The pages are the worker's until it sends them (or
        :meth:`unclaim` gives them back)."""
        count = pages_of(length)
        if count > self.pages:
            return None
        if self._claims is None:
            self._claims = _Claims(self._map, self.pages)
        # First fit: reusing the lowest free pages keeps the touched (already cached)
        # part of the ring as small as the data in flight, and so its reserved part.
        found = self._claims.claim(count, 0, self.reserved)
        if found < 0 and self.reserved < self.pages and self._can_grow:
            found = self._grow(count)
        return None if found < 0 else found

    def claimed_array(self, page: int, length: int) -> np.ndarray:
        """The worker's writable uint8 array over ``length`` bytes of pages it claimed from
        ``page``: what it makes there travels without a copy. An array over a memoryview,
        as a lease is, so that views of it keep it (and not only the mapping) alive."""
        start = self._data + page * PAGE
        return np.frombuffer(self._view[start : start + length], dtype=np.uint8)

    def page_of(self, address: int) -> int | None:
        """The page that starts at memory ``address`` in the worker's mapping, or None
        when no page of this ring starts there."""
        offset = address - self._base_address() - self._data
        if offset < 0 or offset % PAGE or offset >= self.pages * PAGE:
            return None
        return offset // PAGE

    def _base_address(self) -> int:
        if self._address is None:
            self._address = int(np.frombuffer(self._view, dtype=np.uint8, count=1).ctypes.data)
        return self._address

    def unclaim(self, page: int, length: int) -> None:
        """Give back pages :meth:`write` or :meth:`claim` claimed for a buffer that will not
        be sent (the main process never leases them, so only the worker can free them)."""
        assert self._claims is not None
        self._claims.flip(page, pages_of(length))

    def _grow(self, count: int) -> int:
        """Reserve more pages (at least twice as many, and enough for ``count``); the first
        free run of ``count`` pages then, or -1 when the system refused them (the ring
        then stays as large as it is)."""
        old = self.reserved
        new = min(self.pages, max(2 * old, old + count))
        try:
            reserve(self._grow_fd, (new - old) * PAGE, self._fallocate, offset=self._data + old * PAGE)  # type: ignore[arg-type]
        except SharedMemoryError:
            self._can_grow = False  # no second try: memory is short
            return -1
        self.reserved = new
        assert self._claims is not None
        return self._claims.claim(count, max(0, old - count), new)

    # --- consumer (main) -----------------------------------------------------------------

    def lease(self, page: int, length: int) -> np.ndarray:
        """The buffer at ``page`` as a writable uint8 array that owns its pages until it
        (and every view of it) is garbage-collected."""
        source = self._lease_source
        assert source is not None  # leases are taken before close()
        array = np.frombuffer(source, dtype=np.uint8, count=length, offset=self._data + page * PAGE)
        # A plain weak reference with a callback: a third of what weakref.finalize costs,
        # on every large item the main process receives.
        reference = weakref.ref(array, self._lease_ended)
        self._leases[id(reference)] = (reference, page, pages_of(length))
        return array

    def _lease_ended(self, reference: weakref.ref[np.ndarray]) -> None:
        """The user's last reference to a leased buffer went: its pages are free for the
        worker again."""
        _, page, count = self._leases.pop(id(reference))
        if self._map is not None:
            self._map[page : page + count] ^= 1  # only this process writes release bytes

    # --- ownership -----------------------------------------------------------------------

    def close(self) -> None:
        """Unmap; while the user still holds leased arrays the mapping stays until the last
        of them is collected (the memory goes with it)."""
        self.handed_over()
        self._claims = None  # its view of the release bytes exports the mapping
        self._view.release()
        grow_fd, self._grow_fd = self._grow_fd, None
        if grow_fd is not None:
            os.close(grow_fd)
        mapping, self._map, self._lease_source = self._map, None, None
        if isinstance(mapping, mmap.mmap):
            with contextlib.suppress(BufferError):  # leases still exported: the GC unmaps later
                mapping.close()
        # The owner's array unmaps itself once nothing refers to it: leases hold it through
        # their memoryview, and this ring no longer does.


class _Claims:
    """A worker's side of its ring: a claim byte per page, private to the worker, and the
    first-fit search for a run of free pages (claim byte equal to the release byte)."""

    def __init__(self, mapping: Any, pages: int):
        self._claims = bytearray(pages)
        self._free = bytearray(pages)  # a snapshot: 0 where a page was free at the last look
        self._mine = np.frombuffer(self._claims, dtype=np.uint8)
        self._snapshot = np.frombuffer(self._free, dtype=np.uint8)
        self._released = np.frombuffer(mapping, dtype=np.uint8, count=pages)  # the shared bytes

    def claim(self, count: int, start: int, end: int) -> int:
        """Claim the first run of ``count`` free pages in ``[start, end)``; its first page,
        or -1 if none. The release bytes are read once, into the private snapshot; pages the
        main process releases meanwhile are seen at the next claim. The first look covers
        only the low pages (first fit keeps the data in flight there)."""
        wanted = bytes(count)
        look = min(end, start + max(_FIRST_LOOK_PAGES, count))
        while True:
            np.bitwise_xor(self._mine[start:look], self._released[start:look], out=self._snapshot[start:look])
            found = self._free.find(wanted, start, look)
            if found >= 0:
                break
            if look >= end:
                return -1
            look = min(end, 4 * look)
        self.flip(found, count)
        return found

    def flip(self, page: int, count: int) -> None:
        """Flip the claim bytes of ``count`` pages from ``page``: a claim, or, for pages
        claimed and never sent, its undoing (free again)."""
        self._claims[page : page + count] = self._claims[page : page + count].translate(_FLIP)
