"""``enumerate``: pair each item with its index."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from conveyor.pipes.base import CountingPipe, IterDataPipe


@IterDataPipe.register_functional("enumerate")
class Enumerator(CountingPipe):
    """Yields ``(index, item)``, the index counting from ``starting_index`` each pass."""

    keeps_order = True

    _params = ("starting_index",)

    def __init__(self, source: IterDataPipe, starting_index: int = 0):
        self.source = source
        self.starting_index = starting_index

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        self._start_count()
        for item in self.source:
            index = self.starting_index + self._count
            self._count += 1
            yield index, item

    def __len__(self) -> int:
        return len(self.source)
