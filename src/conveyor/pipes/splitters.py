"""Ops that split one pipe into several: ``fork``, ``demux``, ``round_robin_demux`` and
``unzip`` (torchdata's names and arguments). Each returns a list of branch pipes; how
branches share their input, and how they resume, is in :mod:`conveyor.pipes.branching`.
"""

from __future__ import annotations

import copy as copying
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, TypeVar, cast

from conveyor.core.base import IterDataPipe, describe_value
from conveyor.core.skips import note_error
from conveyor.pipes.branching import Hub

T = TypeVar("T")


__all__ = ["Demultiplexer", "Forker", "RoundRobinDemultiplexer", "UnZipper"]

_COPIES: dict[str | None, Callable[[Any], Any] | None] = {
    None: None,
    "shallow": copying.copy,
    "deep": copying.deepcopy,
}


class Forker(Hub):
    """``num_instances`` branches that each yield every item of ``source``.

    ``copy``: ``None`` hands every branch the same object; ``"shallow"`` or ``"deep"``
    gives each branch its own copy. ``buffer_size`` bounds how many items the leading
    branch may read past the slowest one (``-1``: no bound).
    """

    op_name = "fork"
    _params = ("num_instances", "buffer_size", "copy")

    def __init__(
        self, source: IterDataPipe, num_instances: int, buffer_size: int = 1000, copy: str | None = None
    ) -> None:
        super().__init__(source, num_instances, buffer_size)
        if copy not in _COPIES:
            raise ValueError(f"fork(copy=...) must be None, 'shallow' or 'deep', got {copy!r}")
        self.copy = copy

    def route(self, item: Any, index: int) -> Iterable[tuple[int, Any]]:
        duplicate = _COPIES[self.copy]
        if duplicate is None:
            return [(branch, item) for branch in range(self.num_instances)]
        return [(branch, duplicate(item)) for branch in range(self.num_instances)]

    def branch_length(self, branch: int) -> int:
        return len(self.source)


@IterDataPipe.register_functional("fork", builds=Forker)
def fork(
    self: IterDataPipe[T],
    num_instances: int,
    buffer_size: int = 1000,
    copy: Literal["shallow", "deep"] | None = None,
) -> list[IterDataPipe[T]]:
    """Splits this pipe into ``num_instances`` branches that each yield every item.

    The input is read once; items wait for the branches that lag, so iterate the branches
    together (``zip``, ``mux``): one may run at most ``buffer_size`` items ahead.

    Args:
        num_instances: How many branches.
        buffer_size: How many items the leading branch may read past the slowest one
            (``-1``: no bound).
        copy: None hands every branch the same object; ``"shallow"`` or ``"deep"`` gives
            each branch a copy of its own.

    Returns:
        The branches, a list of ``num_instances`` pipes.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> left, right = IterableWrapper(range(3)).fork(2)
        >>> list(left.zip(right.map(lambda x: x * 10)))
        [(0, 0), (1, 10), (2, 20)]
    """
    return cast(
        "list[IterDataPipe[T]]", Forker(self, num_instances, buffer_size, copy)
    )  # its __new__ returns the branches


class Demultiplexer(Hub):
    """Branch ``classifier_fn(item)`` gets the item. ``classifier_fn`` returns an int in
    ``[0, num_instances)``, or ``None`` to drop the item when ``drop_none`` is set.
    ``buffer_size`` bounds the items held for branches that lag (``-1``: no bound)."""

    op_name = "demux"
    _params = ("num_instances", "classifier_fn", "drop_none", "buffer_size")

    def __init__(
        self,
        source: IterDataPipe,
        num_instances: int,
        classifier_fn: Callable[[Any], int | None],
        drop_none: bool = False,
        buffer_size: int = 1000,
    ) -> None:
        if not callable(classifier_fn):
            raise TypeError(f"demux() needs a callable classifier_fn, got {type(classifier_fn).__name__}")
        super().__init__(source, num_instances, buffer_size)
        self.classifier_fn = classifier_fn
        self.drop_none = drop_none

    def route(self, item: Any, index: int) -> Iterable[tuple[int, Any]]:
        try:
            branch = self.classifier_fn(item)
        except Exception as err:
            note_error(err, self)
            raise
        if branch is None and self.drop_none:
            return ()
        if not isinstance(branch, int) or not 0 <= branch < self.num_instances:  # a bool is 0 or 1, as in torchdata
            hint = "" if self.drop_none or branch is not None else " (None drops an item only with drop_none=True)"
            raise ValueError(
                f"{self!r}: classifier_fn must return an int in [0, {self.num_instances}), got "
                f"{describe_value(branch)} for item number {index}{hint}"
            )
        return ((int(branch), item),)


