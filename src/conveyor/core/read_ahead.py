"""Reading ahead of a consumer in a background thread: always (:func:`read_ahead`, the
``prefetch`` op), or only while it pays (:func:`adaptive_read_ahead`, the workers' reader).

The thread owns the iterator it reads while it runs; the consumer gets entries through a
:class:`BoundedBuffer`. Exceptions cross over as :class:`ThreadFailure` and are re-raised
in the consumer; closing the consumer's generator stops and joins the thread.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from conveyor.core.stage_marks import waits_for_upstream
from conveyor.core.worker_info import carried


def close_iterator(iterator: Any) -> None:
    """Close a generator (running its ``finally`` blocks now); other iterators are left be.
    Here, below the pipes, because reading ahead closes what it reads: the pipes' prefetch
    builds on this module, and loaders and workers close their epochs' iterators with it."""
    close = getattr(iterator, "close", None)
    if close is not None:
        close()


#: How long the consumer waits between checks that the producer thread is still alive.
_LIVENESS_CHECK_S = 1.0
#: How long stopping waits for the producer to notice. A producer inside a slow item is
#: left to finish it on its own: it owns what it reads (the passes of its pipe's inputs),
#: so it harms nothing, and it ends at its next hand-off to the closed buffer.
_STOP_WAIT_S = 0.1
#: How long a producer that handed its turn back may take to end.
_HAND_BACK_WAIT_S = 10.0

END = object()
#: What a producer's iterator yields to ask a thread reading it to hand it back to the
#: consumer's thread at once (for work only that thread may do, like starting a process);
#: never an entry: a consumer reading it itself passes over it.
HAND_BACK_REQUEST = object()


class ThreadFailure:
    def __init__(self, error: BaseException):
        self.error = error


class BoundedBuffer:
    """A bounded hand-off between one producer thread and one consumer, closable from
    either side; waits wake on notification, not by polling. An entry may weigh more than
    one (a run of items); the producer waits while the buffered weight is at capacity."""

    def __init__(self, capacity: int):
        self._items: deque[tuple[Any, int]] = deque()
        self._capacity = capacity
        self._weight = 0
        self._closed = False
        self._cond = threading.Condition()

    def put(self, entry: Any, weight: int = 1) -> bool:
        """Wait for room; False when the consumer closed the buffer (stop producing)."""
        with self._cond:
            while self._weight >= self._capacity and not self._closed:
                self._cond.wait(_LIVENESS_CHECK_S)
            if self._closed:
                return False
            self._items.append((entry, weight))
            self._weight += weight
            self._cond.notify()  # the one other party: the buffer cannot be full and empty
            return True

    @waits_for_upstream
    def get(self, producer: threading.Thread) -> Any:
        with self._cond:
            while not self._items:
                if not producer.is_alive():
                    return ThreadFailure(RuntimeError(f"the thread {producer.name} ended without a word"))
                self._cond.wait(_LIVENESS_CHECK_S)
            entry, weight = self._items.popleft()
            self._weight -= weight
            self._cond.notify()
            return entry

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._items.clear()
            self._weight = 0
            self._cond.notify_all()


#: Marks the end of a thread's turn: the consumer reads on by itself from the next entry.
HANDED_BACK = object()
#: Entries between two decisions to start or stop the thread (so that it does not flap).
_ENTRIES_PER_DECISION = 16
#: One entry in this many is timed into the costs: reading a thread's CPU clock is a
#: system call (about 0.6 us here), and the averages need samples, not every entry. Odd,
#: so that a cost alternating every 2 or 4 entries (two workers' runs) is seen in every
#: phase.
_TIMED_EVERY = 5


