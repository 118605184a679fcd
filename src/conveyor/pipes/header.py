"""``header``: the first ``limit`` items."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from conveyor.pipes.base import IterDataPipe, check_int
from conveyor.state import require_keys, require_non_negative


@IterDataPipe.register_functional("header")
class Header(IterDataPipe):
    """Yields at most ``limit`` items, and never reads an item past them."""

    keeps_order = True

    _params = ("limit",)

    def __init__(self, source: IterDataPipe, limit: int = 10):
        check_int("limit", limit, 0)
        self.source = source
        self.limit = limit
        self._count = 0

    def __iter__(self) -> Iterator[Any]:
        resume = self._take_restored()
        self._count = resume["count"] if resume else 0
        if self._count >= self.limit:
            return
        for item in self.source:
            self._count += 1
            yield item
            if self._count >= self.limit:
                return

    def __len__(self) -> int:
        try:
            return min(self.limit, len(self.source))
        except TypeError:
            raise self._no_length(f"its input may hold fewer than {self.limit} items") from None

    def reset(self) -> None:
        super().reset()
        self._count = 0

    def _current_state(self) -> dict[str, Any]:
        return {"count": self._count}

    def _check_state(self, state: Mapping[str, Any]) -> None:
        require_keys(state, {"count": int}, repr(self))
        require_non_negative(state, "count", repr(self))
