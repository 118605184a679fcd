"""``IterableBatches``: an ``IterableDataset``'s batches as torch's ``DataLoader`` makes them,
for ``conveyor.DataLoader``.

A batch is the next ``batch_size`` items of the dataset's iterator (fewer at its end; none
kept when ``drop_last`` and short), collated; without batching (``batch_size=None``), each
item converted. An item the iterator could not make (a
:class:`~conveyor.pipes.torch.batch_errors.FailedBatch` from
:class:`~conveyor.pipes.torch.torch_iterable.TorchIterableDataset`) is the batch's
result: the items read before it in that batch are dropped and the error takes the
batch's place, and the next batch begins with the item after it, as torch's fetcher
does. An error ``collate_fn`` raises takes the batch's place too.

A batch leaves whole, so the pass holds nothing between batches: its state is its
input's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from conveyor.core.base import IterDataPipe
from conveyor.core.passes import PassContext, State, ThroughPass
from conveyor.core.validation import check_int
from conveyor.pipes.batch import batch_count
from conveyor.pipes.torch.batch_errors import FailedBatch


class IterableBatchesPass(ThroughPass):
    def __init__(self, pipe: IterableBatches, state: State | None, context: PassContext):
        super().__init__(pipe, state, context)
        self.count = 0
        self.items = self._single(pipe.collate_fn) if pipe.batch_size is None else self._batches(pipe)

    def _single(self, convert: Callable[[Any], Any]) -> Iterator[Any]:
        for item in self.source:
            self.count += 1
            yield item if item.__class__ is FailedBatch else _collated(convert, item)
            del item

    def _batches(self, pipe: IterableBatches) -> Iterator[Any]:
        size, drop_last, collate = pipe.batch_size, pipe.drop_last, pipe.collate_fn
        assert size is not None
        source = iter(self.source)
        while True:
            batch: list[Any] = []
            failed: FailedBatch | None = None
            item: Any = None
            for item in source:
                if item.__class__ is FailedBatch:
                    failed = item
                    break
                batch.append(item)
                if len(batch) == size:
                    break
            del item  # not held while the batch is out
            if failed is not None:
                self.count += 1
                yield failed
                del failed
                continue
            if not batch or (drop_last and len(batch) < size):
                return
            self.count += 1
            yield _collated(collate, batch)
            if len(batch) < size:
                return
            del batch

    def yielded(self) -> int:
        return self.count


def _collated(collate: Callable[[Any], Any], batch: Any) -> Any:
    try:
        return collate(batch)
    except Exception as error:  # the batch's error, in its place
        return FailedBatch(error)


class IterableBatches(IterDataPipe):
    """An ``IterableDataset``'s batches, collated as torch's ``DataLoader`` makes them, errors
    in their batch's place (see the module).

    Args:
        source: The dataset's items (a ``TorchIterableDataset`` with ``errors_in_place``).
        batch_size: Items per batch; None: each item alone, through ``collate_fn``.
        drop_last: Leave out the last batch when it is short.
        collate_fn: Makes a batch of a list of items (or converts one item).
    """

    keeps_order = True
    pass_type = IterableBatchesPass
    state_fields = {"source": dict}
    _params = ("batch_size", "drop_last", "collate_fn")

    def __init__(
        self, source: IterDataPipe, batch_size: int | None, drop_last: bool, collate_fn: Callable[[Any], Any]
    ) -> None:
        check_int("batch_size", batch_size, 1, allow_none=True)
        self.source = source
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.collate_fn = collate_fn

    def __len__(self) -> int:
        length = len(self.source)
        if self.batch_size is None:
            return length
        return batch_count(length, self.batch_size, self.drop_last)
