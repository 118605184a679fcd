"""``mux`` and ``mux_longest``: one item from each input in turn.

``mux`` is torchdata's: whole rounds of one item per input, ending at the first input
that ends; that input's round is dropped, so every input contributes the same number of
items (``len`` is the shortest input's times the number of inputs). Knowing a round is
whole means reading all of it before yielding any, so a state saved inside a round keeps
the inputs' states from before it and how many of its items were taken; a resume reads
that round again and skips them. ``mux_longest`` skips inputs that ended and goes on
until all have.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

from conveyor.core.base import IterDataPipe
from conveyor.core.passes import Pass, PassContext, Position, State
from conveyor.errors import StateError
from conveyor.pipes.combine import check_inputs

T = TypeVar("T")


class MultiplexerPass(Pass):
    """Between rounds the state holds the inputs' live states and ``taken`` 0; inside a
    round, their states from before it and how many of its items were yielded."""

    def __init__(self, pipe: Multiplexer, state: State | None, context: PassContext):
        super().__init__(pipe, context)
        saved = state["sources"] if state is not None else [None] * len(pipe.sources)
        self._skip = state["taken"] if state is not None else 0
        self.sources = [context.open(p, s) for p, s in zip(pipe.sources, saved, strict=True)]
        # The inputs' states before this round, and its items yielded; until it reads, a
        # resumed pass stands where its state says (inside a round).
        self._before: list[State] | None = state["sources"] if state is not None and self._skip else None
        self.taken = self._skip
        self._position: Position | None = None
        self.count = 0
        self.items = self._mux()

    def _mux(self) -> Iterator[Any]:
        sources, skip = self.sources, self._skip
        while True:
            before = [source.state() for source in sources]
            round_items: list[tuple[Any, Position | None]] = []
            for source in sources:
                try:
                    item = next(source.items)
                except StopIteration:
                    return
                round_items.append((item, source.position()))
            self._before = before
            for taken in range(skip, len(round_items)):
                item, self._position = round_items[taken]
                self.taken = taken + 1
                self.count += 1
                yield item
            skip = 0
            self._before, self.taken = None, 0

    def state(self) -> State:
        # After a round's last item the inputs' own states say where the next one starts.
        if self._before is None or self.taken == len(self.sources):
            return {"taken": 0, "sources": [source.state() for source in self.sources]}
        return {"taken": self.taken, "sources": self._before}

    def position(self) -> Position | None:
        return self._position

    def yielded(self) -> int:
        return self.count

    def inputs(self) -> list[Pass]:
        return list(self.sources)


class Multiplexer(IterDataPipe):
    """Rounds of one item from each input, until the first input ends (its round is dropped)."""

    pass_type = MultiplexerPass
    replays_input = True
    state_fields = {"taken": int, "sources": list}

    def __init__(self, *sources: IterDataPipe):
        self.sources = check_inputs("mux", sources)

    def __len__(self) -> int:
        return min(len(source) for source in self.sources) * len(self.sources)

    def check_own_state(self, state: Mapping[str, Any], where: str) -> None:
        if state["taken"] >= len(self.sources):
            raise StateError(f"{where}: 'taken' must be below {len(self.sources)}, got {state['taken']}")


@IterDataPipe.register_functional("mux", builds=Multiplexer)
def mux(self: IterDataPipe[T], *others: IterDataPipe[T]) -> IterDataPipe[T]:
    """Yields one item from each input in turn, until the first input that ends.

    The round in which an input ends is dropped whole (``mux_longest`` goes on).

    Args:
        *others: The pipes interleaved with this one.

    Returns:
        A pipe of the inputs' items, interleaved.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> list(IterableWrapper([0, 1, 2]).mux(IterableWrapper([10, 11])))
        [0, 10, 1, 11]
    """
    return Multiplexer(self, *others)


class MultiplexerLongestPass(Pass):
    def __init__(self, pipe: MultiplexerLongest, state: State | None, context: PassContext):
        super().__init__(pipe, context)
        count = len(pipe.sources)
        saved = state["sources"] if state is not None else [None] * count
        self.sources = [context.open(p, s) for p, s in zip(pipe.sources, saved, strict=True)]
        self.next = state["next"] if state is not None else 0
        self.ended = list(state["ended"]) if state is not None else [False] * count
        self._last = 0
        self.count = 0
        self.items = self._mux()

    def _mux(self) -> Iterator[Any]:
        sources, ended, count = self.sources, self.ended, len(self.sources)
        while not all(ended):
            index = self.next
            self.next = (index + 1) % count
            if ended[index]:
                continue
            try:
                item = next(sources[index].items)
            except StopIteration:
                ended[index] = True
                continue
            self._last = index
            self.count += 1
            yield item

    def state(self) -> State:
        return {"next": self.next, "ended": list(self.ended), "sources": [source.state() for source in self.sources]}

    def position(self) -> Position | None:
        return self.sources[self._last].position()

    def yielded(self) -> int:
        return self.count

    def inputs(self) -> list[Pass]:
        return list(self.sources)


class MultiplexerLongest(IterDataPipe):
    """One item from each input in turn, skipping inputs that ended, until all end."""

    pass_type = MultiplexerLongestPass
    state_fields = {"next": int, "ended": list, "sources": list}

    def __init__(self, *sources: IterDataPipe):
        self.sources = check_inputs("mux_longest", sources)

    def __len__(self) -> int:
        return sum(len(source) for source in self.sources)

    def check_own_state(self, state: Mapping[str, Any], where: str) -> None:
        if state["next"] >= len(self.sources):
            raise StateError(f"{where}: 'next' must be below {len(self.sources)}, got {state['next']}")
        ended = state["ended"]
        if len(ended) != len(self.sources) or not all(type(e) is bool for e in ended):
            raise StateError(f"{where}: 'ended' must be {len(self.sources)} bools")


@IterDataPipe.register_functional("mux_longest", builds=MultiplexerLongest)
def mux_longest(self: IterDataPipe[T], *others: IterDataPipe[T]) -> IterDataPipe[T]:
    """Yields one item from each input in turn, passing over inputs that ended, until all end.

    Args:
        *others: The pipes interleaved with this one.

    Returns:
        A pipe of every input's items, interleaved.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> list(IterableWrapper([0, 1, 2]).mux_longest(IterableWrapper([10])))
        [0, 10, 1, 2]
    """
    return MultiplexerLongest(self, *others)
