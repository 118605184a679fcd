"""Ops that read several inputs one after another or side by side: ``concat`` and ``zip``
(``mux`` has its own module)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from conveyor.errors import StateError
from conveyor.pipes.base import IterDataPipe, Position
from conveyor.state import require_keys


def check_inputs(name: str, sources: tuple[Any, ...]) -> tuple[IterDataPipe, ...]:
    if not sources:
        raise ValueError(f"{name}() needs at least one input pipe")
    for source in sources:
        if not isinstance(source, IterDataPipe):
            raise TypeError(f"{name}() takes IterDataPipes, got {type(source).__name__}")
    return tuple(sources)


@IterDataPipe.register_functional("concat")
class Concater(IterDataPipe):
    """All items of the first input, then of the second, and so on."""

    def __init__(self, *sources: IterDataPipe):
        self.sources = check_inputs("concat", sources)
        self._current = 0

    def __iter__(self) -> Iterator[Any]:
        resume = self._take_restored()
        start = resume["current"] if resume else 0
        for index in range(start, len(self.sources)):
            self._current = index
            yield from self.sources[index]
        self._current = len(self.sources)

    def __len__(self) -> int:
        return sum(len(source) for source in self.sources)

    def item_position(self) -> Position | None:
        return self.sources[min(self._current, len(self.sources) - 1)].item_position()

    def reset(self) -> None:
        super().reset()
        self._current = 0

    def _current_state(self) -> dict[str, Any]:
        return {"current": self._current}

    def _check_state(self, state: Mapping[str, Any]) -> None:
        require_keys(state, {"current": int}, repr(self))
        if not 0 <= state["current"] <= len(self.sources):
            raise StateError(f"'current' must be in [0, {len(self.sources)}], got {state['current']}")


@IterDataPipe.register_functional("zip")
class Zipper(IterDataPipe):
    """Tuples of one item from each input, until the shortest input ends."""

    def __init__(self, *sources: IterDataPipe):
        self.sources = check_inputs("zip", sources)

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        yield from zip(*self.sources)  # noqa: B905 - zip stops at the shortest, by design

    def __len__(self) -> int:
        return min(len(source) for source in self.sources)
