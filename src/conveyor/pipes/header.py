"""``header``: the first ``limit`` items."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from conveyor.pipes.base import CountingPipe, IterDataPipe, check_int


@IterDataPipe.register_functional("header", aliases={"n": "limit"})
class Header(CountingPipe):
    """Yields at most ``limit`` items, and never reads an item past them."""

    keeps_order = True

    _params = ("limit",)

    def __init__(self, source: IterDataPipe, limit: int = 10):
        check_int("limit", limit, 0)
        self.source = source
        self.limit = limit

    def __iter__(self) -> Iterator[Any]:
        if self._start_count() >= self.limit:
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
