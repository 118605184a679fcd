"""What the pool waits on: each worker's response descriptor and its sentinel.

One poll object serves the pool's life: each worker's response descriptor and sentinel
(a process's, or a thread worker's end-of-thread pipe) are registered once, not on every
wait. A second poll object holds the sentinels alone, for a look at deaths that does not
wait. A worker whose responses the merge does not need yet is not listened to (its
messages wait in its pipe), but its sentinel always is: a death always shows. A
:class:`WakePipe` lets another thread end a wait (the consumer leaving while a read-ahead
thread waits on the workers).
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import threading
from collections.abc import Callable, Iterable
from typing import Any

from conveyor.core.stage_marks import waits_for_upstream


class WorkerDescriptors:
    """The workers' descriptors, by worker id, and the waiting on them."""

    def __init__(self) -> None:
        self._poller = select.poll()
        self._deaths = select.poll()  # sentinels alone
        self._responding: dict[int, int] = {}  # response fd -> worker
        self._sentinels: dict[int, int] = {}  # sentinel fd -> worker
        self._listening: set[int] = set()  # response fds polled for input now

    def add(self, worker_id: int, worker: Any) -> None:
        """Wait on ``worker``'s responses and sentinel from now on."""
        self._responding[worker.response_fd] = worker_id
        self._sentinels[worker.sentinel] = worker_id
        self._poller.register(worker.response_fd, select.POLLIN)
        self._listening.add(worker.response_fd)
        self._poller.register(worker.sentinel, select.POLLIN)
        self._deaths.register(worker.sentinel, select.POLLIN)

    def remove(self, worker: Any) -> None:
        """Stop waiting on ``worker`` (a dead one being replaced)."""
        for fd in (worker.response_fd, worker.sentinel):
            self._poller.unregister(fd)
        self._deaths.unregister(worker.sentinel)
        self._responding.pop(worker.response_fd, None)
        self._sentinels.pop(worker.sentinel, None)
        self._listening.discard(worker.response_fd)

    def listen_to(self, wanted: Callable[[int], bool]) -> None:
        """Listen for the responses of the workers ``wanted(worker_id)`` names only."""
        listening = self._listening
        for fd, worker_id in self._responding.items():
            wants = wanted(worker_id)
            if wants != (fd in listening):
                if wants:
                    listening.add(fd)
                else:
                    listening.discard(fd)
                self._poller.modify(fd, select.POLLIN if wants else 0)

    def wait(self, limit: float | None, readable: Iterable[int] = (), writable: Iterable[int] = ()) -> set[int]:
        """The descriptors with an event (any event counts: a closed pipe or an exited
        process shows as ``POLLHUP``), waiting up to ``limit`` seconds (None: forever);
        ``readable`` and ``writable`` are watched too, for this wait only."""
        extra = [(fd, select.POLLIN) for fd in readable] + [(fd, select.POLLOUT) for fd in writable]
        for fd, events in extra:
            self._poller.register(fd, events)
        try:
            return {fd for fd, _ in self._poll(limit)}
        finally:
            for fd, _ in extra:
                self._poller.unregister(fd)

    @waits_for_upstream
    def _poll(self, limit: float | None) -> list[tuple[int, int]]:
        return self._poller.poll(None if limit is None else math.ceil(limit * 1000))

    def speaking(self, ready: set[int]) -> list[int]:
        """The workers listened to whose responses are among ``ready``."""
        return [self._responding[fd] for fd in ready if fd in self._listening and fd in self._responding]

    def dead(self, ready: set[int]) -> list[int]:
        """The workers whose sentinels are among ``ready``."""
        return [self._sentinels[fd] for fd in ready if fd in self._sentinels]

    def dead_now(self) -> list[int]:
        """The workers whose sentinels show a death now (a look that does not wait)."""
        return [self._sentinels[fd] for fd, _ in self._deaths.poll(0)]


class WakePipe:
    """A pipe the reader of the workers waits on beside them, so that another thread can
    end its wait (:meth:`wake`).

    The reader owns the descriptors: it opens them when it begins and closes them when it
    ends, in whichever thread reads at the time, so no descriptor is closed (and its number
    reused) under a wait on it, and whoever ends the reading, the consumer or a read-ahead
    thread that outlived it, releases them. :meth:`wake` comes from any thread, before,
    during or after the reading: it writes only while the pipe is open, and a wake that
    came first is written when it opens.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fds: tuple[int, int] | None = None
        self._woken = False

    def open(self) -> int:
        """Make the pipe; its read end, to wait on."""
        with self._lock:
            assert self._fds is None, "a wake pipe serves one reading"
            reader, writer = os.pipe()
            os.set_blocking(writer, False)  # one byte is enough to wake; a full pipe never blocks the waker
            self._fds = reader, writer
            if self._woken:
                self._write(writer)
            return reader

    def wake(self) -> None:
        """End the reader's wait (now, or at once when it next waits)."""
        with self._lock:
            self._woken = True
            if self._fds is not None:
                self._write(self._fds[1])

    @staticmethod
    def _write(writer: int) -> None:
        with contextlib.suppress(BlockingIOError):  # already holds a byte: the reader wakes anyway
            os.write(writer, b"x")

    def close(self) -> None:
        """Close both ends (the reader, when it ends). Idempotent."""
        with self._lock:
            fds, self._fds = self._fds, None
        for fd in fds or ():
            os.close(fd)
