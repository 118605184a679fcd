"""``batch`` and ``unbatch``: group items into lists and split them again."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from conveyor.pipes.base import IterDataPipe, check_int
from conveyor.pipes.flatmap import Expander
from conveyor.pipes.passes import PassContext, State, ThroughPass


class BatcherPass(ThroughPass):
    """Holds nothing between batches: a batch leaves whole, so the state after it is the
    input's state after its last item."""

    def __init__(self, pipe: Batcher, state: State | None, context: PassContext):
        super().__init__(pipe, state, context)
        self.count = 0
        self.items = self._batch(pipe.batch_size, pipe.drop_last)

    def _batch(self, size: int, drop_last: bool) -> Iterator[list[Any]]:
        batch: list[Any] = []
        for item in self.source:
            batch.append(item)
            if len(batch) == size:
                self.count += 1
                yield batch
                batch = []
        if batch and not drop_last:
            self.count += 1
            yield batch

    def yielded(self) -> int:
        return self.count


@IterDataPipe.register_functional("batch", aliases={"n": "batch_size"})
class Batcher(IterDataPipe):
    """Yields lists of ``batch_size`` items; the last one may be shorter unless ``drop_last``."""

    keeps_order = True
    pass_type = BatcherPass
    state_fields = {"source": dict}

    _params = ("batch_size", "drop_last")

    def __init__(self, source: IterDataPipe, batch_size: int, drop_last: bool = False):
        check_int("batch_size", batch_size, 1)
        self.source = source
        self.batch_size = batch_size
        self.drop_last = drop_last

    def __len__(self) -> int:
        length = len(self.source)
        return length // self.batch_size if self.drop_last else -(-length // self.batch_size)


@IterDataPipe.register_functional("unbatch")
class Unbatcher(Expander):
    """Yields the elements of each batch; ``unbatch_level`` > 1 flattens nested batches."""

    _params = ("unbatch_level",)

    def __init__(self, source: IterDataPipe, unbatch_level: int = 1):
        check_int("unbatch_level", unbatch_level, 1)
        super().__init__(source)
        self.unbatch_level = unbatch_level

    def expand(self, item: Any) -> Iterable[Any]:
        return _flatten(item, self.unbatch_level, self)


def _flatten(batch: Any, level: int, pipe: IterDataPipe) -> Iterator[Any]:
    if not isinstance(batch, (list, tuple)):
        raise TypeError(f"{pipe!r} expected a list or tuple to unbatch, got {type(batch).__name__}")
    if level == 1:
        yield from batch
    else:
        for inner in batch:
            yield from _flatten(inner, level - 1, pipe)
