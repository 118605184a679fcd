"""``shuffled_flatmap``: the parts of ``fn(item)`` for every item, interleaved at random
from up to ``buffer_size`` items at once (torchdata's ``ShuffledFlatMapper``, same
arguments).

While the buffer is full (and at the input's end, until it is empty) each part comes from
a buffered item drawn at random; an item whose parts ran out leaves. Draws come from a
generator keyed by their number, so an epoch draws the same for the same seed and a
resume draws what the interrupted pass would have.

Resume without saving items or parts (:mod:`conveyor.pipes.held_items`): the state is the
input's state before the oldest item buffered, the items read since, the buffered items as
``[offset, parts taken]`` in buffer order, and the draws made. A resume re-reads the input
from there, expands the buffered items again and passes over the parts they had given.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar, overload

from conveyor.core.base import IterDataPipe
from conveyor.core.op_roles import RandomOp
from conveyor.core.passes import Pass, PassContext, Position, State
from conveyor.core.random import PipeRandomness
from conveyor.core.skips import note_error
from conveyor.core.validation import check_int
from conveyor.errors import StateError
from conveyor.pipes.held_items import HeldItems

S = TypeVar("S")
T = TypeVar("T")


class _Open:
    """A buffered item: its index in the pass, its parts, the parts taken."""

    __slots__ = ("index", "parts", "taken")

    def __init__(self, index: int, parts: Iterator[Any], taken: int) -> None:
        self.index, self.parts, self.taken = index, parts, taken


class ShuffledFlatMapperPass(Pass):
    def __init__(self, pipe: ShuffledFlatMapper, state: State | None, context: PassContext):
        super().__init__(pipe, context)
        self.source = context.open(pipe.source, state["source"] if state is not None else None)
        self._held = HeldItems(self.source, pipe)  # the items buffered
        self._buffer: list[_Open] = []
        self.draws = state["draws"] if state is not None else 0
        self._ended = False
        self.count = 0
        self.items = self._shuffle(pipe, pipe.randomness() if pipe.enabled else None, state)

    def _expand(self, pipe: ShuffledFlatMapper, item: Any) -> Iterator[Any]:
        try:
            return iter(pipe.apply(item))
        except Exception as err:
            note_error(err, pipe)
            raise

    def _replay(self, pipe: ShuffledFlatMapper, state: State) -> None:
        """Read the items since the anchor again, expand those buffered, pass over the parts taken."""
        held, saved = self._held, state["buffer"]
        slots = {offset: k for k, (offset, _) in enumerate(saved)}  # offset -> its place in the buffer
        buffer: list[_Open | None] = [None] * len(slots)
        for index, item in held.replay(state["read"], slots):
            if index in held:
                taken = saved[slots[index]][1]
                parts = self._expand(pipe, item)
                for _ in itertools.islice(parts, taken):
                    pass
                buffer[slots[index]] = _Open(index, parts, taken)
        self._buffer = [entry for entry in buffer if entry is not None]

    def _shuffle(
        self, pipe: ShuffledFlatMapper, randomness: PipeRandomness | None, state: State | None
    ) -> Iterator[Any]:
        """Disabled (``randomness`` None): a buffer of one item, its parts in order (flatmap)."""
        if state is not None:
            self._replay(pipe, state)
        source, buffer, held, rounds = self.source, self._buffer, self._held, self.context.rounds
        befores = held.befores
        size = pipe.buffer_size if randomness is not None else 1
        while True:
            while len(buffer) == size or (buffer and self._ended):
                pick = 0
                if randomness is not None:
                    pick = int(randomness.generator(*rounds, self.draws).integers(len(buffer)))
                    self.draws += 1
                entry = buffer[pick]
                part = next(entry.parts, _END)
                if part is _END:
                    del buffer[pick]
                    del befores[entry.index]
                    continue
                entry.taken += 1
                self.count += 1
                yield part
            if self._ended:
                return
            before = source.state()
            item = next(source.items, _END)
            if item is _END:
                self._ended = True
                continue
            buffer.append(_Open(held.count, self._expand(pipe, item), 0))
            befores[held.count] = before
            held.count += 1

    def state(self) -> State:
        held = self._held
        oldest = held.oldest()
        return {
            "draws": self.draws,
            "read": held.read(),
            "buffer": [[entry.index - oldest, entry.taken] for entry in self._buffer],
            "source": held.anchor(),
        }

    def position(self) -> Position | None:
        return None  # parts of many items interleave

    def yielded(self) -> int:
        return self.count

    def inputs(self) -> list[Pass]:
        return [self.source]


_END = object()


class ShuffledFlatMapper(IterDataPipe, RandomOp):
    """The parts of ``fn(item)`` (of ``item`` itself without ``fn``; ``input_col`` as
    torchdata's) interleaved at random from ``buffer_size`` items (see the module).
    ``set_shuffle(False)`` makes it a plain ``flatmap``."""

    replays_input = True
    pass_type = ShuffledFlatMapperPass
    state_fields = {"draws": int, "read": int, "buffer": list, "source": dict}
    _params = ("fn", "input_col", "buffer_size", "enabled")

    def __init__(
        self,
        source: IterDataPipe,
        fn: Callable[..., Iterable[Any]] | None = None,
        input_col: Any = None,
        buffer_size: int = 100,
    ):
        if fn is not None and not callable(fn):
            raise TypeError(f"shuffled_flatmap() needs a callable or None, got {type(fn).__name__}")
        if fn is None and input_col is not None:
            raise ValueError("shuffled_flatmap(): input_col needs fn")
        check_int("buffer_size", buffer_size, 1)
        self.source = source
        self.fn = fn
        self.input_col = input_col
        self.buffer_size = buffer_size
        self.enabled = True

    def apply(self, item: Any) -> Iterable[Any]:
        if self.fn is None:
            return item
        if self.input_col is None:
            return self.fn(item)
        if isinstance(self.input_col, (list, tuple)):
            return self.fn(*(item[col] for col in self.input_col))
        return self.fn(item[self.input_col])

    def set_shuffle(self, enabled: bool = True) -> ShuffledFlatMapper:
        self.enabled = bool(enabled)
        return self

    def check_own_state(self, state: Mapping[str, Any], where: str) -> None:
        offsets = []
        for entry in state["buffer"]:
            if not (isinstance(entry, list) and len(entry) == 2 and all(type(v) is int and v >= 0 for v in entry)):
                raise StateError(f"{where}: 'buffer' must hold [offset, parts taken] pairs of ints >= 0")
            offsets.append(entry[0])
        if len(set(offsets)) != len(offsets) or any(o >= max(state["read"], 1) for o in offsets):
            raise StateError(f"{where}: 'buffer' offsets must be distinct and below 'read'")
        if len(offsets) > self.buffer_size:
            raise StateError(f"{where}: 'buffer' holds more than buffer_size={self.buffer_size} items")


@overload
def shuffled_flatmap(
    self: IterDataPipe[Iterable[S]], fn: None = None, input_col: None = None, buffer_size: int = 100
) -> IterDataPipe[S]: ...
@overload
def shuffled_flatmap(
    self: IterDataPipe[T], fn: Callable[[T], Iterable[S]], input_col: None = None, buffer_size: int = 100
) -> IterDataPipe[S]: ...
@overload
def shuffled_flatmap(
    self: IterDataPipe[Any], fn: Callable[..., Iterable[Any]] | None, input_col: Any, buffer_size: int = 100
) -> IterDataPipe[Any]: ...
@IterDataPipe.register_functional("shuffled_flatmap", builds=ShuffledFlatMapper)
def shuffled_flatmap(
    self: IterDataPipe[Any],
    fn: Callable[..., Iterable[Any]] | None = None,
    input_col: Any = None,
    buffer_size: int = 100,
) -> IterDataPipe[Any]:
    """Expands items as ``flatmap`` does, interleaving the parts of ``buffer_size`` items at random.

    For items that expand into many parts (files into records): the parts of several
    items mix without holding them all. ``set_shuffle(False)`` on the result makes it a
    plain ``flatmap``.

    Args:
        fn: Called with each item (or its ``input_col``); returns an iterable of parts.
            None: the items are iterables themselves.
        input_col: Give ``fn`` only this column of each item (torchdata's argument).
        buffer_size: How many items are being expanded at once.

    Returns:
        A pipe of the parts, in a shuffled order.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> sorted(IterableWrapper([[0, 1], [2, 3]]).shuffled_flatmap(buffer_size=2))
        [0, 1, 2, 3]
    """
    return ShuffledFlatMapper(self, fn, input_col, buffer_size)
