"""``map``: apply a function to every item (or to some of its columns)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any, TypeVar, overload

from conveyor.core.base import IterDataPipe
from conveyor.core.passes import PassContext, State, ThroughPass
from conveyor.core.skips import drop_or_raise
from conveyor.pipes import columns

S = TypeVar("S")
T = TypeVar("T")


class MapperPass(ThroughPass):
    def __init__(self, pipe: Mapper, state: State | None, context: PassContext):
        super().__init__(pipe, state, context)
        self.items = self._map(pipe)

    def _map(self, pipe: Mapper) -> Iterator[Any]:
        fn, input_col, output_col = pipe.fn, pipe.input_col, pipe.output_col
        source, skips = self.source, self.context.skips
        for item in skips.unseen(pipe, source) if skips else source:
            try:
                result = fn(item) if input_col is None else columns.apply(fn, item, input_col, output_col)
            except Exception as err:
                drop_or_raise(err, pipe, skips, source)
                self.skipped += 1
                continue
            yield result
            # Let go of both before the next item is made: a generator's locals live on, and
            # the next call would otherwise build its result while holding this one (two
            # large items alive at a time in the worker, where one would do).
            del result, item


class Mapper(IterDataPipe):
    """Yields ``fn(item)``. With ``input_col``, ``fn`` gets those columns of a tuple,
    list or dict item, and the result replaces the column (or goes to ``output_col``;
    ``-1`` appends). Errors from ``fn`` carry a note naming this pipe.
    """

    per_item = True
    keeps_order = True
    pass_type = MapperPass
    state_fields = {"source": dict}

    _params = ("fn", "input_col", "output_col")

    def __init__(
        self,
        source: IterDataPipe,
        fn: Callable[..., Any],
        input_col: columns.Column = None,
        output_col: columns.Column = None,
    ):
        if not callable(fn):
            raise TypeError(f"map() needs a callable, got {type(fn).__name__}")
        self.source = source
        self.fn = fn
        self.input_col = input_col
        self.output_col = columns.check_columns(input_col, output_col)

    def __len__(self) -> int:
        return len(self.source)


@overload
def map_(
    self: IterDataPipe[T], fn: Callable[[T], S], input_col: None = None, output_col: None = None
) -> IterDataPipe[S]: ...
@overload
def map_(
    self: IterDataPipe[Any],
    fn: Callable[..., Any],
    input_col: Hashable | Sequence[Hashable] | None,
    output_col: Hashable | Sequence[Hashable] | None = None,
) -> IterDataPipe[Any]: ...
@IterDataPipe.register_functional("map", builds=Mapper)
def map_(
    self: IterDataPipe[Any],
    fn: Callable[..., Any],
    input_col: Hashable | Sequence[Hashable] | None = None,
    output_col: Hashable | Sequence[Hashable] | None = None,
) -> IterDataPipe[Any]:
    """Applies ``fn`` to each item.

    An error ``fn`` raises carries a note naming this pipe; under
    ``DataLoader2(on_error="skip")`` the item is dropped instead.

    Args:
        fn: Called with each item; what it returns is the new item.
        input_col: Give ``fn`` only this column of each item (an index of a tuple or
            list, a key of a dict), or several columns (a list) as several arguments.
            None: the whole item.
        output_col: With ``input_col``, where the result goes: None replaces the input
            column, another index or key sets that one, ``-1`` appends to a tuple or
            list.

    Returns:
        A pipe of the results, in the items' order.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> list(IterableWrapper(range(4)).map(lambda x: x * 10))
        [0, 10, 20, 30]
        >>> list(IterableWrapper([(1, 2), (3, 4)]).map(str, input_col=1))
        [(1, '2'), (3, '4')]
    """
    return Mapper(self, fn, input_col, output_col)
