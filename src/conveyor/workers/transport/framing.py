"""Length-prefixed frames on a worker's response pipe.

The worker writes each message whole (length and body in one ``writev``; the body's
layout is :mod:`conveyor.workers.transport.frame`'s); the main
process reads whatever the pipe holds in one ``read`` and takes every complete frame in
it, so a wake-up that finds several messages (a chunk and a stage report, two chunks)
costs one system call, not two per message as ``Connection.recv_bytes`` does.
"""

from __future__ import annotations

import os
import struct
from typing import Any

#: A frame's header: the body's length in bytes.
HEADER = struct.Struct("<Q")
#: Bytes asked of the pipe per read: its whole default capacity.
READ_SIZE = 64 * 1024
#: The most parts one ``writev`` is given (the system's limit is 1024 at least).
_MAX_VECTORS = 1024


def write_frame(fd: int, *parts: Any) -> None:
    """Write the concatenation of ``parts`` (bytes-like) as one frame to the blocking
    pipe ``fd``, in one ``writev`` where the system takes them all at once."""
    length = sum(map(len, parts))  # bytes, bytearrays and flat byte views: len() counts bytes
    vectors = (HEADER.pack(length), *parts)
    if len(vectors) > _MAX_VECTORS:
        vectors = (b"".join(vectors),)  # a chunk of very many buffers that travel in the pipe
    written = os.writev(fd, vectors)
    if written < HEADER.size + length:
        # A frame larger than the pipe holds, interrupted by a signal: write the rest.
        rest = memoryview(b"".join(vectors))[written:]
        while rest:
            rest = rest[os.write(fd, rest) :]


class FrameReader:
    """Splits what one pipe delivers into frame bodies.

    Each :meth:`read` is one system call, made when the pipe is readable, so it never
    blocks; a frame larger than one read brings is kept and completed by the next reads
    (an interrupted read, a Ctrl-C in between, leaves the stream in step).
    """

    def __init__(self, fd: int):
        self._fd = fd
        self._partial = b""  # the start of a frame whose header is incomplete
        self._body: bytearray | None = None  # a frame begun: its body so far ...
        self._filled = 0  # ... and how much of it has arrived

    def read(self) -> list[memoryview]:
        """The frames that this read completes (possibly none); raises EOFError when the
        writer closed the pipe."""
        if self._body is not None:
            return self._continue_body()
        data = os.read(self._fd, READ_SIZE)
        if not data:
            raise EOFError("the worker closed its response pipe")
        if self._partial:
            data, self._partial = self._partial + data, b""
        view = memoryview(data)
        frames: list[memoryview] = []
        start, end = 0, len(data)
        while start < end:
            if end - start < HEADER.size:
                self._partial = bytes(view[start:])
                break
            (length,) = HEADER.unpack_from(view, start)
            start += HEADER.size
            if end - start < length:
                self._body = bytearray(length)
                self._body[: end - start] = view[start:]
                self._filled = end - start
                break
            frames.append(view[start : start + length])
            start += length
        return frames

    def _continue_body(self) -> list[memoryview]:
        assert self._body is not None
        count = os.readv(self._fd, [memoryview(self._body)[self._filled :]])
        if count == 0:
            raise EOFError("the worker closed its response pipe in the middle of a message")
        self._filled += count
        if self._filled < len(self._body):
            return []
        body, self._body = self._body, None
        return [memoryview(body)]
