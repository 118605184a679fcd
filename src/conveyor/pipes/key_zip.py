"""``zip_with_map`` and ``zip_with_iter``: each item joined with the item another pipe
holds under its key (torchdata's ``MapKeyZipper`` and ``IterKeyZipper``).

``zip_with_map`` is per item: the lookup depends on the item alone, so it keeps its
input's order, positions and state, resumes exactly and gives the same output for any
number of workers. The random-access side is read by key, never iterated; it is part of
the graph (workers get their own copy).

``zip_with_iter`` reads the reference input as far as each item's key needs and holds the
reference items read until they are matched. It resumes without saving them
(:mod:`conveyor.pipes.held_items`): its state is the reference input's state before the
oldest reference item held, the reference items read since, and the offsets of those
held; a resume re-reads the reference input from there and holds them again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from conveyor.core.base import IterDataPipe, MapDataPipe
from conveyor.core.passes import Pass, PassContext, Position, State, ThroughPass
from conveyor.core.skips import call_noted, note_error
from conveyor.core.validation import check_int
from conveyor.errors import StateError
from conveyor.pipes.held_items import HeldItems

T = TypeVar("T")
U = TypeVar("U")


class MapKeyZipperPass(ThroughPass):
    def __init__(self, pipe: MapKeyZipper, state: State | None, context: PassContext):
        super().__init__(pipe, state, context)
        self.items = self._join(pipe)

    def _join(self, pipe: MapKeyZipper) -> Iterator[Any]:
        lookup, key_fn, merge_fn, keep_key = pipe.map_datapipe.__getitem__, pipe.key_fn, pipe.merge_fn, pipe.keep_key
        for item in self.source:
            try:
                key = key_fn(item)
                try:
                    found = lookup(key)
                except (KeyError, IndexError):
                    raise KeyError(
                        f"zip_with_map: key_fn maps the item {_short(item)} to {_short(key)}, which is not a key "
                        f"of {type(pipe.map_datapipe).__name__}; check key_fn or the map's keys"
                    ) from None
                joined = merge_fn(item, found) if merge_fn is not None else (item, found)
            except Exception as err:
                note_error(err, pipe)
                raise
            yield (key, joined) if keep_key else joined


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class MapKeyZipper(IterDataPipe):
    """Yields ``merge_fn(item, map_datapipe[key_fn(item)])`` (the pair ``(item, found)``
    without ``merge_fn``), or ``(key, that)`` with ``keep_key``. A key the map does not
    hold is a ``KeyError`` naming the item and the key."""

    per_item = True
    keeps_order = True
    pass_type = MapKeyZipperPass
    state_fields = {"source": dict}
    _params = ("key_fn", "merge_fn", "keep_key")

    def __init__(
        self,
        source: IterDataPipe,
        map_datapipe: MapDataPipe,
        key_fn: Callable[[Any], Any],
        merge_fn: Callable[[Any, Any], Any] | None = None,
        keep_key: bool = False,
    ):
        if not isinstance(map_datapipe, MapDataPipe):
            raise TypeError(f"zip_with_map() takes a MapDataPipe to look keys up in, got {type(map_datapipe).__name__}")
        if not callable(key_fn):
            raise TypeError(f"zip_with_map() needs a callable key_fn, got {type(key_fn).__name__}")
        if merge_fn is not None and not callable(merge_fn):
            raise TypeError(f"zip_with_map() needs a callable merge_fn or None, got {type(merge_fn).__name__}")
        self.source = source
        self.map_datapipe = map_datapipe
        self.key_fn = key_fn
        self.merge_fn = merge_fn
        self.keep_key = keep_key

    def __len__(self) -> int:
        return len(self.source)


@IterDataPipe.register_functional("zip_with_map", builds=MapKeyZipper)
def zip_with_map(
    self: IterDataPipe[T],
    map_datapipe: MapDataPipe[U],
    key_fn: Callable[[T], Any],
    merge_fn: Callable[[T, U], Any] | None = None,
    keep_key: bool = False,
) -> IterDataPipe[Any]:
    """Joins each item with what ``map_datapipe`` holds under the item's key.

    A key the map does not hold is a ``KeyError`` naming the item and the key.

    Args:
        map_datapipe: The random-access pipe looked up (``map_datapipe[key]``).
        key_fn: Called with each item; returns its key.
        merge_fn: Called as ``merge_fn(item, found)``; None: the pair ``(item, found)``.
        keep_key: Yield ``(key, joined)`` instead of the joined value.

    Returns:
        A pipe of the joined items, in order.

    Example:
        >>> from conveyor.pipes import IterableWrapper, SequenceWrapper
        >>> names = SequenceWrapper(["zero", "one", "two"])
        >>> list(IterableWrapper([2, 0]).zip_with_map(names, key_fn=lambda x: x))
        [(2, 'two'), (0, 'zero')]
    """
    return MapKeyZipper(self, map_datapipe, key_fn, merge_fn, keep_key)


class IterKeyZipperPass(Pass):
    """``ref``/``read``/``held``: the reference input's state before the oldest reference
    item held, the reference items read since, and the offsets of those held (in arrival
    order); ``source``: the main input's live state."""

    def __init__(self, pipe: IterKeyZipper, state: State | None, context: PassContext):
        super().__init__(pipe, context)
        self.source = context.open(pipe.source, state["source"] if state is not None else None)
        self.ref = context.open(pipe.ref_datapipe, state["ref"] if state is not None else None)
        self._held = HeldItems(self.ref, pipe, "reference input")
        self._buffer: dict[Any, tuple[int, Any]] = {}  # ref key -> (index, item), in arrival order
        self._position: Position | None = None
        self.count = 0
        self.items = self._zip(pipe, state)

    def _replay(self, pipe: IterKeyZipper, state: State) -> None:
        """Read the reference items since the anchor again and hold again those held."""
        held = self._held
        for index, item in held.replay(state["read"], state["held"]):
            if index in held:
                self._buffer[call_noted(pipe, pipe.ref_key_fn, item)] = (index, item)

    def _zip(self, pipe: IterKeyZipper, state: State | None) -> Iterator[Any]:
        if state is not None:
            self._replay(pipe, state)
        buffer, befores = self._buffer, self._held.befores
        for data in self.source:
            key = call_noted(pipe, pipe.key_fn, data)
            while key not in buffer:
                self._hold_next(pipe, key, data)
            index, found = buffer.pop(key)
            del befores[index]
            joined = pipe.merge_fn(data, found) if pipe.merge_fn is not None else (data, found)
            self._position, self.count = self.source.position(), self.count + 1
            yield (key, joined) if pipe.keep_key else joined

    def _hold_next(self, pipe: IterKeyZipper, key: Any, data: Any) -> None:
        """Read the next reference item and hold it, looking for ``key`` (of ``data``)."""
        ref, held, buffer = self.ref, self._held, self._buffer
        before = ref.state()
        item = next(ref.items, _END)
        if item is _END:
            raise BufferError(
                f"{pipe!r}: no item of the reference input has the key {_short(key)} of {_short(data)}; "
                "raise buffer_size if it was dropped from a full buffer"
            )
        ref_key = call_noted(pipe, pipe.ref_key_fn, item)
        if ref_key in buffer:
            raise ValueError(f"{pipe!r}: the reference input has the key {_short(ref_key)} twice")
        if pipe.buffer_size is not None and len(buffer) > pipe.buffer_size:
            oldest, _ = buffer.pop(next(iter(buffer)))  # the oldest leaves, as torchdata's FIFO
            del held.befores[oldest]
        buffer[ref_key] = (held.count, item)
        held.befores[held.count] = before
        held.count += 1

    def state(self) -> State:
        held = self._held
        return {"read": held.read(), "held": held.offsets(), "ref": held.anchor(), "source": self.source.state()}

    def position(self) -> Position | None:
        return self._position

    def yielded(self) -> int:
        return self.count

    def inputs(self) -> list[Pass]:
        return [self.source, self.ref]


