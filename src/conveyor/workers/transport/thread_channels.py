"""A thread worker's channels to the main thread, in place of a worker process's pipes.

Messages cross as Python objects, never pickled: a queue under a lock each way, and a
*wake pipe* beside each queue that holds one byte exactly while the queue holds something,
so that both sides wait in ``poll`` as they do for a worker process (the main thread's
wait on the pool covers thread workers and worker processes alike, and a thread worker
waits for requests and credits at once). Each end of each pipe belongs to one side, which
alone closes it: a number the other side closed and the system reused is never touched.
The ends are signalled by flags and bytes, not by a pipe's hang-up, which a process forked
meanwhile (holding copies of the descriptors) would hide.

* :class:`RequestQueue`: the main thread's requests (epoch starts, dispatched items);
  :meth:`~RequestQueue.close` is the worker's cue to exit.
* :class:`ResponseQueue`: the worker's messages; once the main thread closed its end, a
  send raises ``BrokenPipeError`` and the worker ends, as a worker process does.
* :class:`HandOff`: the worker's encoder: a chunk's items go by reference, its states as a
  snapshot (the worker's pass goes on changing; the main thread keeps them).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import deque
from typing import Any

from conveyor.workers.transport.buffers import prepare_item
from conveyor.workers.transport.protocol import Chunk
from conveyor.workers.transport.shared_memory import RING_BYTES

_WAKE = b"\0"


def _close(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


class RequestQueue:
    """Main thread to worker. The main thread owns the wake pipe's write end, the worker
    its read end (:attr:`fd`, which it polls)."""

    def __init__(self) -> None:
        self.fd, self._wake = os.pipe()
        self._lock = threading.Lock()
        self._messages: deque[Any] = deque()
        self._closed = False

    def put(self, message: Any) -> None:
        """Main thread: queue ``message`` (never blocks: the pipe holds at most one byte)."""
        with self._lock:
            if self._closed:
                return
            self._messages.append(message)
            if len(self._messages) == 1:
                # A worker that ended closed its end (EPIPE): its sentinel tells the pool.
                with contextlib.suppress(OSError):
                    os.write(self._wake, _WAKE)

    def recv(self) -> Any:
        """Worker: the oldest request (call when :attr:`fd` is readable); ``EOFError`` once
        the main thread closed the queue."""
        with self._lock:
            if self._closed:
                raise EOFError("the main thread closed this thread worker's requests")
            message = self._messages.popleft()
            if not self._messages:
                os.read(self.fd, 1)
            return message

    def close(self) -> None:
        """Main thread: drop what was not taken, wake the worker to its end, and close the
        main thread's end. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if not self._messages:
                with contextlib.suppress(OSError):  # (EPIPE: the worker has ended already)
                    os.write(self._wake, _WAKE)  # the byte stays: recv() raises from now on
            self._messages.clear()
            _close(self._wake)

    def close_worker_end(self) -> None:
        """Worker, as it ends."""
        _close(self.fd)


class ResponseQueue:
    """Worker to main thread. The worker owns the wake pipe's write end, the main thread
    its read end (:attr:`fd`, which the pool polls as a worker process's response pipe)."""

    def __init__(self) -> None:
        self.fd, self._wake = os.pipe()
        self._lock = threading.Lock()
        self._messages: deque[Any] = deque()
        self._closed = False

    def send(self, message: Any) -> None:
        """Worker: hand ``message`` over; ``BrokenPipeError`` once the main thread closed
        its end (nobody is left to read it)."""
        with self._lock:
            if self._closed:
                raise BrokenPipeError("the main thread no longer reads this thread worker")
            self._messages.append(message)
            if len(self._messages) == 1:
                os.write(self._wake, _WAKE)

    def read(self) -> list[Any]:
        """Main thread: every message sent so far (call when :attr:`fd` is readable)."""
        with self._lock:
            if not self._messages:
                return []
            os.read(self.fd, 1)
            messages = list(self._messages)
            self._messages.clear()
            return messages

    def close(self) -> None:
        """Main thread: stop reading; what was sent and not read is dropped. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._messages.clear()
            _close(self.fd)

    def close_worker_end(self) -> None:
        """Worker, as it ends."""
        with self._lock:
            _close(self._wake)


class HandOff:
    """A thread worker's encoder: the interface of :class:`~conveyor.workers.transport.codec.Encoder`
    without the encoding. A :class:`~conveyor.workers.transport.protocol.Chunk` reaches
    the main thread as the worker made it, as a worker process's decoded frame: each
    item is the object the pipeline made (no copy, no pickling: items need not pickle),
    and the states are pickled when the chunk is sent, a snapshot, as a worker process
    pickles them then."""

    #: Not a ring: the bytes of large buffers a worker process's ring holds by default,
    #: which bound as much here: a worker that makes them slowly may have half of it in
    #: flight (see :data:`~conveyor.workers.child.state_machine.SLOW_BYTES_PER_S`). At the floor
    #: (4 MiB), a worker whose batches an in-order merge hands out after the other
    #: worker's whole shard would wait for that shard with two batches made.
    ring_capacity = RING_BYTES

    @staticmethod
    def prepare(item: Any) -> tuple[Any, int]:
        """``(item, bytes of large buffers it holds)``: the item itself, counted as a worker
        process counts what it would send out of band (which bounds how much a worker
        makes ahead of the merge)."""
        return item, prepare_item(item)[1]

    def encode_chunk(self, chunk: Chunk) -> tuple[Chunk, int]:
        """``(the chunk to hand over, bytes of large buffers in it)``."""
        size = 0
        for item in chunk.items:
            size += prepare_item(item)[1]
        snapshot = chunk.states.snapshot()
        return Chunk(chunk.worker_id, chunk.generation, chunk.sequence, chunk.items, chunk.positions, snapshot), size

    def discard(self) -> None:
        """Nothing was placed anywhere for a chunk that will not be sent."""

    def idle(self) -> None:
        """Nothing is kept for reuse."""

    def close(self) -> None:
        """Nothing to release."""
