"""Dispatch mode: the main process reads a once-only source and feeds the workers.

Main side, :class:`Dispatcher`: reads the graph upstream of each dispatch point (one
*channel* per point: a graph may have several non-replicable branches), gives item ``i``
of a channel to worker ``i % num_workers`` together with the upstream's state after it,
and sends each worker up to ``window`` items of each channel ahead of what it
acknowledged. A worker's queue is never allowed to block the main process: items wait in
the dispatcher until the worker has room.

Worker side, :class:`DispatchedSource`: replaces the dispatch point in the worker's graph
and yields what it is fed. When its queue runs low it reports how far it has read
(:class:`~conveyor.workers.protocol.Progress`): the dispatcher refills it and the merge
learns that no later output of that worker can come before that position.
"""

from __future__ import annotations

import traceback
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from conveyor.graph import apply_random_seed, list_dps
from conveyor.pipes.base import IterDataPipe
from conveyor.pipes.op_roles import ShardingPoint
from conveyor.pipes.passes import Pass, PassContext, Position, State
from conveyor.pipes.skips import SkipPolicy
from conveyor.random import SeedGenerator
from conveyor.remote_errors import remote_error
from conveyor.state import parts_of
from conveyor.workers.protocol import Feed

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


class Dispatcher:
    """Reads each upstream graph in the main process and feeds the workers round-robin:
    one :class:`DispatchRun` per epoch (passes of its own over the upstream graphs, so an
    abandoned epoch's run, still in a thread, shares nothing with the next one)."""

    def __init__(self, upstreams: list[IterDataPipe], pool: Any, window: int):
        self._upstreams = upstreams
        self._pool = pool
        self._window = window

    def start(
        self,
        generation: int,
        seeds: SeedGenerator,
        lanes: list[list[tuple[int, State | None]]],
        skips: SkipPolicy | None = None,
    ) -> DispatchRun:
        """An epoch's run, each channel positioned after the earliest item some worker
        still needs.

        ``lanes[channel]`` holds, per worker, the position after the last fed item of that
        channel its resumed state has taken and the upstream's state there (``(0, None)``:
        from the start). ``skips``: the epoch's skip ledger (``on_error="skip"``): the
        upstream's stages record the items they drop there as they read them.
        """
        channels = []
        for channel, (upstream, channel_lanes) in enumerate(zip(self._upstreams, lanes, strict=True)):
            apply_random_seed(upstream, seeds)
            earliest = min(channel_lanes, key=lambda pair: pair[0])
            context = PassContext(skips=skips)  # a tree of its own per channel
            if earliest[0] <= 0 or earliest[1] is None:
                opened, first = context.open(upstream, None), 0
            else:
                opened, first = context.open(upstream, earliest[1]), earliest[0]
            skip_below = [after for after, _ in channel_lanes]
            channels.append(ChannelRun(self._pool, generation, self._window, channel, opened, first, skip_below))
        return DispatchRun(channels)


class DispatchRun:
    """One epoch of dispatching on every channel."""

    def __init__(self, channels: list[ChannelRun]) -> None:
        self._channels = channels

    @property
    def failure(self) -> BaseException | None:
        """What reading an upstream raised (the first channel's that failed): the reader
        raises it once every item fed before it has been handed out."""
        return next((run.failure for run in self._channels if run.failure is not None), None)

    def progress(self, worker_id: int, taken: int, channel: int = 0) -> None:
        """Worker ``worker_id`` reported it has taken ``taken`` items of ``channel``."""
        self._channels[channel].progress(worker_id, taken)

    def pump(self) -> None:
        for run in self._channels:
            run.pump()

    def close(self) -> None:
        for run in self._channels:
            run.close()


class ChannelRun:
    """One epoch of one channel: reads ahead and sends each worker what fits its window."""

    def __init__(
        self, pool: Any, generation: int, window: int, channel: int, opened: Pass, first: int, skip_below: list[int]
    ) -> None:
        count = len(skip_below)
        self._pool, self._generation, self._window, self._channel = pool, generation, window, channel
        self._pass, self._items, self._next = opened, opened.items, first
        self._skip_below = skip_below  # per worker: the positions below it were taken already
        self._pending: list[deque[tuple[Any, int, Any]]] = [deque() for _ in range(count)]
        self._sent = [0] * count  # items sent this epoch, per worker
        self._taken = [0] * count  # items the worker reported taking
        self._sent_end = [False] * count
        self._exhausted = False
        #: What reading the upstream raised: the workers get the items read before it, and
        #: the reader raises it once they have all been handed out.
        self.failure: BaseException | None = None

    def progress(self, worker_id: int, taken: int) -> None:
        """Worker ``worker_id`` reported it has taken ``taken`` items this epoch."""
        self._taken[worker_id] = max(self._taken[worker_id], taken)

    def pump(self) -> None:
        """Read ahead and send what fits, so no worker with room sits empty."""
        for worker in range(len(self._pending)):
            while self._room(worker) and not self._pending[worker] and not self._exhausted:
                self._read_one()
            self._send(worker)

    def _room(self, worker: int) -> int:
        return self._window - (self._sent[worker] - self._taken[worker])

    def _read_one(self) -> None:
        try:
            item = next(self._items)
        except StopIteration:
            self._exhausted = True
            return
        except Exception as error:
            text = "".join(traceback.format_exception(error))
            failure = remote_error(
                error, type(error).__qualname__, str(error), text, "dispatching process (the main process)"
            )
            self.failure, self._exhausted = failure, True
            return
        position = self._next
        self._next += 1
        owner = position % len(self._pending)
        if position >= self._skip_below[owner]:
            self._pending[owner].append((item, position, self._pass.state()))

    def _send(self, worker: int) -> None:
        pending = self._pending[worker]
        entries = [pending.popleft() for _ in range(max(0, min(self._room(worker), len(pending))))]
        end = self._exhausted and not pending and not self._sent_end[worker]
        if entries or end:
            self._sent_end[worker] = self._sent_end[worker] or end
            self._sent[worker] += len(entries)
            self._pool.send(worker, Feed(self._generation, entries, end, self._channel))

    def close(self) -> None:
        self._pass.close()


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
