"""Dispatch mode, the main process's side: it reads the graph upstream of each dispatch
point (one *channel* per point: a graph may have several non-replicable branches), gives
item ``i`` of a channel to worker ``i % num_workers`` together with the upstream's state
after it, and sends each worker up to ``window`` items of each channel ahead of what it
acknowledged. A worker's queue is never allowed to block the main process: items wait in
the dispatcher until the worker has room. (The workers' side:
:mod:`conveyor.workers.child.dispatch`.)
"""

from __future__ import annotations

import traceback
from collections import deque
from typing import Any

from conveyor.core.base import IterDataPipe
from conveyor.core.graph import apply_random_seed
from conveyor.core.passes import Pass, PassContext, State
from conveyor.core.random import SeedGenerator
from conveyor.core.skips import SkipPolicy
from conveyor.workers.transport.protocol import Feed
from conveyor.workers.transport.remote_errors import remote_error


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
