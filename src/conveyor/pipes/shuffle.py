"""``shuffle``: a windowed shuffle that resumes by replaying one window.

The op reads ``buffer_size`` items, yields them in a random order, and repeats. Each
window's order is a pure function of ``(seed, epoch, op, cycle rounds, window)`` (or,
after the sharding point, of the window's first item position), so no generator state is
saved: the state is the input's state before the window, its index, and how many of its
items were yielded; resuming re-reads at most one window.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

from conveyor.core.base import IterDataPipe
from conveyor.core.op_roles import RandomOp
from conveyor.core.passes import Pass, PassContext, Position, State
from conveyor.core.validation import check_int
from conveyor.errors import StateError

T = TypeVar("T")


class ShufflerPass(Pass):
    """``window``: the index of the window being handed out; ``taken``: its items yielded;
    ``before``: the input's state before it (None before the first window and at the end)."""

    def __init__(self, pipe: Shuffler, state: State | None, context: PassContext):
        super().__init__(pipe, context)
        self.source = context.open(pipe.source, state["source"] if state is not None else None)
        self.window = state["window"] if state is not None else 0
        self._skip = state["taken"] if state is not None else 0
        # Until it reads, a resumed pass stands where its state says (inside a window).
        self.taken = self._skip
        self._size = -1  # items in the window being handed out (-1: not read yet)
        self.before: State | None = state["source"] if state is not None and self._skip else None
        self._position: Position | None = None
        self._enabled = pipe.enabled
        self.count = 0
        self.items = self._shuffle(pipe, pipe.randomness()) if pipe.enabled else self.source.items

    def _shuffle(self, pipe: Shuffler, randomness: Any) -> Iterator[Any]:
        source, upstream, size = self.source, self.source.items, pipe.buffer_size
        keyed, rounds = randomness.keyed_by_position, self.context.rounds
        window_index, skip = self.window, self._skip
        while True:
            before = source.state()
            window: list[Any] = []
            positions: list[Position | None] = []
            for item in itertools.islice(upstream, size):
                window.append(item)
                if keyed:
                    positions.append(source.position())
            if not window:
                break
            first = positions[0] if keyed else None
            counter = (*rounds, *first, window_index) if first else (*rounds, window_index)
            order = randomness.generator(*counter).permutation(len(window))
            self.window, self.before, self._size = window_index, before, len(window)
            for taken in range(skip, len(window)):
                chosen = int(order[taken])
                self.taken = taken + 1
                self._position = positions[chosen] if keyed else None
                self.count += 1
                yield window[chosen]
            skip = 0
            window_index += 1
        self.window, self.before, self.taken = window_index, None, 0

    def state(self) -> State:
        if self.before is None or self.taken == self._size:
            # Between windows: the next one starts where the input stands.
            following = self.window + 1 if self.before is not None else self.window
            return {"window": following, "taken": 0, "source": self.source.state()}
        return {"window": self.window, "taken": self.taken, "source": self.before}

    def position(self) -> Position | None:
        return self._position if self._enabled else self.source.position()

    def yielded(self) -> int:
        return self.count if self._enabled else self.source.yielded()

    def inputs(self) -> list[Pass]:
        return [self.source]


class Shuffler(IterDataPipe, RandomOp):
    """Shuffles within windows of ``buffer_size`` items. ``set_shuffle(False)`` (or the
    ``Shuffle(False)`` adapter) turns it into a pass-through.
    """

    pass_type = ShufflerPass
    replays_input = True
    state_fields = {"window": int, "taken": int, "source": dict}

    _params = ("buffer_size", "enabled")

    def __init__(self, source: IterDataPipe, buffer_size: int = 10000):
        check_int("buffer_size", buffer_size, 1)
        self.source = source
        self.buffer_size = buffer_size
        self.enabled = True

    def set_shuffle(self, enabled: bool = True) -> Shuffler:
        self.enabled = bool(enabled)
        return self

    def __len__(self) -> int:
        return len(self.source)

    def check_own_state(self, state: Mapping[str, Any], where: str) -> None:
        if state["taken"] > self.buffer_size:
            raise StateError(f"{where}: 'taken' {state['taken']} exceeds buffer_size {self.buffer_size}")
        if not self.enabled and (state["window"] or state["taken"]):
            raise StateError(f"{where}: this shuffle is disabled, so its state has no window")


@IterDataPipe.register_functional("shuffle", builds=Shuffler)
def shuffle(self: IterDataPipe[T], buffer_size: int = 10000) -> IterDataPipe[T]:
    """Shuffles the items within a window of ``buffer_size``.

    Each epoch draws a new order from the loader's seeds (``DataLoader2.seed``), and a
    resume draws the same. ``set_shuffle(False)`` on the result, or the ``Shuffle(False)``
    adapter, makes it pass the items in order.

    Args:
        buffer_size: How many items the window holds: an item moves at most that far.

    Returns:
        A pipe of the same items in a shuffled order.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> sorted(IterableWrapper(range(5)).shuffle(buffer_size=3))
        [0, 1, 2, 3, 4]
    """
    return Shuffler(self, buffer_size)
