"""``prefetch``: read ahead of the consumer in a background thread.

Each item travels with its input's state right after it, so the op's state is the state
behind the last item it *yielded*, not the one it read last: a checkpoint taken while the
thread is ahead is still exact. The thread owns the passes it reads; closing the pass
stops it without waiting for an item it is stuck in (it ends on its own afterwards).
"""

from __future__ import annotations

import inspect
from collections.abc import Generator, Iterator
from typing import Any, TypeVar

from conveyor.core.base import IterDataPipe
from conveyor.core.op_roles import Pausable
from conveyor.core.passes import Pass, PassContext, Position, State
from conveyor.core.read_ahead import Pause, read_ahead
from conveyor.core.validation import check_int

T = TypeVar("T")


def _with_states(source: Pass, profiler: Any) -> Iterator[tuple[Any, State, Position | None]]:
    """The items of ``source`` with its state and position after each, in the thread that
    owns ``source``: it closes it when done, stopped or failed (an inner prefetch's thread
    goes with it)."""
    items = source.items
    try:
        while True:
            try:
                if profiler is None:
                    item = next(items)
                else:  # statistics time one pull in many, in this thread too
                    profiler.countdown -= 1
                    item = profiler.pull(items, source) if profiler.countdown <= 0 else next(items)
            except StopIteration:
                return
            yield item, source.state(), source.position()
    finally:
        source.close()


class PrefetcherPass(Pass):
    items: Generator[Any, None, None]

    def __init__(self, pipe: Prefetcher, state: State | None, context: PassContext):
        super().__init__(pipe, context)
        self.source = context.open(pipe.source, state["source"] if state is not None else None)
        self._behind = self.source.state()  # the input's state after the last item yielded
        self._position: Position | None = None
        self.count = 0
        self._switch = Pause()
        self.items = self._prefetch(pipe.buffer_size)

    def _prefetch(self, capacity: int) -> Generator[Any, None, None]:
        stats = self.context.stats
        source = self.source
        profiler = stats.thread_profiler(source.yielded) if stats is not None else None
        entries = _with_states(source, profiler)
        for item, behind, position in read_ahead(entries, capacity, "conveyor-prefetch", switch=self._switch):
            self._behind, self._position = behind, position
            self.count += 1
            yield item

    def set_paused(self, paused: bool) -> None:
        if paused:
            self._switch.pause()
        else:
            self._switch.resume()

    def state(self) -> State:
        return {"source": self._behind}

    def position(self) -> Position | None:
        return self._position

    def yielded(self) -> int:
        return self.count

    def inputs(self) -> list[Pass]:
        return [self.source]  # for walks: the thread that reads it closes it

    def close(self) -> None:
        # Once started, the thread owns the input's pass: closing it here could race it.
        unstarted = inspect.getgeneratorstate(self.items) == inspect.GEN_CREATED
        self.items.close()
        if unstarted:
            self.source.close()


class Prefetcher(IterDataPipe, Pausable):
    """Keeps up to ``buffer_size`` items read ahead by a background thread. The thread
    stops when the pass ends, breaks off, or fails."""

    per_item = True
    keeps_order = True
    runs_threads = True
    pass_type = PrefetcherPass
    state_fields = {"source": dict}

    _params = ("buffer_size",)

    def __init__(self, source: IterDataPipe, buffer_size: int = 10):
        check_int("buffer_size", buffer_size, 1)
        self.source = source
        self.buffer_size = buffer_size

    def __len__(self) -> int:
        return len(self.source)


@IterDataPipe.register_functional("prefetch", aliases={"n": "buffer_size"}, builds=Prefetcher)
def prefetch(self: IterDataPipe[T], buffer_size: int = 10) -> IterDataPipe[T]:
    """Reads up to ``buffer_size`` items ahead in a background thread.

    The thread stops when the pass ends, breaks off or fails; an error from upstream is
    raised where the items are read.

    Args:
        buffer_size: How many items may wait, read ahead (``n=`` is accepted for it too).

    Returns:
        A pipe of the same items.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> list(IterableWrapper(range(4)).map(lambda x: x + 1).prefetch(2))
        [1, 2, 3, 4]
    """
    return Prefetcher(self, buffer_size)
