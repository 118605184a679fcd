"""Random-access pipes: ``SequenceWrapper`` and the ops of ``MapDataPipe``.

A random-access pipe resumes in O(1) (an index, no replay) and shuffles globally with a
keyed permutation that needs no memory per item.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from conveyor.core.base import IterDataPipe, MapDataPipe
from conveyor.core.op_roles import RandomOp
from conveyor.core.passes import PassContext, State
from conveyor.core.permutation import KeyedPermutation
from conveyor.core.random import PipeRandomness, fresh_randomness
from conveyor.core.sharding import IndexedPass
from conveyor.core.skips import note_error
from conveyor.core.validation import check_int
from conveyor.errors import StateError
from conveyor.pipes.batch import batch_count

S = TypeVar("S")
T = TypeVar("T")
#: What the wrapped sequence holds: ``SequenceWrapper("ab")`` is a ``SequenceWrapper[str]``.
T_co = TypeVar("T_co", covariant=True)


def _check_index(pipe: MapDataPipe, index: int) -> int:
    length = len(pipe)
    if isinstance(index, bool) or not isinstance(index, int):
        raise TypeError(f"{pipe!r} takes int indices, got {type(index).__name__}")
    if index < 0:
        index += length
    if not 0 <= index < length:
        raise IndexError(f"index {index} out of range for {pipe!r} of length {length}")
    return index


class SequenceWrapper(MapDataPipe[T_co]):
    """Random access to any sequence (``__getitem__`` and ``__len__``); ``deepcopy=True``
    keeps the pipe's own copy, so later changes to the caller's sequence do not leak in.

    Args:
        sequence: Anything with ``__getitem__`` and ``__len__`` (a list, a tuple, a numpy array).
        deepcopy: Keep a deep copy of ``sequence`` rather than the caller's object.
    """

    _params = ("deepcopy",)

    def __init__(self, sequence: Sequence[T_co], deepcopy: bool = True):
        if not hasattr(sequence, "__getitem__") or not hasattr(sequence, "__len__"):
            raise TypeError(f"SequenceWrapper needs __getitem__ and __len__, got {type(sequence).__name__}")
        self.deepcopy = deepcopy
        self._sequence = copy.deepcopy(sequence) if deepcopy else sequence

    def __getitem__(self, index: int) -> T_co:
        return self._sequence[_check_index(self, index)]

    def __len__(self) -> int:
        return len(self._sequence)


class MapMapper(MapDataPipe):
    """``fn`` applied on access: ``pipe[i]`` is ``fn(source[i])``."""

    _params = ("fn",)

    def __init__(self, source: MapDataPipe, fn: Callable[[Any], Any]):
        if not callable(fn):
            raise TypeError(f"map() needs a callable, got {type(fn).__name__}")
        self.source = source
        self.fn = fn

    def __getitem__(self, index: int) -> Any:
        return self.reader()(index)

    def reader(self) -> Callable[[int], Any]:
        read, fn = self.source.reader(), self.fn

        def read_mapped(index: int) -> Any:
            item = read(index)
            try:
                return fn(item)
            except Exception as err:
                note_error(err, self)
                raise

        return read_mapped

    def __len__(self) -> int:
        return len(self.source)


@MapDataPipe.register_functional("map", builds=MapMapper)
def map_(self: MapDataPipe[T], fn: Callable[[T], S]) -> MapDataPipe[S]:
    """Applies ``fn`` to each item when it is read: ``pipe[i]`` is ``fn(source[i])``.

    Args:
        fn: Called with an item; what it returns is the new item.

    Returns:
        A random-access pipe of the results, as long as this one.

    Example:
        >>> from conveyor.pipes import SequenceWrapper
        >>> SequenceWrapper([1, 2, 3]).map(lambda x: x * 10)[2]
        30
    """
    return MapMapper(self, fn)


class MapShuffler(MapDataPipe, RandomOp):
    """A global shuffle by keyed permutation: ``pipe[i]`` is ``source[perm[i]]``, the
    permutation new each epoch and computed per index in O(1) memory.

    Args:
        source: The random-access pipe whose indices are permuted.
    """

    _params = ("enabled",)
    _runtime = MapDataPipe._runtime | {"_memo"}

    def __init__(self, source: MapDataPipe):
        self.source = source
        self.enabled = True

    def set_shuffle(self, enabled: bool = True) -> MapShuffler:
        self.enabled = bool(enabled)
        return self

    def __getitem__(self, index: int) -> Any:
        return self.reader()(_check_index(self, index))

    def reader(self) -> Callable[[int], Any]:
        read = self.source.reader()
        if not self.enabled:
            return read
        permutation = self._permutation()
        return lambda index: read(permutation[index])

    def randomness(self) -> PipeRandomness:
        if self._randomness is None:  # not seeded: draw once, so that indexing agrees with itself
            self._randomness = fresh_randomness(keyed_by_position=False)
        return self._randomness

    def _permutation(self) -> KeyedPermutation:
        """The permutation for the randomness set now (remembered: building one costs more
        than a lookup)."""
        randomness, length = self.randomness(), len(self.source)
        memo = getattr(self, "_memo", None)
        if memo is None or memo[0] is not randomness or memo[1].n != length:
            memo = (randomness, KeyedPermutation(length, randomness.key0 ^ (randomness.key1 << 1)))
            self._memo = memo
        return memo[1]

    def __len__(self) -> int:
        return len(self.source)


@MapDataPipe.register_functional("shuffle", builds=MapShuffler)
def shuffle(self: MapDataPipe[T]) -> MapDataPipe[T]:
    """Shuffles the whole pipe: ``pipe[i]`` is ``source[perm[i]]``.

    The permutation is new each epoch (from the loader's seed) and computed per index, in
    O(1) memory. ``set_shuffle(False)`` on the result keeps the order.

    Returns:
        A random-access pipe of the same items in a shuffled order.

    Example:
        >>> from conveyor.pipes import SequenceWrapper
        >>> sorted(SequenceWrapper(range(5)).shuffle())
        [0, 1, 2, 3, 4]
    """
    return MapShuffler(self)


class MapBatcher(MapDataPipe):
    """``pipe[i]`` is the list of items ``i * batch_size`` up to ``(i + 1) * batch_size``."""

    _params = ("batch_size", "drop_last")

    def __init__(self, source: MapDataPipe, batch_size: int, drop_last: bool = False):
        check_int("batch_size", batch_size, 1)
        self.source = source
        self.batch_size = batch_size
        self.drop_last = drop_last

    def __getitem__(self, index: int) -> list[Any]:
        return self.reader()(_check_index(self, index))

    def reader(self) -> Callable[[int], list[Any]]:
        read, size, length = self.source.reader(), self.batch_size, len(self.source)
        return lambda index: [read(i) for i in range(index * size, min(index * size + size, length))]

    def __len__(self) -> int:
        return batch_count(len(self.source), self.batch_size, self.drop_last)


@MapDataPipe.register_functional("batch", aliases={"n": "batch_size"}, builds=MapBatcher)
def batch(self: MapDataPipe[T], batch_size: int, drop_last: bool = False) -> MapDataPipe[list[T]]:
    """Groups the items into lists: ``pipe[i]`` holds items ``i * batch_size`` onwards.

    Args:
        batch_size: Items per batch (``n=`` is accepted for it too).
        drop_last: Leave out the last batch when it is shorter.

    Returns:
        A random-access pipe of lists.

    Example:
        >>> from conveyor.pipes import SequenceWrapper
        >>> list(SequenceWrapper(range(5)).batch(2))
        [[0, 1], [2, 3], [4]]
    """
    return MapBatcher(self, batch_size, drop_last)


class MapToIterPass(IndexedPass):
    """Reads the items in index order with the reader taken when the pass opened;
    ``index``: the next index."""

    def __init__(self, pipe: MapToIterConverter, state: State | None, context: PassContext):
        super().__init__(pipe, context)
        self.index = self._start = state["index"] if state is not None else 0
        self._reads = 0  # items read by position (a sharding point reading only its own)
        self._read = pipe.source.reader()
        self._length = len(pipe.source)
        self.items = self._in_order()

    def _in_order(self) -> Iterator[Any]:
        read, length = self._read, self._length
        while self.index < length:
            item = read(self.index)
            self.index += 1
            yield item

    def read_at(self, position: int) -> Any:
        item = self._read(position)
        self.index = position + 1
        self._reads += 1
        return item

    def yielded(self) -> int:
        return self._reads or self.index - self._start

    def work_codes(self) -> tuple[Any, ...]:
        return (MapToIterPass.read_at.__code__,)

    def end(self) -> None:
        self.index = self._length

    def length(self) -> int:
        return self._length

    def state(self) -> State:
        return {"index": self.index}


class MapToIterConverter(IterDataPipe):
    """An ``IterDataPipe`` over a random-access pipe's items in index order
    (``map_pipe.to_iter_datapipe()``); resumes in O(1) from the index. A
    ``sharding_filter`` right after it loads only its shard's items.

    Args:
        source: The random-access pipe to read in index order.
    """

    pass_type = MapToIterPass
    state_fields = {"index": int}

    def __init__(self, source: MapDataPipe):
        if not isinstance(source, MapDataPipe):
            raise TypeError(f"expected a MapDataPipe, got {type(source).__name__}")
        self.source = source

    def __len__(self) -> int:
        return len(self.source)

    def check_own_state(self, state: Mapping[str, Any], where: str) -> None:
        if state["index"] > len(self.source):
            raise StateError(f"{where}: index {state['index']} is past the end ({len(self.source)} items)")


@MapDataPipe.register_functional("to_iter_datapipe", builds=MapToIterConverter)
def to_iter_datapipe(self: MapDataPipe[T]) -> IterDataPipe[T]:
    """Reads this random-access pipe in index order, as an ``IterDataPipe``.

    It resumes in O(1) from the index, and a ``sharding_filter`` right after it reads
    only its shard's items.

    Returns:
        An iterable pipe of the items, in index order.

    Example:
        >>> from conveyor.pipes import SequenceWrapper
        >>> list(SequenceWrapper("abc").to_iter_datapipe().enumerate())
        [(0, 'a'), (1, 'b'), (2, 'c')]
    """
    return MapToIterConverter(self)
