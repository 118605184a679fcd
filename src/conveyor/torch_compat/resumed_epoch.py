"""``ResumedEpoch``: how ``conveyor.DataLoader`` hands out a resumed epoch."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


class ResumedEpoch(Iterator[Any]):
    """The batches of a resumed epoch; when its state was taken after the epoch's last
    batch (nothing is left), the next epoch's, as the uninterrupted loader's next
    ``iter()`` would give: trainers call ``iter()`` once per epoch. A first batch that
    raises (its fetch failed) counts as one: the epoch then ends where it ends."""

    def __init__(self, batches: Iterator[Any], next_epoch: Callable[[], Iterator[Any]]) -> None:
        self._batches = batches
        self._next_epoch: Callable[[], Iterator[Any]] | None = next_epoch  # until the first batch

    def __iter__(self) -> ResumedEpoch:
        return self

    def __next__(self) -> Any:
        try:
            batch = next(self._batches)
        except StopIteration:
            if self._next_epoch is None:
                raise
            self._batches, self._next_epoch = self._next_epoch(), None
            return next(self._batches)
        except BaseException:  # a batch's error: the epoch goes on, so its end is its own
            self._next_epoch = None
            raise
        self._next_epoch = None
        return batch
