"""Dispatch mode: the main process reads a once-only source and feeds the workers.

Main side, :class:`Dispatcher`: reads the graph upstream of the dispatch point, gives item
``i`` to worker ``i % num_workers`` together with the upstream's state after it, and
sends each worker up to ``window`` items ahead of what it acknowledged. A worker's queue
is never allowed to block the main process: items wait in the dispatcher until the
worker has room, and a sender thread does the (possibly blocking) pipe writes.

Worker side, :class:`DispatchedSource`: replaces the dispatch point in the worker's graph
and yields what it is fed. When its queue runs low it reports how far it has read
(:class:`~conveyor.workers.protocol.Progress`): the dispatcher refills it and the merge
learns that no later output of that worker can come before that position.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from conveyor.errors import WorkerError
from conveyor.graph import apply_random_seed
from conveyor.pipes.base import IterDataPipe, Position, ShardingPoint, close_iterator
from conveyor.random import SeedGenerator
from conveyor.state import StateCapturer, load_graph_state, require_keys, reset_graph
from conveyor.workers.protocol import Feed

END = object()


class Interrupted(BaseException):
    """A request that ends the current epoch arrived while the pipeline waited for input.

    A ``BaseException``, like ``GeneratorExit``, so user code's ``except Exception`` in
    the pipeline does not swallow it.
    """


class FeedQueue:
    """The worker's queue of dispatched items for the current epoch."""

    #: Ask for more when this few items are left (the dispatcher sends up to its window).
    LOW_WATER = 2

    def __init__(self) -> None:
        self.generation = -1
        self.items: deque[tuple[Any, int, Any]] = deque()
        self.ended = False
        self.taken = 0  # items taken this epoch
        self.position = -1  # position of the last item taken
        self.reported = 0  # ``taken`` when progress was last reported
        self.wait: Callable[[FeedQueue], None] | None = None  # blocks until fed (event loop)
        self.report: Callable[[FeedQueue], None] | None = None  # sends Progress (event loop)

    def restart(self, generation: int) -> None:
        self.generation, self.items, self.ended = generation, deque(), False
        self.taken, self.position, self.reported = 0, -1, 0

    def add(self, feed: Feed) -> None:
        if feed.generation == self.generation:
            self.items.extend(feed.entries)
            self.ended = self.ended or feed.end

    def take(self) -> Any:
        while not self.items:
            if self.ended:
                return END
            assert self.wait is not None and self.report is not None, "the worker did not connect its feed"
            if self.reported != self.taken:
                self.report(self)
            self.wait(self)
        entry = self.items.popleft()
        self.taken += 1
        self.position = entry[1]
        if len(self.items) == self.LOW_WATER and not self.ended and self.report is not None:
            self.report(self)
        return entry


class DispatchedSource(IterDataPipe, ShardingPoint):
    """Stands in for the dispatch point in a worker: yields the items dispatched to it."""

    per_item = True
    keeps_order = True

    def __init__(self) -> None:
        self._feed: FeedQueue | None = None
        self._position = -1
        self._upstream: Any = None
        self._last: Position | None = None

    def connect(self, feed: FeedQueue) -> None:
        self._feed = feed

    def apply_sharding(self, num_shards: int, shard_index: int, priority: Any) -> None:
        """Nothing to do: the dispatcher already chose what this worker receives."""

    def __iter__(self) -> Iterator[Any]:
        if self._feed is None:
            raise RuntimeError("a dispatched source runs in a worker of MultiProcessingReadingService only")
        resume = self._take_restored()
        self._position = resume["position"] if resume else -1
        self._upstream = resume["upstream"] if resume else None
        while True:
            entry = self._feed.take()
            if entry is END:
                return
            item, self._position, self._upstream = entry
            self._last = (self._position,)
            yield item

    def item_position(self) -> Position | None:
        return self._last

    def reset(self) -> None:
        super().reset()
        self._position, self._upstream, self._last = -1, None, None

    def _current_state(self) -> dict[str, Any]:
        return {"position": self._position, "upstream": self._upstream}

    def _check_state(self, state: Mapping[str, Any]) -> None:
        require_keys(state, {"position": int, "upstream": (Mapping, type(None))}, repr(self))


class Dispatcher:
    """Reads the upstream graph in the main process and feeds the workers round-robin."""

    def __init__(self, upstream: IterDataPipe, pool: Any, window: int):
        self._upstream = upstream
        self._pool = pool
        self._count = pool.num_workers
        self._window = window
        self._capture = StateCapturer(upstream)
        self._items: Iterator[Any] | None = None
        self._generation = -1

    def start_epoch(self, generation: int, seeds: SeedGenerator, lanes: list[tuple[int, Any]]) -> None:
        """Position the upstream after the earliest item some worker still needs.

        ``lanes`` holds, per worker, the position of the last fed item its resumed state
        has taken and the upstream's state after it (``(-1, None)``: from the start).
        """
        self._generation = generation
        self._close_items()
        apply_random_seed(self._upstream, seeds)
        states = lanes
        self._skip_through = [position for position, _ in states]
        earliest = min(states, key=lambda pair: pair[0])
        if earliest[0] < 0 or earliest[1] is None:
            reset_graph(self._upstream)
            self._next = 0
        else:
            load_graph_state(self._upstream, earliest[1], "dispatcher upstream state")
            self._next = earliest[0] + 1
        self._pending: list[deque[tuple[Any, int, Any]]] = [deque() for _ in range(self._count)]
        self._sent = [0] * self._count  # items sent this epoch, per worker
        self._taken = [0] * self._count  # items the worker reported taking
        self._sent_end = [False] * self._count
        self._exhausted = False
        self._items = iter(self._upstream)

    def progress(self, worker_id: int, taken: int) -> None:
        """Worker ``worker_id`` reported it has taken ``taken`` items this epoch."""
        self._taken[worker_id] = max(self._taken[worker_id], taken)

    def pump(self) -> None:
        """Read ahead and send what fits, so no worker with room sits empty."""
        for worker in range(self._count):
            while self._room(worker) and not self._pending[worker] and not self._exhausted:
                self._read_one()
            self._send(worker)

    def _room(self, worker: int) -> int:
        return self._window - (self._sent[worker] - self._taken[worker])

    def _read_one(self) -> None:
        assert self._items is not None
        try:
            item = next(self._items)
        except StopIteration:
            self._exhausted = True
            return
        except Exception as error:
            failure = WorkerError(f"the dispatcher (main process) raised {type(error).__qualname__}: {error}")
            raise failure from error
        position = self._next
        self._next += 1
        owner = position % self._count
        if position > self._skip_through[owner]:
            self._pending[owner].append((item, position, self._capture()))

    def _send(self, worker: int) -> None:
        pending = self._pending[worker]
        entries = [pending.popleft() for _ in range(max(0, min(self._room(worker), len(pending))))]
        end = self._exhausted and not pending and not self._sent_end[worker]
        if entries or end:
            self._sent_end[worker] = self._sent_end[worker] or end
            self._sent[worker] += len(entries)
            self._pool.send(worker, Feed(self._generation, entries, end))

    def _close_items(self) -> None:
        items, self._items = self._items, None
        close_iterator(items)

    def close(self) -> None:
        self._close_items()
