"""``filter``: keep the items for which a predicate holds."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from conveyor.pipes import columns
from conveyor.pipes.base import IterDataPipe, note_error


@IterDataPipe.register_functional("filter")
class Filter(IterDataPipe):
    """Yields the items for which ``filter_fn(item)`` (or of its ``input_col``) is true."""

    per_item = True
    keeps_order = True

    _params = ("filter_fn", "input_col")

    def __init__(
        self,
        source: IterDataPipe,
        filter_fn: Callable[..., Any],
        input_col: columns.Column = None,
    ):
        if not callable(filter_fn):
            raise TypeError(f"filter() needs a callable, got {type(filter_fn).__name__}")
        self.source = source
        self.filter_fn = filter_fn
        self.input_col = input_col

    def __iter__(self) -> Iterator[Any]:
        fn, input_col = self.filter_fn, self.input_col
        for item in self.source:
            try:
                keep = fn(item) if input_col is None else fn(*columns.select(item, input_col))
            except Exception as err:
                note_error(err, self)
                raise
            if keep:
                yield item

    def __len__(self) -> int:
        raise self._no_length("filter() drops an unknown number of items")