_END = object()


class IterKeyZipper(IterDataPipe):
    """Each item joined with the item of ``ref_datapipe`` that has its key
    (torchdata's ``IterKeyZipper``, same arguments): reference items are read as needed
    and held until matched, at most ``buffer_size`` of them (then the oldest leaves).
    ``merge_fn(item, ref_item)``, else the pair; ``(key, that)`` with ``keep_key``. No
    item is saved in a state: a resume re-reads the reference input from the oldest
    item still held."""

    pass_type = IterKeyZipperPass
    state_fields = {"read": int, "held": list, "ref": dict, "source": dict}
    _params = ("key_fn", "ref_key_fn", "keep_key", "buffer_size", "merge_fn")

    def __init__(
        self,
        source: IterDataPipe,
        ref_datapipe: IterDataPipe,
        key_fn: Callable[[Any], Any],
        ref_key_fn: Callable[[Any], Any] | None = None,
        keep_key: bool = False,
        buffer_size: int | None = 10000,
        merge_fn: Callable[[Any, Any], Any] | None = None,
    ):
        if not isinstance(ref_datapipe, IterDataPipe):
            raise TypeError(f"zip_with_iter() takes an IterDataPipe to match, got {type(ref_datapipe).__name__}")
        for name, fn in (("key_fn", key_fn), ("ref_key_fn", ref_key_fn), ("merge_fn", merge_fn)):
            if fn is not None and not callable(fn):
                raise TypeError(f"zip_with_iter(): {name} must be callable, got {type(fn).__name__}")
        check_int("buffer_size", buffer_size, 1, allow_none=True)
        self.source = source
        self.ref_datapipe = ref_datapipe
        self.key_fn = key_fn
        self.ref_key_fn = ref_key_fn if ref_key_fn is not None else key_fn
        self.keep_key = keep_key
        self.buffer_size = buffer_size
        self.merge_fn = merge_fn

    def substates(self, state: Mapping[str, Any]) -> list[tuple[IterDataPipe, Any, str]]:
        return [(self.source, state["source"], "source"), (self.ref_datapipe, state["ref"], "ref")]

    def check_own_state(self, state: Mapping[str, Any], where: str) -> None:
        held = state["held"]
        if not all(type(o) is int and 0 <= o < max(state["read"], 1) for o in held) or len(set(held)) != len(held):
            raise StateError(f"{where}: 'held' must be distinct offsets below 'read'")


