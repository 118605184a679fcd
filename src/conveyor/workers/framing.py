"""Length-prefixed frames on a worker's response pipe.

The worker writes each message whole (header and body in one ``writev``); the main
process reads whatever the pipe holds in one ``read`` and takes every complete frame in
it, so a wake-up that finds several messages (a chunk and a stage report, two chunks)
costs one system call, not two per message as ``Connection.recv_bytes`` does. A read
never waits for more than the rest of a frame it has begun: the worker is writing it.
"""

from __future__ import annotations

import os
import struct

#: A frame's header: the body's length in bytes.
HEADER = struct.Struct("<Q")
#: Bytes asked of the pipe per read: its whole default capacity.
READ_SIZE = 64 * 1024


def write_frame(fd: int, body: bytes) -> None:
    """Write ``body`` as one frame to the blocking pipe ``fd``."""
    header = HEADER.pack(len(body))
    written = os.writev(fd, (header, body))
    if written < HEADER.size + len(body):
        # A frame larger than the pipe holds, interrupted by a signal: write the rest.
        rest = memoryview(header + body)[written:]
        while rest:
            rest = rest[os.write(fd, rest) :]


class FrameReader:
    """Splits what one pipe delivers into frame bodies."""

    def __init__(self, fd: int):
        self._fd = fd
        self._partial = b""  # the start of a frame whose header is incomplete

    def read(self) -> list[memoryview]:
        """The frames that one read completes (call when the pipe is readable); raises
        EOFError when the writer closed the pipe."""
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
            if end - start >= length:
                frames.append(view[start : start + length])
                start += length
            else:
                frames.append(self._read_rest(view[start:], length))
                break
        return frames

    def _read_rest(self, begun: memoryview, length: int) -> memoryview:
        """The body of a frame of ``length`` bytes of which ``begun`` has arrived."""
        body = bytearray(length)
        body[: len(begun)] = begun
        filled = len(begun)
        target = memoryview(body)
        while filled < length:
            count = os.readv(self._fd, [target[filled:]])
            if count == 0:
                raise EOFError("the worker closed its response pipe in the middle of a message")
            filled += count
        return target