class ReadAheadCosts:
    """Running averages, per entry, of what producing and consuming cost, and the verdict
    on whether a read-ahead thread pays.

    A thread hides an entry's production behind the consumer's own work, but every
    hand-off costs CPU (waking a thread, passing the GIL) and production can only be
    hidden behind time the consumer spends elsewhere. So it pays while the consumer is
    away clearly longer than an entry costs to produce, and production is mostly work
    rather than waiting for its own upstream (workers slower than the consumer make
    every reader wait alike; then reading ahead buys nothing). Time a thread spends
    waiting for the GIL counts as waiting: it overlaps nothing either. A band between
    the verdicts to start and to stop keeps the choice from flapping.
    """

    _WEIGHT = 0.125  # of the newest sample in each average, per entry
    #: A timed production sample stands for :data:`_TIMED_EVERY` entries: it moves its
    #: averages as far as that many samples would, so that they keep pace with the
    #: consumer's, which is timed at every entry (else fresh costs would see production
    #: as cheaper than it is, and start a thread that does not pay).
    _SAMPLE_WEIGHT = 1 - (1 - _WEIGHT) ** _TIMED_EVERY

    def __init__(self) -> None:
        self.work_s = 0.0  # CPU time to produce an entry
        self.wait_s = 0.0  # time producing an entry spent blocked (upstream, the GIL)
        self.away_s = 0.0  # time the consumer spent elsewhere between two entries
        self.untimed = 0  # entries until the next timed one (see _timed_next)

    def produced(self, work_s: float, wait_s: float) -> None:
        """One timed entry's production (see :func:`_timed_next`)."""
        self.work_s += (work_s - self.work_s) * self._SAMPLE_WEIGHT
        self.wait_s += (max(wait_s, 0.0) - self.wait_s) * self._SAMPLE_WEIGHT

    def consumed(self, away_s: float) -> None:
        self.away_s += (away_s - self.away_s) * self._WEIGHT

    @property
    def thread_pays(self) -> bool:
        """Start a thread: the consumer is away twice as long as production works, and
        production works twice as long as it waits."""
        return self.away_s > 2 * self.work_s > 4 * self.wait_s

    @property
    def thread_costs(self) -> bool:
        """Stop the thread: production takes longer than the consumer is away, or waits
        longer than it works."""
        return self.away_s < self.work_s or self.work_s < self.wait_s


def _timed_next(entries: Iterator[Any], costs: ReadAheadCosts) -> Any:
    """``next(entries)``, recording in ``costs`` (for one call in :data:`_TIMED_EVERY`)
    how much of it was work and how much waiting."""
    costs.untimed -= 1
    if costs.untimed > 0:
        return next(entries)
    costs.untimed = _TIMED_EVERY
    wall, cpu = time.perf_counter(), time.thread_time()
    entry = next(entries)
    work_s = time.thread_time() - cpu
    costs.produced(work_s, time.perf_counter() - wall - work_s)
    return entry


class _ReadAheadThread:
    """One stretch of reading ahead in a thread, ended by the consumer (``hand_back``),
    by the end of ``entries``, by a failure, or by closing the buffer. With ``costs``,
    each entry's production is timed into it."""

    def __init__(
        self,
        entries: Iterator[Any],
        capacity: int,
        name: str,
        weigh: Callable[[Any], int] | None,
        costs: ReadAheadCosts | None,
    ):
        self.buffer = BoundedBuffer(capacity)
        self._entries, self._weigh, self._costs = entries, weigh, costs
        self._hand_back = threading.Event()
        self.handed_back = False  # the thread ended its turn leaving ``entries`` open
        self.thread = threading.Thread(target=carried(self._produce), name=name, daemon=True)
        self.thread.start()

    def hand_back(self) -> None:
        """Ask the thread to stop after the entry it is producing, leaving ``entries`` open."""
        self._hand_back.set()

    @property
    def handing_back(self) -> bool:
        return self._hand_back.is_set()

    def _produce(self) -> None:
        entries, buffer = self._entries, self.buffer
        try:
            while not self._hand_back.is_set():
                try:
                    entry = next(entries) if self._costs is None else _timed_next(entries, self._costs)
                except StopIteration:
                    buffer.put(END)
                    return
                if entry is HAND_BACK_REQUEST:
                    self._hand_back.set()
                    continue
                if not buffer.put(entry, self._weigh(entry) if self._weigh else 1):
                    return
            self.handed_back = buffer.put(HANDED_BACK, 0)
        except BaseException as error:  # handed to the consumer, which re-raises it
            buffer.put(ThreadFailure(error))
        finally:
            if not self.handed_back:
                close_iterator(entries)

    def take(self) -> Any:
        """The next entry, :data:`END` or :data:`HANDED_BACK`; re-raises the thread's failure."""
        entry = self.buffer.get(self.thread)
        if isinstance(entry, ThreadFailure):
            raise entry.error
        return entry

    def stop(self, interrupt: Callable[[], None] | None, wait: float = _STOP_WAIT_S) -> bool:
        """Close the buffer, wake the thread (``interrupt()``) and give it up to ``wait``
        seconds to end; whether it ended its turn leaving ``entries`` open (then the caller
        closes them). A thread still inside an item closes ``entries`` itself when it ends."""
        self.buffer.close()
        if interrupt is not None:
            interrupt()
        self.thread.join(wait)
        if self.handed_back:
            self.thread.join(_HAND_BACK_WAIT_S)  # past its last entry: it is ending now
        return self.handed_back