@IterDataPipe.register_functional("demux", builds=Demultiplexer)
def demux(
    self: IterDataPipe[T],
    num_instances: int,
    classifier_fn: Callable[[T], int | None],
    drop_none: bool = False,
    buffer_size: int = 1000,
) -> list[IterDataPipe[T]]:
    """Splits this pipe into ``num_instances`` branches; ``classifier_fn`` says which gets an item.

    Args:
        num_instances: How many branches.
        classifier_fn: Called with each item; returns the index of its branch, in
            ``[0, num_instances)``, or None to drop it (with ``drop_none``).
        drop_none: Drop the items ``classifier_fn`` returns None for; otherwise None
            is an error.
        buffer_size: How many items may wait for branches that lag (``-1``: no bound).

    Returns:
        The branches, a list of ``num_instances`` pipes.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> evens, odds = IterableWrapper(range(5)).demux(2, lambda x: x % 2)
        >>> list(evens), list(odds)
        ([0, 2, 4], [1, 3])
    """
    return cast(
        "list[IterDataPipe[T]]", Demultiplexer(self, num_instances, classifier_fn, drop_none, buffer_size)
    )  # its __new__ returns the branches


class RoundRobinDemultiplexer(Hub):
    """Branch ``i`` gets items ``i``, ``i + num_instances``, ``i + 2 * num_instances``, ..."""

    op_name = "round_robin_demux"

    def route(self, item: Any, index: int) -> Iterable[tuple[int, Any]]:
        return ((index % self.num_instances, item),)

    def branch_length(self, branch: int) -> int:
        total = len(self.source)
        return total // self.num_instances + (1 if branch < total % self.num_instances else 0)


@IterDataPipe.register_functional("round_robin_demux", builds=RoundRobinDemultiplexer)
def round_robin_demux(self: IterDataPipe[T], num_instances: int, buffer_size: int = 1000) -> list[IterDataPipe[T]]:
    """Deals the items to ``num_instances`` branches in turn, as cards are dealt.

    Args:
        num_instances: How many branches: branch ``i`` gets items ``i``,
            ``i + num_instances``, ...
        buffer_size: How many items may wait for branches that lag (``-1``: no bound).

    Returns:
        The branches, a list of ``num_instances`` pipes.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> first, second = IterableWrapper(range(5)).round_robin_demux(2)
        >>> list(first), list(second)
        ([0, 2, 4], [1, 3])
    """
    return cast(
        "list[IterDataPipe[T]]", RoundRobinDemultiplexer(self, num_instances, buffer_size)
    )  # its __new__ returns the branches


class UnZipper(Hub):
    """Items are sequences of ``sequence_length`` values; branch ``j`` yields their value
    ``j`` (one branch per column not in ``columns_to_skip``)."""

    op_name = "unzip"
    _params = ("sequence_length", "columns", "buffer_size")

    def __new__(
        cls,
        source: IterDataPipe,
        sequence_length: int,
        buffer_size: int = 1000,
        columns_to_skip: Sequence[int] | None = None,
    ) -> Any:
        return super().__new__(cls, source, sequence_length, buffer_size, columns_to_skip)

    def __init__(
        self,
        source: IterDataPipe,
        sequence_length: int,
        buffer_size: int = 1000,
        columns_to_skip: Sequence[int] | None = None,
    ) -> None:
        if isinstance(sequence_length, bool) or not isinstance(sequence_length, int) or sequence_length < 1:
            raise ValueError(f"unzip() needs sequence_length, a positive int; got {sequence_length!r}")
        skipped = set(columns_to_skip or ())
        if not all(isinstance(c, int) and not isinstance(c, bool) for c in skipped):
            raise TypeError(f"columns_to_skip must hold ints, got {columns_to_skip!r}")
        columns = [column for column in range(sequence_length) if column not in skipped]
        if not columns:
            raise ValueError(f"unzip(): columns_to_skip {sorted(skipped)} leaves no column of {sequence_length}")
        super().__init__(source, len(columns), buffer_size)
        self.sequence_length = sequence_length
        self.columns = columns

    def route(self, item: Any, index: int) -> Iterable[tuple[int, Any]]:
        try:
            length = len(item)
        except TypeError:
            length = None
        if length != self.sequence_length:
            got = f"a {type(item).__name__}" if length is None else f"{length} values"
            raise ValueError(f"{self!r}: item number {index} should hold {self.sequence_length} values, got {got}")
        return [(branch, item[column]) for branch, column in enumerate(self.columns)]

    def branch_length(self, branch: int) -> int:
        return len(self.source)


@IterDataPipe.register_functional("unzip", builds=UnZipper)
def unzip(
    self: IterDataPipe[Sequence[Any]],
    sequence_length: int,
    buffer_size: int = 1000,
    columns_to_skip: Sequence[int] | None = None,
) -> list[IterDataPipe[Any]]:
    """Splits items that are sequences into one branch per position, undoing ``zip``.

    Args:
        sequence_length: How many values each item holds.
        buffer_size: How many items may wait for branches that lag (``-1``: no bound).
        columns_to_skip: Positions that get no branch.

    Returns:
        The branches, one per position not skipped, in order.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> numbers, letters = IterableWrapper([(0, "a"), (1, "b")]).unzip(2)
        >>> list(numbers), list(letters)
        ([0, 1], ['a', 'b'])
    """
    return cast(
        "list[IterDataPipe[Any]]", UnZipper(self, sequence_length, buffer_size, columns_to_skip)
    )  # its __new__ returns the branches
