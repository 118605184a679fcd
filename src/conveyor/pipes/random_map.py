"""``random_map``: a map whose function also gets a numpy ``Generator``.

After the sharding point the generator is keyed by the item's position there, so the
output does not depend on how many workers or ranks share the work. Before it, the
generator is keyed by the op's own item counter on the shared stream.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from conveyor.pipes.base import IterDataPipe, PassCounting, RandomOp, note_error


@IterDataPipe.register_functional("random_map")
class RandomMapper(PassCounting, IterDataPipe, RandomOp):
    """Yields ``fn(item, rng)`` where ``rng`` is a ``numpy.random.Generator`` for this item."""

    per_item = True
    keeps_order = True

    _params = ("fn",)

    def __init__(self, source: IterDataPipe, fn: Callable[[Any, np.random.Generator], Any]):
        if not callable(fn):
            raise TypeError(f"random_map() needs a callable, got {type(fn).__name__}")
        self.source = source
        self.fn = fn
        self._passes = 0
        self._pass = 0
        self._count = 0

    def __iter__(self) -> Iterator[Any]:
        resume = self._take_restored()
        self._pass = resume["pass"] if resume else self._passes
        self._count = resume["count"] if resume else 0
        self._passes = self._pass + 1
        randomness, fn = self.randomness(), self.fn
        for item in self.source:
            position = self.source.item_position() if randomness.keyed_by_position else None
            counter = position if position is not None else (self._pass, self._count)
            self._count += 1
            try:
                result = fn(item, randomness.generator(*counter))
            except Exception as err:
                note_error(err, self)
                raise
            yield result

    def __len__(self) -> int:
        return len(self.source)
