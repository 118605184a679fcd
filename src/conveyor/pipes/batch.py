"""``batch``, ``unbatch`` and ``map_batches``: group items into lists, split them again, and
map a function over groups."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal, Protocol, TypeVar, overload

from conveyor.core.base import IterDataPipe
from conveyor.core.passes import PassContext, State, ThroughPass
from conveyor.core.validation import check_int
from conveyor.pipes.flatmap import Expander

S = TypeVar("S")
T = TypeVar("T")


class Gatherer(Protocol):
    """What a batch is gathered in: a list, or what its consumer asked for
    (:meth:`BatcherPass.gather_in`)."""

    def append(self, item: Any, /) -> None: ...

    def __len__(self) -> int: ...


class BatcherPass(ThroughPass):
    """Holds nothing between batches: a batch leaves whole, so the state after it is the
    input's state after its last item."""

    def __init__(self, pipe: Batcher, state: State | None, context: PassContext):
        super().__init__(pipe, state, context)
        self.count = 0
        self._gatherer: Callable[[int], Gatherer] = lambda size: []
        self.items = self._batch(pipe.batch_size, pipe.drop_last)

    def gather_in(self, gatherer: Callable[[int], Gatherer]) -> None:
        """Gather each batch in ``gatherer(batch_size)`` instead of a list: for the pass
        that consumes the batches (its only consumer), before its first batch. A default
        ``collate`` stacks the items as they arrive, while each is still in the cache."""
        self._gatherer = gatherer

    def _batch(self, size: int, drop_last: bool) -> Iterator[Any]:
        batch = self._gatherer(size)
        for item in self.source:
            batch.append(item)
            if len(batch) == size:
                self.count += 1
                yield batch
                batch = self._gatherer(size)
                del item  # the batch's last item is not held while the next batch is made
        if len(batch) and not drop_last:
            self.count += 1
            yield batch

    def yielded(self) -> int:
        return self.count


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
        return batch_count(len(self.source), self.batch_size, self.drop_last)


def batch_count(items: int, batch_size: int, drop_last: bool) -> int:
    """How many batches of ``batch_size`` ``items`` make: whole ones only with
    ``drop_last``, else a last, shorter one too."""
    return items // batch_size if drop_last else -(-items // batch_size)


@IterDataPipe.register_functional("batch", aliases={"n": "batch_size"}, builds=Batcher)
def batch(self: IterDataPipe[T], batch_size: int, drop_last: bool = False) -> IterDataPipe[list[T]]:
    """Groups the items into lists of ``batch_size``.

    Args:
        batch_size: Items per batch (``n=`` is accepted for it too).
        drop_last: Drop the last batch when it is shorter than ``batch_size``.

    Returns:
        A pipe of lists, each of ``batch_size`` items but perhaps the last.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> list(IterableWrapper(range(5)).batch(2))
        [[0, 1], [2, 3], [4]]
        >>> list(IterableWrapper(range(5)).batch(2, drop_last=True))
        [[0, 1], [2, 3]]
    """
    return Batcher(self, batch_size, drop_last)


class Unbatcher(Expander):
    """Yields the elements of each batch; ``unbatch_level`` > 1 flattens nested batches."""

    _params = ("unbatch_level",)

    def __init__(self, source: IterDataPipe, unbatch_level: int = 1):
        check_int("unbatch_level", unbatch_level, 1)
        super().__init__(source)
        self.unbatch_level = unbatch_level

    def expand(self, item: Any) -> Iterable[Any]:
        return _flatten(item, self.unbatch_level, self)


