"""``in_memory_cache``: keep the items of a whole pass in memory and read later passes from
there (torchdata's ``InMemoryCacheHolder``; ``size`` in megabytes).

A pass that reads its input from the first item to the last, within ``size``, publishes
what it read (with each item's position) as one immutable tuple on this process's copy of
the pipe; passes opened afterwards read that tuple by index and never open the input.
Nothing is shared while it changes: a pass builds its list privately and the tuple is
swapped in whole. Workers and loaders have copies of their own (the cache is not pickled
or copied), so each fills its own on its first pass.

Random ops before it are refused: the cache would keep the first pass's draws for every
later epoch, which a resumed loader could not draw again.

Its state is ``{"count": items yielded, "source": the input's state, or None when the
pass reads the cache}``. A pass saved while reading the cache resumes from this process's
cache when there is one, and otherwise reads the input from its start again, skipping the
items already yielded (the input yields the same items again: nothing random comes
before the cache), and fills the cache on the way.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

from conveyor.core.base import IterDataPipe
from conveyor.core.foreign import inputs_of
from conveyor.core.op_roles import RandomOp
from conveyor.core.passes import Pass, PassContext, Position, State
from conveyor.core.validation import check_int
from conveyor.errors import GraphError

T = TypeVar("T")


_MB = 1024 * 1024


def _approximate_bytes(item: Any) -> int:
    """An item's size as the cache counts it: a buffer's bytes when it says (numpy, torch,
    bytes), else ``sys.getsizeof`` (as torchdata counts)."""
    nbytes = getattr(item, "nbytes", None)
    return nbytes if isinstance(nbytes, int) else sys.getsizeof(item)


class InMemoryCachePass(Pass):
    def __init__(self, pipe: InMemoryCacheHolder, state: State | None, context: PassContext):
        super().__init__(pipe, context)
        self.count = state["count"] if state is not None else 0
        self._start = self.count
        self._position: Position | None = None
        cache = pipe.__dict__.get("_cache")
        reading_cache = state is None or state["source"] is None
        self.source: Pass | None = None
        self._complete = False  # this pass sees every item of its input: it may fill the cache
        if reading_cache and cache is not None:
            self.items = self._from_cache(cache)
        else:  # the input: from where the state says, or from its start, skipping count items
            resumed = state["source"] if state is not None else None
            self.source = context.open(pipe.source, resumed)
            skip = self.count if resumed is None else 0
            self._complete = resumed is None
            self.items = self._from_source(pipe, skip)

    def _from_cache(self, cache: tuple[tuple[Any, Position | None], ...]) -> Iterator[Any]:
        for item, position in cache[self.count :]:
            self._position = position
            self.count += 1
            yield item

    def _from_source(self, pipe: InMemoryCacheHolder, skip: int) -> Iterator[Any]:
        assert self.source is not None
        source = self.source
        limit = None if pipe.size is None else pipe.size * _MB
        kept: list[tuple[Any, Position | None]] | None = [] if self._complete else None
        held = 0
        for index, item in enumerate(source.items):
            position = source.position()
            if kept is not None:
                held += _approximate_bytes(item)
                if limit is not None and held > limit:
                    kept = None  # over the size: this pass caches nothing
                else:
                    kept.append((item, position))
            if index < skip:
                continue
            self._position = position
            self.count += 1
            yield item
        if kept is not None:
            pipe._cache = tuple(kept)  # published whole: later passes read it

    def state(self) -> State:
        return {"count": self.count, "source": self.source.state() if self.source is not None else None}

    def position(self) -> Position | None:
        return self._position

    def yielded(self) -> int:
        return self.count - self._start

    def inputs(self) -> list[Pass]:
        return [self.source] if self.source is not None else []


def _refuse_random_inputs(source: IterDataPipe) -> None:
    """A random op before the cache would freeze its first pass's draws for every later
    epoch, which a resumed loader (whose cache starts empty) could not draw again."""
    seen: set[int] = set()
    stack: list[Any] = [source]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.extend(inputs_of(node))
        if isinstance(node, RandomOp):
            raise GraphError(
                f"in_memory_cache() after {node!r}: the cache would keep its first pass's random draws for "
                "every later epoch, and a resumed loader could not draw them again; put the random ops "
                "after the cache (cache the data, then shuffle)"
            )


class InMemoryCacheHolder(IterDataPipe):
    """Yields its input's items; once a pass has read them all (within ``size`` megabytes,
    no limit when None), later passes in this process read them from memory."""

    per_item = True
    keeps_order = True
    pass_type = InMemoryCachePass
    state_fields = {"count": int, "source": (dict, type(None))}
    _params = ("size",)
    _runtime = IterDataPipe._runtime | {"_cache"}
    #: The items of a whole pass and their positions, once one has read them all.
    _cache: tuple[tuple[Any, Position | None], ...]

    def __init__(self, source: IterDataPipe, size: int | None = None):
        check_int("size", size, 1, allow_none=True)
        _refuse_random_inputs(source)
        self.source = source
        self.size = size

    def __len__(self) -> int:
        return len(self.source)

    def substates(self, state: Mapping[str, Any]) -> list[tuple[IterDataPipe, Any, str]]:
        return [(self.source, state["source"], "source")] if state["source"] is not None else []


@IterDataPipe.register_functional("in_memory_cache", builds=InMemoryCacheHolder)
def in_memory_cache(self: IterDataPipe[T], size: int | None = None) -> IterDataPipe[T]:
    """Keeps the items in memory once a pass has read them all; later passes read them there.

    The cache belongs to this process (each worker has its own).

    Args:
        size: At most this many megabytes of items; a pass that would hold more reads
            on without caching. None: no limit.

    Returns:
        A pipe of the same items.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> cached = IterableWrapper(range(3)).map(lambda x: x * x).in_memory_cache()
        >>> list(cached), list(cached)
        ([0, 1, 4], [0, 1, 4])
    """
    return InMemoryCacheHolder(self, size)
