"""Integrity stress of the shared-memory ring alone: two processes, no loader around it.

A child process plays the worker: it writes numbered buffers into the ring as fast as the
ring takes them, retrying while it is full, so that it claims pages the moment the main
process releases them. The main process leases each buffer, keeps the last few and
releases the oldest one at a time. Every buffer is checked when leased and again just
before its release; a live lease whose pages were handed out again reads as a later
number. This is the race that ``ShmRing``'s single-writer flags close (see its docstring);
before them it showed within seconds. Run it with other processes loading the CPU too.

    python benchmarks/soak_ring.py [--seconds S] [--pages-per-buffer P] [--held H]

Prints the number of buffers and how many read wrong; exits 1 if any did.
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
import time
from collections import deque

from conveyor.workers.transport.ring import PAGE, ShmRing

_RECORD = struct.Struct("<qqq")  # first page, length, sequence number (-1: the end)


def produce(fd: int, out: int, size: int, seconds: float) -> None:
    """The worker's side: numbered buffers into the ring, each announced on ``out``."""
    ring = ShmRing.attach(fd)
    deadline = time.monotonic() + seconds
    buffer = bytearray(size)
    number = 0
    while time.monotonic() < deadline:
        struct.pack_into("<Q", buffer, 0, number)
        struct.pack_into("<Q", buffer, size - 8, number)
        placed = ring.write(memoryview(buffer))
        if placed is not None:
            os.write(out, _RECORD.pack(placed[0], placed[1], number))
            number += 1
    os.write(out, _RECORD.pack(-1, -1, -1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--pages-per-buffer", type=int, default=8)
    parser.add_argument("--held", type=int, default=6, help="leases the main process keeps")
    args = parser.parse_args()
    size = args.pages_per_buffer * PAGE
    ring = ShmRing.create((args.held + 2) * size, "soak")
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(reader)
        try:
            produce(os.dup(ring.handle().fd), writer, size, args.seconds)
        finally:
            os._exit(0)
    os.close(writer)
    ring.handed_over()
    held: deque[tuple[int, object]] = deque()
    pending = b""
    buffers = wrong = 0

    def check(number: int, lease: object, when: str) -> None:
        nonlocal wrong
        seen = struct.unpack_from("<Q", lease, 0)[0], struct.unpack_from("<Q", lease, size - 8)[0]  # type: ignore[call-overload]
        if seen != (number, number):
            wrong += 1
            if wrong <= 5:
                print(f"buffer {number} reads {seen} {when}", flush=True)

    ended = False
    while not ended:
        data = os.read(reader, _RECORD.size * 512)
        if not data:
            break
        pending += data
        whole = len(pending) - len(pending) % _RECORD.size
        records, pending = pending[:whole], pending[whole:]
        for page, length, number in _RECORD.iter_unpack(records):
            if number < 0:
                ended = True
                break
            lease = ring.lease(page, length)
            check(number, lease, "when leased")
            held.append((number, lease))
            buffers += 1
            while len(held) > args.held:
                old_number, old = held.popleft()
                check(old_number, old, "before its release")
                del old  # the lease ends: its pages go back to the worker
            del lease
    os.waitpid(pid, 0)
    held.clear()
    ring.close()
    print(f"{buffers} buffers in {args.seconds:.0f} s, {wrong} read wrong")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