@overload
def unbatch(self: IterDataPipe[Sequence[T]], unbatch_level: Literal[1] = 1) -> IterDataPipe[T]: ...
@overload
def unbatch(self: IterDataPipe[Any], unbatch_level: int) -> IterDataPipe[Any]: ...
@IterDataPipe.register_functional("unbatch", builds=Unbatcher)
def unbatch(self: IterDataPipe[Any], unbatch_level: int = 1) -> IterDataPipe[Any]:
    """Yields the elements of each batch (a list or tuple), undoing ``batch``.

    Args:
        unbatch_level: How many levels of nesting to undo: 2 flattens batches of
            batches.

    Returns:
        A pipe of the batches' elements, in order.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> list(IterableWrapper([[0, 1], [2]]).unbatch())
        [0, 1, 2]
        >>> list(IterableWrapper([[[0], [1, 2]], [[3]]]).unbatch(unbatch_level=2))
        [0, 1, 2, 3]
    """
    return Unbatcher(self, unbatch_level)


def _flatten(batch: Any, level: int, pipe: IterDataPipe) -> Iterator[Any]:
    if not isinstance(batch, (list, tuple)):
        raise TypeError(f"{pipe!r} expected a list or tuple to unbatch, got {type(batch).__name__}")
    if level == 1:
        yield from batch
    else:
        for inner in batch:
            yield from _flatten(inner, level - 1, pipe)


class BatchMapper(Expander):
    """Groups ``batch_size`` items (the last group may be shorter), calls ``fn`` on each
    group and yields the elements of what it returns, as torchdata's ``map_batches``.
    With ``input_col`` (an index or key, or a list of them), ``fn`` gets those columns of
    each item instead of the items. Its input is a ``batch`` op it makes, so a resume
    re-reads the group being expanded, as any expanding op re-reads its item."""

    per_item = False  # what fn returns for a group depends on which items share it
    _params = ("fn", "input_col")

    def __init__(
        self, source: IterDataPipe, fn: Callable[[list[Any]], Iterable[Any]], batch_size: int, input_col: Any = None
    ):
        if not callable(fn):
            raise TypeError(f"map_batches() needs a callable, got {type(fn).__name__}")
        super().__init__(Batcher(source, batch_size))
        self.fn = fn
        self.input_col = input_col

    def expand(self, item: Any) -> Iterable[Any]:
        column = self.input_col
        if column is None:
            return self.fn(item)
        if isinstance(column, (list, tuple)):
            return self.fn([[row[c] for c in column] for row in item])
        return self.fn([row[column] for row in item])

    def __len__(self) -> int:
        raise self._no_length("its length depends on what its function returns")


@overload
def map_batches(
    self: IterDataPipe[T], fn: Callable[[list[T]], Iterable[S]], batch_size: int, input_col: None = None
) -> IterDataPipe[S]: ...
@overload
def map_batches(
    self: IterDataPipe[Any], fn: Callable[[list[Any]], Iterable[S]], batch_size: int, input_col: Any
) -> IterDataPipe[S]: ...
@IterDataPipe.register_functional("map_batches", builds=BatchMapper)
def map_batches(
    self: IterDataPipe[Any], fn: Callable[[list[Any]], Iterable[S]], batch_size: int, input_col: Any = None
) -> IterDataPipe[S]:
    """Calls ``fn`` on groups of ``batch_size`` items and yields what it returns, one by one.

    As torchdata's ``map_batches``: for a function that is faster on many items at once.
    A resume re-reads the group being expanded. In a worker, each element ``fn`` returns
    travels on its own: an element made by :func:`conveyor.shared_empty` is sent without
    a copy, where the rows of one array ``fn`` returns are each copied once.

    Args:
        fn: Called with a list of items (the last group may be shorter); returns an
            iterable of new items.
        batch_size: Items per group.
        input_col: Give ``fn`` this column of each item (an index or key), or a list of
            columns; None: the items.

    Returns:
        A pipe of the elements of what ``fn`` returns. It has no ``len()``.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> list(IterableWrapper(range(5)).map_batches(lambda xs: [sum(xs)] * len(xs), 2))
        [1, 1, 5, 5, 4]
    """
    return BatchMapper(self, fn, batch_size, input_col)
