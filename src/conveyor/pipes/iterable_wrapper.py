"""``IterableWrapper``: any Python iterable as a source pipe."""

from __future__ import annotations

import copy
import itertools
import warnings
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from conveyor.errors import ResumeError, StateError
from conveyor.pipes.base import IterDataPipe
from conveyor.state import require_keys, require_non_negative

# Built-in iterators whose position can be set in O(1) through ``__setstate__``.
_SEEKABLE_ITERATORS = (type(iter([])), type(iter(())), type(iter(range(0))))


class IterableWrapper(IterDataPipe):
    """Yields the items of ``iterable``, once per pass.

    ``deepcopy=True`` iterates a deep copy each pass, so in-place changes made downstream
    do not leak into the next epoch (as torchdata). Resuming seeks in O(1) for lists,
    tuples and ranges and replays the skipped items otherwise; a one-shot iterator (a
    generator) can be read once and cannot be resumed.
    """

    _params = ("deepcopy",)

    def __init__(self, iterable: Iterable[Any], deepcopy: bool = True):
        self._iterable = iterable
        self.deepcopy = deepcopy
        self._index = 0

    def __iter__(self) -> Iterator[Any]:
        resume = self._take_restored()
        start = resume["index"] if resume else 0
        source = self._iterable
        if self.deepcopy:
            try:
                source = copy.deepcopy(source)
            except TypeError:
                warnings.warn(
                    f"{self!r}: the iterable cannot be deep-copied; iterating it directly, so "
                    "in-place changes downstream may carry over to the next pass",
                    stacklevel=2,
                )
        iterator = iter(source)
        if start:
            iterator = self._seek(source, iterator, start)
        self._index = start
        for item in iterator:
            self._index += 1
            yield item

    def _seek(self, source: Iterable[Any], iterator: Iterator[Any], start: int) -> Iterator[Any]:
        if iterator is source:
            raise ResumeError(
                f"{self!r} wraps a one-shot iterator ({type(source).__name__}); it cannot be "
                "replayed to resume. Wrap a re-iterable (a list, a range, a class with __iter__)"
            )
        if isinstance(iterator, _SEEKABLE_ITERATORS):
            iterator.__setstate__(start)
            return iterator
        return itertools.islice(iterator, start, None)

    def __len__(self) -> int:
        try:
            return len(self._iterable)  # type: ignore[arg-type]
        except TypeError:
            raise self._no_length(f"its {type(self._iterable).__name__} has no len()") from None

    def reset(self) -> None:
        super().reset()
        self._index = 0

    def _current_state(self) -> dict[str, Any]:
        return {"index": self._index}

    def _check_state(self, state: Mapping[str, Any]) -> None:
        require_keys(state, {"index": int}, repr(self))
        index = require_non_negative(state, "index", repr(self))
        try:
            length = len(self._iterable)  # type: ignore[arg-type]
        except TypeError:
            return
        if index > length:
            raise StateError(f"index {index} is past the end ({length} items)")
