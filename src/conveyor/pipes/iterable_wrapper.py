"""``IterableWrapper``: any Python iterable as a source pipe."""

from __future__ import annotations

import copy
import itertools
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sized
from typing import Any, TypeVar

from conveyor.core.base import IterDataPipe
from conveyor.core.passes import Pass, PassContext, State
from conveyor.errors import ResumeError, StateError

#: What the wrapped iterable yields: ``IterableWrapper(range(3))`` is an ``IterableWrapper[int]``.
T_co = TypeVar("T_co", covariant=True)

# Built-in iterators whose position can be set in O(1) through ``__setstate__``.
_SEEKABLE_ITERATORS: tuple[type[Any], ...] = (type(iter([])), type(iter(())), type(iter(range(0))))


class IterableWrapperPass(Pass):
    """Reads a (copy of the) iterable from ``index`` on; ``count`` is the next index."""

    def __init__(self, pipe: IterableWrapper, state: State | None, context: PassContext):
        super().__init__(pipe, context)
        self.count = self._start = state["index"] if state is not None else 0
        source = pipe._iterable
        if pipe.deepcopy:
            try:
                source = copy.deepcopy(source)
            except TypeError:
                warnings.warn(
                    f"{pipe!r}: the iterable cannot be deep-copied; iterating it directly, so "
                    "in-place changes downstream may carry over to the next pass",
                    stacklevel=4,
                )
        self._source = source
        self.items = self._read()

    def _read(self) -> Iterator[Any]:
        source = self._source
        iterator = iter(source)
        if self.count:
            iterator = self._seek(source, iterator, self.count)
        count = self.count
        for item in iterator:
            self.count = count = count + 1
            yield item

    def _seek(self, source: Iterable[Any], iterator: Iterator[Any], start: int) -> Iterator[Any]:
        if iterator is source:
            raise ResumeError(
                f"{self.pipe!r} wraps a one-shot iterator ({type(source).__name__}); it cannot be "
                "replayed to resume. Wrap a re-iterable (a list, a range, a class with __iter__)"
            )
        if isinstance(iterator, _SEEKABLE_ITERATORS):
            iterator.__setstate__(start)
            return iterator
        return itertools.islice(iterator, start, None)

    def state(self) -> State:
        return {"index": self.count}

    def yielded(self) -> int:
        return self.count - self._start


class IterableWrapper(IterDataPipe[T_co]):
    """Yields the items of ``iterable``, once per pass.

    ``deepcopy=True`` iterates a deep copy each pass, so in-place changes made downstream
    do not leak into the next epoch (as torchdata). Resuming seeks in O(1) for lists,
    tuples and ranges and replays the skipped items otherwise; a one-shot iterator (a
    generator) can be read once and cannot be resumed.

    Args:
        iterable: What to iterate: a list, a range, any re-iterable object (a generator can be read
            once only).
        deepcopy: Iterate a deep copy each pass (for objects that cannot be deep-copied, the object
            itself, with a warning).
    """

    _params = ("deepcopy",)
    state_fields = {"index": int}
    pass_type = IterableWrapperPass

    def __init__(self, iterable: Iterable[T_co], deepcopy: bool = True):
        self._iterable = iterable
        self.deepcopy = deepcopy

    def __len__(self) -> int:
        if not isinstance(self._iterable, Sized):
            raise self._no_length(f"its {type(self._iterable).__name__} has no len()")
        return len(self._iterable)

    def check_own_state(self, state: Mapping[str, Any], where: str) -> None:
        if not isinstance(self._iterable, Sized):
            return
        length = len(self._iterable)
        if state["index"] > length:
            raise StateError(f"{where}: index {state['index']} is past the end ({length} items)")
