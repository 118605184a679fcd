"""``prefetch``: read ahead of the consumer in a background thread.

Each item travels with its upstream's state right after it, so the op's state is the
state behind the last item it *yielded*, not the one it read last: a checkpoint taken
while the thread is ahead is still exact.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from conveyor.pipes.base import IterDataPipe, Position, check_int
from conveyor.read_ahead import read_ahead
from conveyor.state import (
    GraphState,
    StateCapturer,
    prepare_upstream,
    require_keys,
    validate_graph_state,
)


def _with_states(source: IterDataPipe, capture: Callable[[], GraphState]) -> Iterator[tuple[Any, Any, Any]]:
    for item in source:
        yield item, capture(), source.item_position()


@IterDataPipe.register_functional("prefetch", aliases={"n": "buffer_size"})
class Prefetcher(IterDataPipe):
    """Keeps up to ``buffer_size`` items read ahead by a background thread. The thread
    stops and is joined when the pass ends, breaks off, or fails."""

    per_item = True
    keeps_order = True

    _params = ("buffer_size",)

    def __init__(self, source: IterDataPipe, buffer_size: int = 10):
        check_int("buffer_size", buffer_size, 1)
        self.source = source
        self.buffer_size = buffer_size
        self._upstream: GraphState | None = None
        self._position: Position | None = None

    def __iter__(self) -> Iterator[Any]:
        resume = self._take_restored()
        prepare_upstream(self.source, resume, "upstream", repr(self))
        capture = StateCapturer(self.source)
        self._upstream, self._position = capture(), None
        entries = read_ahead(_with_states(self.source, capture), self.buffer_size, "conveyor-prefetch")
        for item, upstream, position in entries:
            self._upstream, self._position = upstream, position
            yield item

    def item_position(self) -> Position | None:
        return self._position

    def __len__(self) -> int:
        return len(self.source)

    def reset(self) -> None:
        super().reset()
        self._upstream, self._position = None, None

    def _current_state(self) -> dict[str, Any]:
        return {"upstream": self._upstream}

    def _check_state(self, state: Mapping[str, Any]) -> None:
        require_keys(state, {"upstream": (Mapping, type(None))}, repr(self))
        if state["upstream"] is not None:
            validate_graph_state(self.source, state["upstream"], f"{self!r} upstream snapshot")
