"""Ops that turn one upstream item into several, and ``flatmap``.

An expanding op resumes by replay, never by saving items: its state is its upstream's
graph state from just before the item being expanded, plus how many parts of it were
yielded. Resuming re-reads that one item and skips the parts already yielded.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from conveyor.errors import StateError
from conveyor.pipes.base import IterDataPipe, Position, note_error
from conveyor.state import (
    GraphState,
    StateCapturer,
    prepare_upstream,
    require_keys,
    require_non_negative,
    validate_graph_state,
)


class Expander(IterDataPipe):
    """Base for expanding ops; subclasses implement :meth:`expand`."""

    per_item = True
    keeps_order = True

    def __init__(self, source: IterDataPipe):
        self.source = source
        self._before: GraphState | None = None
        self._offset = 0
        self._position: Position | None = None
        self._parent: Position | None = None  # position of the item being expanded

    def expand(self, item: Any) -> Iterable[Any]:
        raise NotImplementedError

    def __iter__(self) -> Iterator[Any]:
        resume = self._take_restored()
        prepare_upstream(self.source, resume, "before", repr(self))
        skip = resume["offset"] if resume is not None and resume["before"] is not None else 0
        # Resumed with another sharding, the re-read item may belong to another worker:
        # skip only into the very item that was being expanded.
        resumed_parent = tuple(resume["item"]) if skip and resume["item"] is not None else None
        capture = StateCapturer(self.source)
        self._before, self._offset, self._parent = None, 0, None
        upstream = iter(self.source)
        while True:
            before = capture()
            try:
                item = next(upstream)
            except StopIteration:
                break
            parent = self.source.item_position()
            if resumed_parent is not None and parent != resumed_parent:
                skip = 0
            resumed_parent = None
            self._before, self._offset, self._parent = before, skip, parent
            try:
                parts = iter(self.expand(item))
            except Exception as err:
                note_error(err, self)
                raise
            for offset, part in enumerate(itertools.islice(parts, skip, None), start=skip):
                self._offset = offset + 1
                self._position = None if parent is None else (*parent, offset)
                yield part
            skip = 0
        self._before, self._offset = None, 0

    def item_position(self) -> Position | None:
        return self._position

    def reset(self) -> None:
        super().reset()
        self._before, self._offset, self._position, self._parent = None, 0, None, None

    def _current_state(self) -> dict[str, Any]:
        parent = list(self._parent) if self._parent is not None and self._before is not None else None
        return {"before": self._before, "offset": self._offset, "item": parent}

    def _check_state(self, state: Mapping[str, Any]) -> None:
        require_keys(state, {"before": (Mapping, type(None)), "offset": int, "item": (list, type(None))}, repr(self))
        if state["item"] is not None and not all(isinstance(i, int) and not isinstance(i, bool) for i in state["item"]):
            raise StateError(f"{self!r}: 'item' must be a list of ints")
        require_non_negative(state, "offset", repr(self))
        if state["before"] is not None:
            validate_graph_state(self.source, state["before"], f"{self!r} upstream snapshot")


@IterDataPipe.register_functional("flatmap")
class FlatMapper(Expander):
    """Yields every element of ``fn(item)`` (of ``item`` itself when ``fn`` is None)."""

    _params = ("fn",)

    def __init__(self, source: IterDataPipe, fn: Callable[[Any], Iterable[Any]] | None = None):
        if fn is not None and not callable(fn):
            raise TypeError(f"flatmap() needs a callable or None, got {type(fn).__name__}")
        super().__init__(source)
        self.fn = fn

    def expand(self, item: Any) -> Iterable[Any]:
        return item if self.fn is None else self.fn(item)
