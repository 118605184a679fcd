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
from typing import Any

from conveyor.errors import StateError
from conveyor.pipes.base import IterDataPipe, Position, close_iterator
from conveyor.pipes.combine import check_inputs
from conveyor.state import (
    GraphState,
    StateCapturer,
    load_graph_state,
    require_keys,
    require_non_negative,
    reset_graph,
    validate_graph_state,
)


@IterDataPipe.register_functional("mux")
class Multiplexer(IterDataPipe):
    """Rounds of one item from each input, until the first input ends (its round is dropped)."""

    def __init__(self, *sources: IterDataPipe):
        self.sources = check_inputs("mux", sources)
        self._before: list[GraphState] | None = None  # the inputs' states before this round
        self._taken = 0  # items of this round yielded
        self._position: Position | None = None

    def __iter__(self) -> Iterator[Any]:
        resume = self._take_restored()
        where = repr(self)
        skip = 0
        for index, source in enumerate(self.sources):
            if resume is None:
                reset_graph(source)
            elif resume["before"] is not None:
                load_graph_state(source, resume["before"][index], where)
        if resume is not None and resume["before"] is not None:
            skip = resume["taken"]
        captures = [StateCapturer(source) for source in self.sources]
        iterators = [iter(source) for source in self.sources]
        self._before, self._taken = None, 0
        try:
            while True:
                before = [capture() for capture in captures]
                round_items: list[tuple[Any, Position | None]] = []
                for source, iterator in zip(self.sources, iterators, strict=True):
                    try:
                        item = next(iterator)
                    except StopIteration:
                        return
                    round_items.append((item, source.item_position()))
                self._before = before
                for taken in range(skip, len(round_items)):
                    item, self._position = round_items[taken]
                    self._taken = taken + 1
                    yield item
                skip = 0
                self._before, self._taken = None, 0
        finally:
            for iterator in iterators:
                close_iterator(iterator)

    def item_position(self) -> Position | None:
        return self._position

    def __len__(self) -> int:
        return min(len(source) for source in self.sources) * len(self.sources)

    def reset(self) -> None:
        super().reset()
        self._before, self._taken, self._position = None, 0, None

    def _current_state(self) -> dict[str, Any]:
        # After a round's last item the inputs' own states say where the next one starts.
        whole = self._before is None or self._taken == len(self.sources)
        return {"before": None if whole else self._before, "taken": 0 if whole else self._taken}

    def _check_state(self, state: Mapping[str, Any]) -> None:
        require_keys(state, {"before": (list, type(None)), "taken": int}, repr(self))
        require_non_negative(state, "taken", repr(self))
        before = state["before"]
        if before is None:
            if state["taken"] != 0:
                raise StateError(f"{self!r}: 'taken' must be 0 between rounds, got {state['taken']}")
            return
        if len(before) != len(self.sources):
            raise StateError(f"{self!r}: 'before' must hold {len(self.sources)} input states, got {len(before)}")
        if not 0 < state["taken"] < len(self.sources):
            raise StateError(f"{self!r}: 'taken' must be in [1, {len(self.sources) - 1}], got {state['taken']}")
        for index, (source, source_state) in enumerate(zip(self.sources, before, strict=True)):
            validate_graph_state(source, source_state, f"{self!r}, input {index}")


@IterDataPipe.register_functional("mux_longest")
class MultiplexerLongest(IterDataPipe):
    """One item from each input in turn, skipping inputs that ended, until all end."""

    def __init__(self, *sources: IterDataPipe):
        self.sources = check_inputs("mux_longest", sources)
        self._next = 0
        self._last = 0
        self._ended = [False] * len(self.sources)

    def __iter__(self) -> Iterator[Any]:
        resume = self._take_restored()
        count = len(self.sources)
        self._next = resume["next"] if resume else 0
        self._ended = list(resume["ended"]) if resume else [False] * count
        iterators = [iter(source) for source in self.sources]
        try:
            while not all(self._ended):
                index = self._next
                self._next = (index + 1) % count
                if self._ended[index]:
                    continue
                try:
                    item = next(iterators[index])
                except StopIteration:
                    self._ended[index] = True
                    continue
                self._last = index
                yield item
        finally:
            for iterator in iterators:
                close_iterator(iterator)

    def item_position(self) -> Position | None:
        return self.sources[self._last].item_position()

    def __len__(self) -> int:
        return sum(len(source) for source in self.sources)

    def reset(self) -> None:
        super().reset()
        self._next = 0
        self._ended = [False] * len(self.sources)

    def _current_state(self) -> dict[str, Any]:
        return {"next": self._next, "ended": list(self._ended)}

    def _check_state(self, state: Mapping[str, Any]) -> None:
        require_keys(state, {"next": int, "ended": list}, repr(self))
        require_non_negative(state, "next", repr(self))
        if state["next"] >= len(self.sources):
            raise StateError(f"'next' must be below {len(self.sources)}, got {state['next']}")
        ended = state["ended"]
        if len(ended) != len(self.sources) or not all(isinstance(e, bool) for e in ended):
            raise StateError(f"'ended' must be {len(self.sources)} bools, got {ended!r}")