@IterDataPipe.register_functional("zip_with_iter", builds=IterKeyZipper)
def zip_with_iter(
    self: IterDataPipe[T],
    ref_datapipe: IterDataPipe[U],
    key_fn: Callable[[T], Any],
    ref_key_fn: Callable[[U], Any] | None = None,
    keep_key: bool = False,
    buffer_size: int | None = 10000,
    merge_fn: Callable[[T, U], Any] | None = None,
) -> IterDataPipe[Any]:
    """Joins each item with the item of ``ref_datapipe`` that has the same key.

    Reference items are read as far as each key needs and held until matched; a resume
    re-reads the reference pipe from the oldest one held instead of saving items.

    Args:
        ref_datapipe: The pipe whose items are looked up.
        key_fn: Called with each item; returns its key.
        ref_key_fn: Called with each reference item; returns its key (None: ``key_fn``).
        keep_key: Yield ``(key, joined)`` instead of the joined value.
        buffer_size: How many reference items may be held (then the oldest leaves);
            None: no bound.
        merge_fn: Called as ``merge_fn(item, ref_item)``; None: the pair.

    Returns:
        A pipe of the joined items, in this pipe's order.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> labels = IterableWrapper([("b", 1), ("a", 0)])
        >>> list(IterableWrapper(["a", "b"]).zip_with_iter(labels, lambda x: x, lambda r: r[0]))
        [('a', ('a', 0)), ('b', ('b', 1))]
    """
    return IterKeyZipper(self, ref_datapipe, key_fn, ref_key_fn, keep_key, buffer_size, merge_fn)
