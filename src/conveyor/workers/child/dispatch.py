"""Dispatch mode, the workers' side: the main process reads a once-only source and feeds
the workers (its side: :mod:`conveyor.workers.parent.dispatcher`).

:class:`DispatchedSource` replaces the dispatch point in the worker's graph and yields
what it is fed, from a :class:`FeedQueue` per channel (a graph may have several
non-replicable branches). When its queue runs low it reports how far it has read
(:class:`~conveyor.workers.transport.protocol.Progress`): the dispatcher refills it and
the merge learns that no later output of that worker can come before that position.
The states of the dispatched sources (where a resume must feed from) are read and
checked here too.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from conveyor.core.base import IterDataPipe
from conveyor.core.graph import list_dps
from conveyor.core.op_roles import ShardingPoint
from conveyor.core.passes import Pass, PassContext, Position, State
from conveyor.core.state import parts_of
from conveyor.workers.transport.protocol import Feed

END = object()


class Interrupted(BaseException):
    """A request that ends the current epoch arrived while the pipeline waited for input.

    A ``BaseException``, like ``GeneratorExit``, so user code's ``except Exception`` in
    the pipeline does not swallow it.
    """


class FeedQueue:
    """The worker's queue of dispatched items of one channel for the current epoch."""

    #: Ask for more when this few items are left (the dispatcher sends up to its window).
    LOW_WATER = 2

    def __init__(self, channel: int = 0) -> None:
        self.channel = channel
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


class DispatchedSourcePass(Pass):
    """``next``: the position after the last fed item taken; ``upstream``: the dispatcher's
    upstream state after it (where a resume must feed from)."""

    def __init__(self, pipe: DispatchedSource, state: State | None, context: PassContext):
        super().__init__(pipe, context)
        if pipe._feed is None:
            raise RuntimeError("a dispatched source runs in a worker of MultiProcessingReadingService only")
        self.next = state["next"] if state is not None else 0
        self.upstream: State | None = state["upstream"] if state is not None else None
        self._last: Position | None = None
        self.count = 0
        self.items = self._take(pipe._feed)

    def _take(self, feed: FeedQueue) -> Iterator[Any]:
        while True:
            entry = feed.take()
            if entry is END:
                return
            item, position, self.upstream = entry
            self.next = position + 1
            self._last = (position,)
            self.count += 1
            yield item

    def state(self) -> State:
        return {"next": self.next, "upstream": self.upstream}

    def position(self) -> Position | None:
        return self._last

    def yielded(self) -> int:
        return self.count


class DispatchedSource(IterDataPipe, ShardingPoint):
    """Stands in for dispatch point number ``channel`` in a worker: yields the items
    dispatched to it. The dispatcher's upstream state in its state is checked by the
    reading service, which has that graph."""

    per_item = True
    keeps_order = True
    pass_type = DispatchedSourcePass
    state_fields = {"next": int, "upstream": (dict, type(None))}
    _runtime = IterDataPipe._runtime | {"_feed"}
    _feed: FeedQueue | None = None
    #: The dispatch point's stand-in: sharding points after it keep every item.
    dispatches = True
    _params = ("channel",)

    def __init__(self, channel: int = 0) -> None:
        self.channel = channel

    def connect(self, feed: FeedQueue) -> None:
        self._feed = feed

    def apply_sharding(self, num_of_instances: int, instance_id: int, sharding_group: Any = 0) -> None:
        """Nothing to do: the dispatcher already chose what this worker receives."""


def dispatched_state_reader(replicated: IterDataPipe) -> Callable[[State], list[tuple[int, State | None]]]:
    """From a worker's state, per channel: ``(the position after the last fed item it has
    fully taken in, the dispatcher's upstream state there)``. States saved from earlier
    points count too: an op that replays (``flatmap`` mid-item) needs its fed items again
    from there."""
    sources = dispatched_sources(replicated)

    def read(state: State) -> list[tuple[int, State | None]]:
        lanes: list[tuple[int, State | None]] = []
        for source in sources:
            found = parts_of(replicated, state, source)
            if not found:  # a branch the state has not reached: from the start
                lanes.append((0, None))
                continue
            earliest = min(found, key=lambda part: part["next"])
            lanes.append((earliest["next"], earliest["upstream"]))
        return lanes

    return read


def check_dispatched_states(
    replicated: IterDataPipe, upstreams: list[IterDataPipe], states: list[Any], where: str
) -> None:
    """Each worker's fed items' upstream states, against each channel's dispatcher graph."""
    for source, upstream in zip(dispatched_sources(replicated), upstreams, strict=True):
        for worker_id, state in enumerate(states):
            if state is None:
                continue
            for part in parts_of(replicated, state, source):
                if part["upstream"] is not None:
                    upstream.check_state(
                        part["upstream"], f"{where}, dispatcher upstream {source.channel} of worker {worker_id}"
                    )


def dispatched_sources(replicated: IterDataPipe) -> list[DispatchedSource]:
    """The graph's dispatched sources, by channel."""
    found = [node for node in list_dps(replicated) if isinstance(node, DispatchedSource)]
    return sorted(found, key=lambda source: source.channel)
