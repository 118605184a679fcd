"""Random-access pipes: ``SequenceWrapper`` and the ops of ``MapDataPipe``.

A random-access pipe resumes in O(1) (an index, no replay) and shuffles globally with a
keyed permutation that needs no memory per item.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from conveyor.permutation import KeyedPermutation
from conveyor.pipes.base import CountingPipe, IndexedStream, MapDataPipe, RandomOp, check_int, note_error


def _check_index(pipe: MapDataPipe, index: int) -> int:
    length = len(pipe)
    if isinstance(index, bool) or not isinstance(index, int):
        raise TypeError(f"{pipe!r} takes int indices, got {type(index).__name__}")
    if index < 0:
        index += length
    if not 0 <= index < length:
        raise IndexError(f"index {index} out of range for {pipe!r} of length {length}")
    return index


class SequenceWrapper(MapDataPipe):
    """Random access to any sequence (``__getitem__`` and ``__len__``); ``deepcopy=True``
    keeps the pipe's own copy, so later changes to the caller's sequence do not leak in."""

    _params = ("deepcopy",)

    def __init__(self, sequence: Sequence[Any], deepcopy: bool = True):
        if not hasattr(sequence, "__getitem__") or not hasattr(sequence, "__len__"):
            raise TypeError(f"SequenceWrapper needs __getitem__ and __len__, got {type(sequence).__name__}")
        self.deepcopy = deepcopy
        self._sequence = copy.deepcopy(sequence) if deepcopy else sequence

    def __getitem__(self, index: int) -> Any:
        return self._sequence[_check_index(self, index)]

    def __len__(self) -> int:
        return len(self._sequence)


@MapDataPipe.register_functional("map")
class MapMapper(MapDataPipe):
    """``fn`` applied on access: ``pipe[i]`` is ``fn(source[i])``."""

    _params = ("fn",)

    def __init__(self, source: MapDataPipe, fn: Callable[[Any], Any]):
        if not callable(fn):
            raise TypeError(f"map() needs a callable, got {type(fn).__name__}")
        self.source = source
        self.fn = fn

    def __getitem__(self, index: int) -> Any:
        item = self.source[index]
        try:
            return self.fn(item)
        except Exception as err:
            note_error(err, self)
            raise

    def __len__(self) -> int:
        return len(self.source)


@MapDataPipe.register_functional("shuffle")
class MapShuffler(MapDataPipe, RandomOp):
    """A global shuffle by keyed permutation: ``pipe[i]`` is ``source[perm[i]]``, the
    permutation new each epoch and computed per index in O(1) memory."""

    _params = ("enabled",)

    def __init__(self, source: MapDataPipe):
        self.source = source
        self.enabled = True
        self._permutation: KeyedPermutation | None = None

    def set_shuffle(self, enabled: bool = True) -> MapShuffler:
        self.enabled = bool(enabled)
        return self

    def set_randomness(self, randomness: Any) -> None:
        super().set_randomness(randomness)
        self._permutation = None

    def _perm(self) -> KeyedPermutation:
        length = len(self.source)
        if self._permutation is None or self._permutation.n != length:
            randomness = self.randomness()
            self._permutation = KeyedPermutation(length, randomness.key0 ^ (randomness.key1 << 1))
        return self._permutation

    def __getitem__(self, index: int) -> Any:
        index = _check_index(self, index)
        return self.source[self._perm()[index] if self.enabled else index]

    def __len__(self) -> int:
        return len(self.source)


@MapDataPipe.register_functional("batch", aliases={"n": "batch_size"})
class MapBatcher(MapDataPipe):
    """``pipe[i]`` is the list of items ``i * batch_size`` up to ``(i + 1) * batch_size``."""

    _params = ("batch_size", "drop_last")

    def __init__(self, source: MapDataPipe, batch_size: int, drop_last: bool = False):
        check_int("batch_size", batch_size, 1)
        self.source = source
        self.batch_size = batch_size
        self.drop_last = drop_last

    def __getitem__(self, index: int) -> list[Any]:
        index = _check_index(self, index)
        start = index * self.batch_size
        stop = min(start + self.batch_size, len(self.source))
        return [self.source[i] for i in range(start, stop)]

    def __len__(self) -> int:
        length = len(self.source)
        return length // self.batch_size if self.drop_last else -(-length // self.batch_size)


class MapToIterConverter(CountingPipe, IndexedStream):
    """Iterates a random-access pipe in index order; resumes in O(1) from the index. A
    ``sharding_filter`` right after it loads only its shard's items."""

    _counter = "index"

    def __init__(self, source: MapDataPipe):
        if not isinstance(source, MapDataPipe):
            raise TypeError(f"expected a MapDataPipe, got {type(source).__name__}")
        self.source = source

    def __iter__(self) -> Iterator[Any]:
        self._start_count()
        source = self.source
        while self._count < len(source):
            item = source[self._count]
            self._count += 1
            yield item

    def start_indexed_pass(self) -> int:
        return self._start_count()

    def read_at(self, position: int) -> Any:
        item = self.source[position]
        self._count = position + 1
        return item

    def end_indexed_pass(self) -> None:
        self._count = len(self.source)

    def __len__(self) -> int:
        return len(self.source)
