"""``filter``: keep the items for which a predicate holds."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any, TypeVar, overload

from conveyor.core.base import IterDataPipe
from conveyor.core.passes import PassContext, State, ThroughPass
from conveyor.core.skips import drop_or_raise
from conveyor.pipes import columns

T = TypeVar("T")


class FilterPass(ThroughPass):
    def __init__(self, pipe: Filter, state: State | None, context: PassContext):
        super().__init__(pipe, state, context)
        self.count = 0
        self.items = self._filter(pipe)

    def _filter(self, pipe: Filter) -> Iterator[Any]:
        fn, input_col = pipe.filter_fn, pipe.input_col
        source, skips = self.source, self.context.skips
        for item in skips.unseen(pipe, source) if skips else source:
            try:
                keep = fn(item) if input_col is None else fn(*columns.select(item, input_col))
            except Exception as err:
                drop_or_raise(err, pipe, skips, source)
                continue
            if keep:
                self.count += 1
                yield item

    def yielded(self) -> int:
        return self.count


class Filter(IterDataPipe):
    """Yields the items for which ``filter_fn(item)`` (or of its ``input_col``) is true."""

    per_item = True
    keeps_order = True
    pass_type = FilterPass
    state_fields = {"source": dict}

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

    def __len__(self) -> int:
        raise self._no_length("filter() drops an unknown number of items")


@overload
def filter_(self: IterDataPipe[T], filter_fn: Callable[[T], object], input_col: None = None) -> IterDataPipe[T]: ...
@overload
def filter_(
    self: IterDataPipe[T], filter_fn: Callable[..., object], input_col: Hashable | Sequence[Hashable] | None
) -> IterDataPipe[T]: ...
@IterDataPipe.register_functional("filter", builds=Filter)
def filter_(
    self: IterDataPipe[T], filter_fn: Callable[..., object], input_col: Hashable | Sequence[Hashable] | None = None
) -> IterDataPipe[T]:
    """Keeps the items for which ``filter_fn`` is true.

    Args:
        filter_fn: Called with each item (or its ``input_col``); the item is kept when
            the result is true.
        input_col: Give ``filter_fn`` only this column of each item, or several (a list)
            as several arguments; None: the whole item.

    Returns:
        A pipe of the items kept, in order. It has no ``len()``.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> list(IterableWrapper(range(6)).filter(lambda x: x % 2 == 0))
        [0, 2, 4]
    """
    return Filter(self, filter_fn, input_col)
