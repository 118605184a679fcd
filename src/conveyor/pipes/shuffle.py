"""``shuffle``: a windowed shuffle that resumes by replaying one window.

The op reads ``buffer_size`` items, yields them in a random order, and repeats. Each
window's order is a pure function of ``(seed, epoch, op, pass, window)`` (or, after the
sharding point, of the window's first item position), so no generator state is saved;
the state is the upstream's state before the window plus how many of its items were
yielded, and resuming re-reads at most one window.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from typing import Any

from conveyor.errors import StateError
from conveyor.pipes.base import IterDataPipe, PassNumbering, Position, RandomOp, check_int
from conveyor.state import (
    GraphState,
    StateCapturer,
    prepare_upstream,
    require_keys,
    require_non_negative,
    validate_graph_state,
)


@IterDataPipe.register_functional("shuffle")
class Shuffler(PassNumbering, IterDataPipe, RandomOp):
    """Shuffles within windows of ``buffer_size`` items. ``set_shuffle(False)`` (or the
    ``Shuffle(False)`` adapter) turns it into a pass-through.
    """

    _params = ("buffer_size", "enabled")

    def __init__(self, source: IterDataPipe, buffer_size: int = 10000):
        check_int("buffer_size", buffer_size, 1)
        self.source = source
        self.buffer_size = buffer_size
        self.enabled = True
        self._passes = 0
        self._pass = 0
        self._window = 0
        self._taken = 0
        self._before: GraphState | None = None
        self._position: Position | None = None

    def set_shuffle(self, enabled: bool = True) -> Shuffler:
        self.enabled = bool(enabled)
        return self

    def __iter__(self) -> Iterator[Any]:
        resume = self._take_restored()
        if not self.enabled:
            self._pass, self._window, self._taken, self._before = self._passes, 0, 0, None
            yield from self.source
            return
        prepare_upstream(self.source, resume, "before", repr(self))
        if resume is None:
            self._pass, window_index, skip = self._passes, 0, 0
        else:
            self._pass, window_index = resume["pass"], resume["window"]
            skip = resume["taken"] if resume["before"] is not None else 0
        self._passes = self._pass + 1
        randomness = self.randomness()
        keyed = randomness.keyed_by_position
        capture = StateCapturer(self.source)
        upstream = iter(self.source)
        self._window, self._taken, self._before = window_index, 0, None
        while True:
            before = capture()
            window: list[Any] = []
            positions: list[Position | None] = []
            for item in itertools.islice(upstream, self.buffer_size):
                window.append(item)
                if keyed:
                    positions.append(self.source.item_position())
            if not window:
                break
            counter = (*positions[0], window_index) if keyed and positions[0] else (self._pass, window_index)
            order = randomness.generator(*counter).permutation(len(window))
            self._window, self._before = window_index, before
            for taken in range(skip, len(window)):
                chosen = int(order[taken])
                self._taken = taken + 1
                self._position = positions[chosen] if keyed else None
                yield window[chosen]
            skip = 0
            window_index += 1
        self._before, self._taken = None, 0

    def item_position(self) -> Position | None:
        return self._position if self.enabled else self.source.item_position()

    def __len__(self) -> int:
        return len(self.source)

    def reset(self) -> None:
        super().reset()
        self._pass, self._window, self._taken, self._before = self._passes, 0, 0, None
        self._position = None

    def _current_state(self) -> dict[str, Any]:
        return {"pass": self._pass, "window": self._window, "taken": self._taken, "before": self._before}

    def _check_state(self, state: Mapping[str, Any]) -> None:
        where = repr(self)
        require_keys(
            state,
            {"pass": int, "window": int, "taken": int, "before": (Mapping, type(None))},
            where,
        )
        for key in ("pass", "window", "taken"):
            require_non_negative(state, key, where)
        if state["taken"] > self.buffer_size:
            raise StateError(f"{where}: 'taken' {state['taken']} exceeds buffer_size")
        if state["before"] is not None:
            validate_graph_state(self.source, state["before"], f"{where} upstream snapshot")
