"""``prefetch``: read ahead of the consumer in a background thread.

Each item travels with its upstream's state right after it, so the op's state is the
state behind the last item it *yielded*, not the one it read last: a checkpoint taken
while the thread is ahead is still exact.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from conveyor.pipes.base import IterDataPipe, Position, check_int, close_iterator
from conveyor.state import (
    GraphState,
    StateCapturer,
    prepare_upstream,
    require_keys,
    validate_graph_state,
)
from conveyor.waiting import waits_for_upstream

#: How long the consumer waits between checks that the producer thread is still alive.
_LIVENESS_CHECK_S = 1.0
#: How long closing the pipe waits for the producer to finish its current item.
_JOIN_TIMEOUT_S = 10.0

END = object()


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


def read_ahead(
    entries: Iterator[Any],
    capacity: int,
    name: str,
    weigh: Callable[[Any], int] | None = None,
    interrupt: Callable[[], None] | None = None,
) -> Iterator[Any]:
    """Yield ``entries``, produced by a background thread up to ``capacity`` ahead.

    The producer thread owns ``entries``: it closes it when done, stopped or failed, and
    its exceptions are re-raised here. Closing this generator stops and joins the thread;
    ``interrupt()`` is called first, to wake a producer blocked outside the buffer.
    ``weigh(entry)`` counts an entry as several (a run of items) against ``capacity``.
    """
    buffer = BoundedBuffer(capacity)

    def produce() -> None:
        try:
            for entry in entries:
                if not buffer.put(entry, weigh(entry) if weigh else 1):
                    return
            buffer.put(END)
        except BaseException as error:  # handed to the consumer, which re-raises it
            buffer.put(ThreadFailure(error))
        finally:
            close_iterator(entries)

    producer = threading.Thread(target=produce, name=name, daemon=True)
    producer.start()
    try:
        while True:
            entry = buffer.get(producer)
            if entry is END:
                return
            if isinstance(entry, ThreadFailure):
                raise entry.error
            yield entry
    finally:
        buffer.close()
        if interrupt is not None:
            interrupt()
        producer.join(_JOIN_TIMEOUT_S)


def _with_states(source: IterDataPipe, capture: Callable[[], GraphState]) -> Iterator[tuple[Any, Any, Any]]:
    for item in source:
        yield item, capture(), source.item_position()


@IterDataPipe.register_functional("prefetch")
class Prefetcher(IterDataPipe):
    """Keeps up to ``buffer_size`` items read ahead by a background thread. The thread
    stops and is joined when the pass ends, breaks off, or fails."""

    per_item = True
    keeps_order = True

    _params = ("buffer_size",)

    def __init__(self, source: IterDataPipe, buffer_size: int = 10):
        check_int("buffer_size", buffer_size, 1)
        self.source = source
        self.buffer_size = buffer_size
        self._upstream: GraphState | None = None
        self._position: Position | None = None

    def __iter__(self) -> Iterator[Any]:
        resume = self._take_restored()
        prepare_upstream(self.source, resume, "upstream", repr(self))
        capture = StateCapturer(self.source)
        self._upstream, self._position = capture(), None
        entries = read_ahead(_with_states(self.source, capture), self.buffer_size, "conveyor-prefetch")
        for item, upstream, position in entries:
            self._upstream, self._position = upstream, position
            yield item

    def item_position(self) -> Position | None:
        return self._position

    def __len__(self) -> int:
        return len(self.source)

    def reset(self) -> None:
        super().reset()
        self._upstream, self._position = None, None

    def _current_state(self) -> dict[str, Any]:
        return {"upstream": self._upstream}

    def _check_state(self, state: Mapping[str, Any]) -> None:
        require_keys(state, {"upstream": (Mapping, type(None))}, repr(self))
        if state["upstream"] is not None:
            validate_graph_state(self.source, state["upstream"], f"{self!r} upstream snapshot")
