"""``set_length``: declare the length of a pipe whose length cannot be derived."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from conveyor.pipes.base import IterDataPipe, check_int


@IterDataPipe.register_functional("set_length", aliases={"n": "length"})
class LengthSetter(IterDataPipe):
    """Passes items through; ``len()`` returns ``length`` (the items are not counted)."""

    per_item = True
    keeps_order = True

    _params = ("length",)

    def __init__(self, source: IterDataPipe, length: int):
        check_int("length", length, 0)
        self.source = source
        self.length = length

    def __iter__(self) -> Iterator[Any]:
        return iter(self.source)

    def __len__(self) -> int:
        return self.length
