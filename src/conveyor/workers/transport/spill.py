"""Buffers that miss the ring: each travels in a shared-memory file of its own.

A buffer larger than its worker's ring, or met while the ring is full of leases the user
still holds, is *spilled*: the worker creates an anonymous shared file for it
(``memfd_create``), reserves its memory (``posix_fallocate``: a refusal is an error here,
never a ``SIGBUS`` later), writes the buffer into it (its one copy) and passes the
descriptor to the main process, which maps the file and hands it to the user as an array
(no further copy). The mapping is the user's: writable, valid after ``shutdown()``, and
unmapped when the last reference to it goes (the file then freed, or given back to its
worker: see *Reuse* below).

Descriptors travel on a channel of their own per worker: a unix socket pair
(``SOCK_SEQPACKET``), one message per spilled buffer carrying its sequence number and the
descriptor (``SCM_RIGHTS``). The worker sends it *before* the chunk that refers to it
goes down the response pipe, so when the main process decodes the chunk the descriptor
is already queued; the response pipe and its framing stay as they are. The worker closes
its descriptor as soon as it is sent: from then on the kernel holds the file for the
socket's queue, and the main process for its mapping. So nothing outlives its owner:

- a worker killed at any point: its descriptors close with it; those already queued are
  freed when the main process closes its end (at ``shutdown()``, or when the pool is
  collected);
- the main process killed: its end and mappings go with it, the workers die with it;
- an epoch abandoned with chunks in flight: the main process still decodes (and then
  drops) them, or closes the queue;
- a chunk whose encoding failed after some of its buffers were sent: the main process
  skips queued descriptors older than the one a chunk names.

The files have no name, so nothing can be left in ``/dev/shm`` (where ``memfd_create`` is
missing they are unnamed ``/dev/shm`` files, ``O_TMPFILE``, else unlinked as they are made). Neither end blocks: a full
queue (hundreds of buffers in flight) sends the buffer through the pipe instead.

**Reuse.** Allocating a file's pages and freeing them cost more than the copy itself
(measured: ~120 of ~165 ms for 300 MB, plus ~50 ms to free them in the main process). So
a file of at least :data:`REUSE_MIN_BYTES` goes back to its worker when the user drops
the last reference to its array (a weak reference's callback sends the descriptor back
on the same channel; the main process keeps at most :data:`HELD_FILES` such descriptors
per worker, and closes them all at ``shutdown()``); the worker keeps at most
:data:`IDLE_FILES` returned files, writes the next buffer of about that size into one
(no allocation), and closes them all once it has been idle for a second
(:meth:`SpillSender.idle`). A file goes back only after the last array over it is gone,
so no array the user holds ever changes.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import weakref
from typing import NamedTuple

import numpy as np

from conveyor.errors import SharedMemoryError, WorkerError
from conveyor.workers.transport.shared_files import (
    Fallocate,
    anonymous_shared_file,
    describe_os_error,
    format_bytes,
    map_file,
    reserve,
)

#: A spill message's data: the buffer's sequence number in its worker (0 for a file given back).
RECORD = struct.Struct("<Q")
#: Files at least this large go back to their worker for reuse when the user drops them.
REUSE_MIN_BYTES = 1024 * 1024
#: Descriptors of live arrays' files the main process keeps per worker, to give them back.
HELD_FILES = 8
#: Returned files a worker keeps for its next buffers.
IDLE_FILES = 2


class Spilled(NamedTuple):
    """A chunk's descriptor of a spilled buffer: its number on the channel and its length."""

    seq: int
    length: int


def spill_channel() -> tuple[socket.socket, socket.socket] | None:
    """``(main end, worker end)`` of a new channel, or None where descriptors cannot
    travel on unix sockets (then spilled buffers take the pipe)."""
    if not hasattr(socket, "AF_UNIX") or not hasattr(socket, "send_fds"):
        return None
    kind = getattr(socket, "SOCK_SEQPACKET", socket.SOCK_DGRAM)  # both keep message bounds
    main, worker = socket.socketpair(socket.AF_UNIX, kind)
    main.setblocking(False)
    return main, worker


