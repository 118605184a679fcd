"""``enumerate``: pair each item with its index."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from conveyor.pipes.base import IterDataPipe
from conveyor.state import require_keys, require_non_negative


@IterDataPipe.register_functional("enumerate")
class Enumerator(IterDataPipe):
    """Yields ``(index, item)``, the index counting from ``starting_index`` each pass."""

    keeps_order = True

    _params = ("starting_index",)

    def __init__(self, source: IterDataPipe, starting_index: int = 0):
        self.source = source
        self.starting_index = starting_index
        self._count = 0

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        resume = self._take_restored()
        self._count = resume["count"] if resume else 0
        for item in self.source:
            index = self.starting_index + self._count
            self._count += 1
            yield index, item

    def __len__(self) -> int:
        return len(self.source)

    def reset(self) -> None:
        super().reset()
        self._count = 0

    def _current_state(self) -> dict[str, Any]:
        return {"count": self._count}

    def _check_state(self, state: Mapping[str, Any]) -> None:
        require_keys(state, {"count": int}, repr(self))
        require_non_negative(state, "count", repr(self))
