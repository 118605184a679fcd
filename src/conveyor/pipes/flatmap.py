"""Ops that turn one upstream item into several (``flatmap``, ``unbatch``, file listing,
line reading), and ``flatmap`` itself.

An expanding op resumes by replay, never by saving items: its state is its input's state
from just before the item being expanded, the position of that item, and how many parts
of it were yielded. Resuming re-reads that one item and skips the parts already yielded.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar, overload

from conveyor.core.base import IterDataPipe
from conveyor.core.passes import Pass, PassContext, Position, State
from conveyor.core.skips import drop_or_raise, item_key
from conveyor.errors import StateError

S = TypeVar("S")
T = TypeVar("T")


class ExpanderPass(Pass):
    """``before``: the input's state before the item being expanded (None before the
    first); ``offset``: parts of it yielded; ``parent``: its position."""

    pipe: Expander

    def __init__(self, pipe: Expander, state: State | None, context: PassContext):
        super().__init__(pipe, context)
        self.source = context.open(pipe.source, state["source"] if state is not None else None)
        self._skip = state["offset"] if state is not None else 0
        # Resumed with another sharding, the re-read item may belong to another worker:
        # skip only into the very item that was being expanded.
        self._resumed_parent = tuple(state["item"]) if state is not None and state["item"] is not None else None
        # Until it reads, a resumed pass stands where its state says (inside an item).
        self.before: State | None = state["source"] if state is not None and self._skip else None
        self.offset = self._skip
        self.parent: Position | None = self._resumed_parent
        self._position: Position | None = None
        self.count = 0
        self.items = self._expand(pipe)

    def _expand(self, pipe: Expander) -> Iterator[Any]:
        source, skip, resumed_parent = self.source, self._skip, self._resumed_parent
        upstream, parts_of = source.items, self.parts
        skips = self.context.skips
        known = skips.known_for(pipe) if skips else None
        while True:
            before = source.state()
            try:
                item = next(upstream)
            except StopIteration:
                break
            if known and item_key(source) in known:
                continue  # recorded as skipped before a resume: not expanded again
            parent = source.position()
            if resumed_parent is not None and parent != resumed_parent:
                skip = 0
            resumed_parent = None
            self.before, self.offset, self.parent = before, skip, parent
            try:
                for offset, part in enumerate(parts_of(item, skip), start=skip):
                    self.offset = offset + 1
                    self._position = None if parent is None else (*parent, offset)
                    self.count += 1
                    yield part
            except Exception as err:  # the function, or reading the item (a truncated archive)
                drop_or_raise(err, pipe, skips, source)  # skipping: the rest of the item is dropped
            skip = 0
        self.before, self.offset, self.parent = None, 0, None

    def parts(self, item: Any, skip: int) -> Iterable[Any]:
        """The parts of ``item`` after its first ``skip``: the pipe's, unless a pass of an
        op that needs its pass's context (its tree's rounds, meters) makes them itself."""
        return self.pipe.expand_from(item, skip)

    def state(self) -> State:
        if self.before is None:  # no item begun (or all ended): where the input stands
            return {"offset": 0, "item": None, "source": self.source.state()}
        parent = list(self.parent) if self.parent is not None else None
        return {"offset": self.offset, "item": parent, "source": self.before}

    def position(self) -> Position | None:
        return self._position

    def yielded(self) -> int:
        return self.count

    def inputs(self) -> list[Pass]:
        return [self.source]


class Expander(IterDataPipe):
    """Base for expanding ops; subclasses implement :meth:`expand`.

    Args:
        source: The pipe whose items are expanded.
    """

    per_item = True
    keeps_order = True
    pass_type = ExpanderPass
    adds_sub_positions = True
    replays_input = True
    state_fields = {"offset": int, "item": (list, type(None)), "source": dict}

    def __init__(self, source: IterDataPipe):
        self.source = source

    def expand(self, item: Any) -> Iterable[Any]:
        raise NotImplementedError  # each expanding op defines it

    def expand_from(self, item: Any, skip: int) -> Iterable[Any]:
        """The parts of ``item`` after its first ``skip`` (a resume inside the item); an op
        that can pass over parts without making them (an archive's members) overrides it."""
        return itertools.islice(self.expand(item), skip, None)

    def check_own_state(self, state: Mapping[str, Any], where: str) -> None:
        item = state["item"]
        if item is not None and not (item and all(type(i) is int and i >= 0 for i in item)):
            raise StateError(f"{where}: 'item' must be a non-empty list of ints >= 0")


class FlatMapper(Expander):
    """Yields every element of ``fn(item)`` (of ``item`` itself when ``fn`` is None)."""

    _params = ("fn",)

    def __init__(self, source: IterDataPipe, fn: Callable[[Any], Iterable[Any]] | None = None):
        if fn is not None and not callable(fn):
            raise TypeError(f"flatmap() needs a callable or None, got {type(fn).__name__}")
        super().__init__(source)
        self.fn = fn

    def expand(self, item: Any) -> Iterable[Any]:
        return item if self.fn is None else self.fn(item)


@overload
def flatmap(self: IterDataPipe[Iterable[S]], fn: None = None) -> IterDataPipe[S]: ...
@overload
def flatmap(self: IterDataPipe[T], fn: Callable[[T], Iterable[S]]) -> IterDataPipe[S]: ...
@IterDataPipe.register_functional("flatmap", builds=FlatMapper)
def flatmap(self: IterDataPipe[Any], fn: Callable[[Any], Iterable[Any]] | None = None) -> IterDataPipe[Any]:
    """Yields every element of ``fn(item)``, item after item.

    A resume mid-item goes on from the element after the last one yielded.

    Args:
        fn: Called with each item; returns an iterable of new items. None: the items
            are iterables themselves.

    Returns:
        A pipe of the elements. It has no ``len()``.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> list(IterableWrapper([1, 2]).flatmap(lambda x: [x] * x))
        [1, 2, 2]
        >>> list(IterableWrapper(["ab", "c"]).flatmap())
        ['a', 'b', 'c']
    """
    return FlatMapper(self, fn)


class Repeater(Expander):
    """Yields each item ``times`` times in a row (the same object, not copies), as
    torchdata's ``repeat``; ``cycle`` repeats the whole input instead."""

    _params = ("times",)

    def __init__(self, source: IterDataPipe, times: int):
        if isinstance(times, bool) or not isinstance(times, int) or times <= 1:
            raise ValueError(f"repeat(): the number of repetitions must be an int > 1, got {times!r}")
        super().__init__(source)
        self.times = times

    def expand(self, item: Any) -> Iterable[Any]:
        return itertools.repeat(item, self.times)

    def __len__(self) -> int:
        return self.times * len(self.source)


@IterDataPipe.register_functional("repeat", builds=Repeater)
def repeat(self: IterDataPipe[T], times: int) -> IterDataPipe[T]:
    """Yields each item ``times`` times in a row (the same object, not copies).

    ``cycle`` repeats the whole pipe instead.

    Args:
        times: How many times each item comes, more than 1.

    Returns:
        A pipe ``times`` as long.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> list(IterableWrapper("ab").repeat(2))
        ['a', 'a', 'b', 'b']
    """
    return Repeater(self, times)