class SpillSender:
    """Worker side: puts a buffer in a file of its own and sends the file's descriptor.

    ``channel`` is the worker's end (made non-blocking here); ``fallocate`` the reserving
    function (injected by tests).
    """

    def __init__(self, channel: socket.socket, fallocate: Fallocate | None = None):
        channel.setblocking(False)
        self._channel = channel
        self._fallocate = fallocate
        self._seq = 0
        self._idle: list[tuple[int, int]] = []  # (descriptor, size) of returned files, oldest first

    def send(self, data: memoryview) -> Spilled | str:
        """Spill ``data`` (a flat byte view); its :class:`Spilled` descriptor, or why it
        could not be spilled (the caller then sends it through the pipe)."""
        length = data.nbytes
        fd = self._reusable(length)
        try:
            if fd is None:
                fd = anonymous_shared_file("conveyor-spill")
                reserve(fd, length, self._fallocate)
            _write_all(fd, data)
            seq = self._seq + 1
            socket.send_fds(self._channel, [RECORD.pack(seq)], [fd])
        except SharedMemoryError as error:
            return f"a {format_bytes(length)} buffer's own file: {error}"
        except BlockingIOError:
            return "the worker's descriptor channel is full (hundreds of buffers in flight)"
        except OSError as error:
            return f"a {format_bytes(length)} buffer's own file could not be made ({describe_os_error(error)})"
        finally:
            if fd is not None:
                os.close(fd)  # sent: the queue holds the file now; not sent: it is freed
        self._seq = seq
        return Spilled(seq, length)

    def _reusable(self, length: int) -> int | None:
        """A returned file that fits ``length`` bytes without wasting over half of it."""
        self._take_returned()
        for index, (fd, size) in enumerate(self._idle):
            if length <= size <= length + length // 2:
                del self._idle[index]
                return fd
        return None

    def _take_returned(self) -> None:
        """Collect the files the main process gave back; keep the newest few."""
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(self._channel, RECORD.size, 4)
            except (BlockingIOError, ConnectionError):
                break  # nothing more (or the main process is gone)
            for fd in fds:
                self._idle.append((fd, os.fstat(fd).st_size))
            if not data and not fds:
                break  # the main process closed its end
        while len(self._idle) > IDLE_FILES:
            os.close(self._idle.pop(0)[0])

    def idle(self) -> None:
        """The worker has nothing to do: free the returned files (queued ones included)."""
        self._take_returned()
        for fd, _ in self._idle:
            os.close(fd)
        self._idle.clear()

    def close(self) -> None:
        self.idle()
        self._channel.close()


def _write_all(fd: int, data: memoryview) -> None:
    """Write ``data`` at the start of ``fd`` (a write moves at most ~2 GiB)."""
    view = data.cast("B") if data.format != "B" or data.ndim != 1 else data
    offset, end = 0, view.nbytes
    while offset < end:
        offset += os.pwrite(fd, view[offset:], offset)


class SpillReceiver:
    """Main side: takes spilled buffers' descriptors off the channel, in order, maps them
    as the user's arrays, and gives large files back when the user drops them."""

    def __init__(self, channel: socket.socket, worker_id: int):
        self._channel = channel
        self._worker_id = worker_id
        # Files to give back, by id of the weak reference to their array: (reference, descriptor).
        self._held: dict[int, tuple[weakref.ref[np.ndarray], int]] = {}
        self._closed = False

    def take(self, spilled: Spilled) -> np.ndarray:
        """The spilled buffer as a writable uint8 array that owns its memory; older
        descriptors still queued (from a chunk that failed to encode) are closed."""
        while True:
            seq, fd = self._next()
            if seq == spilled.seq:
                break
            os.close(fd)
            if seq > spilled.seq:
                raise WorkerError(
                    f"worker {self._worker_id}'s spilled buffer {spilled.seq} is missing (buffer {seq} came instead)"
                )
        try:
            array = map_file(fd, spilled.length)
        except BaseException:
            os.close(fd)
            raise
        if spilled.length >= REUSE_MIN_BYTES and len(self._held) < HELD_FILES and not self._closed:
            # A plain weak reference with a callback, as for ring leases (views of the
            # array keep it alive: numpy makes it their base).
            reference = weakref.ref(array, self._give_back)
            self._held[id(reference)] = (reference, fd)
        else:
            os.close(fd)  # the mapping keeps the file; it is freed with the array
        return array

    def _give_back(self, reference: weakref.ref[np.ndarray]) -> None:
        """The user dropped the last reference to a spilled array: its file goes back to
        its worker (or, when that cannot be, is freed)."""
        entry = self._held.pop(id(reference), None)
        if entry is None:
            return  # closed meanwhile: the descriptor is closed already
        fd = entry[1]
        try:
            # Non-blocking: a full queue or a worker gone just frees the file.
            with contextlib.suppress(OSError):
                socket.send_fds(self._channel, [RECORD.pack(0)], [fd])
        finally:
            os.close(fd)

    def _next(self) -> tuple[int, int]:
        """``(sequence number, descriptor)`` of the next message on the channel."""
        try:
            data, fds, flags, _ = socket.recv_fds(self._channel, RECORD.size, 1)
        except BlockingIOError:
            data, fds, flags = b"", [], 0
        if len(data) != RECORD.size or len(fds) != 1 or flags & getattr(socket, "MSG_CTRUNC", 0):
            for fd in fds:
                os.close(fd)
            raise WorkerError(
                f"worker {self._worker_id} sent a chunk whose spilled buffer did not arrive "
                f"({len(data)} bytes, {len(fds)} descriptors, flags {flags:#x})"
            )
        return RECORD.unpack(data)[0], fds[0]

    def close(self) -> None:
        """Close the main end and the descriptors held to give back (queued descriptors
        are freed with the end; arrays the user holds stay valid: mappings need no
        descriptor)."""
        self._closed = True
        held, self._held = self._held, {}
        for _, fd in held.values():
            os.close(fd)
        self._channel.close()