class Pause:
    """A switch for a :func:`read_ahead`, flipped from outside (``prefetch``'s ``pause()``):
    while paused, the thread reads no entry past the one it is reading and ends its turn;
    the consumer takes what it buffered, then reads on by itself, one entry per
    ``next()``, so nothing waits on a paused reader. :meth:`resume` starts a thread again
    at the consumer's next ``next()``."""

    def __init__(self) -> None:
        self.paused = False
        self._reader: _ReadAheadThread | None = None

    def pause(self) -> None:
        self.paused = True
        reader = self._reader
        if reader is not None:
            reader.hand_back()

    def resume(self) -> None:
        self.paused = False

    def _running(self, reader: _ReadAheadThread | None) -> None:
        self._reader = reader
        if reader is not None and self.paused:  # paused while the thread was starting
            reader.hand_back()


def read_ahead(
    entries: Iterator[Any],
    capacity: int,
    name: str,
    weigh: Callable[[Any], int] | None = None,
    interrupt: Callable[[], None] | None = None,
    switch: Pause | None = None,
) -> Iterator[Any]:
    """Yield ``entries``, produced by a background thread up to ``capacity`` ahead.

    The producer thread owns ``entries``: it closes it when done, stopped or failed, and
    its exceptions are re-raised here. Closing this generator stops and joins the thread;
    ``interrupt()`` is called first, to wake a producer blocked outside the buffer.
    ``weigh(entry)`` counts an entry as several (a run of items) against ``capacity``.
    ``switch`` pauses the thread (see :class:`Pause`); the order of entries never depends
    on who read them.
    """
    switch = Pause() if switch is None else switch
    reader: _ReadAheadThread | None = None
    try:
        while True:
            if reader is None:
                if switch.paused:
                    try:
                        entry = next(entries)
                    except StopIteration:
                        return
                    yield entry
                    continue
                reader = _ReadAheadThread(entries, capacity, name, weigh, costs=None)
                switch._running(reader)
            entry = reader.take()
            if entry is HANDED_BACK:
                reader.thread.join(_HAND_BACK_WAIT_S)
                reader = None
                switch._running(None)
                continue
            if entry is END:
                return
            yield entry
    finally:
        switch._running(None)
        # Ours to close unless a thread still owns them; one that handed back left them to us.
        if reader is None or reader.stop(interrupt):
            close_iterator(entries)


def adaptive_read_ahead(
    entries: Iterator[Any],
    capacity: int,
    name: str,
    weigh: Callable[[Any], int] | None = None,
    interrupt: Callable[[], None] | None = None,
    costs: ReadAheadCosts | None = None,
    before_thread: Callable[[], None] | None = None,
    stop_wait: float = _STOP_WAIT_S,
) -> Iterator[Any]:
    """Yield ``entries``, read up to ``capacity`` ahead by a background thread while that
    pays (``costs``, a fresh :class:`ReadAheadCosts` by default, decides every few entries), and by
    the consumer itself otherwise. ``before_thread()`` runs in the consumer's thread
    before each stretch of reading ahead (to do there what the thread must not).

    The order of entries never depends on who read them. Whoever holds ``entries`` closes
    it when done; closing this generator stops and joins a running thread, calling
    ``interrupt()`` first to wake it if it is blocked outside the buffer, and waiting up to
    ``stop_wait`` seconds for it to end (a thread still inside an entry then ends on its
    own, and closes ``entries`` itself).
    """
    costs = ReadAheadCosts() if costs is None else costs
    reader: _ReadAheadThread | None = None
    until_decision = _ENTRIES_PER_DECISION
    try:
        while True:
            if reader is None:
                try:
                    entry = _timed_next(entries, costs)
                except StopIteration:
                    return
                if entry is HAND_BACK_REQUEST:
                    continue
            else:
                entry = reader.take()
                if entry is HANDED_BACK:
                    reader.thread.join(_HAND_BACK_WAIT_S)
                    reader = None
                    continue
                if entry is END:
                    return
            left = time.perf_counter()
            yield entry
            costs.consumed(time.perf_counter() - left)
            until_decision -= 1
            if until_decision <= 0:
                until_decision = _ENTRIES_PER_DECISION
                if reader is None and costs.thread_pays:
                    if before_thread is not None:
                        before_thread()
                    reader = _ReadAheadThread(entries, capacity, name, weigh, costs)
                elif reader is not None and not reader.handing_back and costs.thread_costs:
                    reader.hand_back()
    finally:
        # Ours to close unless a thread still owns them; one that handed back left them to us.
        if reader is None or reader.stop(interrupt, stop_wait):
            close_iterator(entries)
