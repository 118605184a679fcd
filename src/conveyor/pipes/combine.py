"""Ops that read several inputs one after another or side by side: ``concat``, ``zip`` and
``zip_longest`` (``mux`` has its own module)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, TypeVar, overload

from conveyor.core.base import IterDataPipe
from conveyor.core.passes import Pass, PassContext, Position, State
from conveyor.core.torch_support import is_torch_iter_datapipe
from conveyor.errors import StateError

T = TypeVar("T")
U = TypeVar("U")
V = TypeVar("V")


def check_inputs(name: str, sources: tuple[Any, ...]) -> tuple[IterDataPipe, ...]:
    if not sources:
        raise ValueError(f"{name}() needs at least one input pipe")
    for source in sources:
        if not (isinstance(source, IterDataPipe) or is_torch_iter_datapipe(source)):
            raise TypeError(f"{name}() takes IterDataPipes, got {type(source).__name__}")
    return tuple(sources)


class ConcaterPass(Pass):
    """``current``: the input being read; ``source``: its pass (None once all ended)."""

    def __init__(self, pipe: Concater, state: State | None, context: PassContext):
        super().__init__(pipe, context)
        self.current = state["current"] if state is not None else 0
        saved = state["source"] if state is not None else None
        self.source = context.open(pipe.sources[self.current], saved) if self.current < len(pipe.sources) else None
        self._done = 0  # items of the inputs already read
        self.items = self._concat(pipe.sources)

    def _concat(self, sources: tuple[IterDataPipe, ...]) -> Iterator[Any]:
        while self.source is not None:
            yield from self.source
            self._done += self.source.yielded()
            self.context.retire(self.source)
            self.source.close()  # an input that stopped early (header) ends now; a fork's branch lets go
            self.current += 1
            self.source = self.context.open(sources[self.current], None) if self.current < len(sources) else None

    def yielded(self) -> int:
        return self._done + (self.source.yielded() if self.source is not None else 0)

    def state(self) -> State:
        return {"current": self.current, "source": self.source.state() if self.source is not None else None}

    def position(self) -> Position | None:
        return self.source.position() if self.source is not None else None

    def inputs(self) -> list[Pass]:
        return [self.source] if self.source is not None else []


class Concater(IterDataPipe):
    """All items of the first input, then of the second, and so on."""

    pass_type = ConcaterPass
    state_fields = {"current": int, "source": (dict, type(None))}

    def __init__(self, *sources: IterDataPipe):
        self.sources = check_inputs("concat", sources)

    def __len__(self) -> int:
        return sum(len(source) for source in self.sources)

    def check_own_state(self, state: Mapping[str, Any], where: str) -> None:
        if state["current"] > len(self.sources):
            raise StateError(f"{where}: 'current' must be in [0, {len(self.sources)}], got {state['current']}")
        if (state["source"] is None) != (state["current"] == len(self.sources)):
            raise StateError(f"{where}: 'source' must hold the current input's state, and only while one is read")

    def substates(self, state: Mapping[str, Any]) -> list[tuple[IterDataPipe, Any, str]]:
        if state["source"] is None:
            return []
        return [(self.sources[state["current"]], state["source"], "source")]


@IterDataPipe.register_functional("concat", builds=Concater)
def concat(self: IterDataPipe[T], *others: IterDataPipe[T]) -> IterDataPipe[T]:
    """Yields all items of this pipe, then of each of ``others`` in turn.

    Args:
        *others: The pipes read after this one.

    Returns:
        A pipe of every input's items.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> list(IterableWrapper([0, 1]).concat(IterableWrapper([2]), IterableWrapper([3])))
        [0, 1, 2, 3]
    """
    return Concater(self, *others)


class ZipperPass(Pass):
    def __init__(self, pipe: Zipper, state: State | None, context: PassContext):
        super().__init__(pipe, context)
        saved = state["sources"] if state is not None else [None] * len(pipe.sources)
        self.sources = [context.open(p, s) for p, s in zip(pipe.sources, saved, strict=True)]
        self.items = zip(*(source.items for source in self.sources))  # noqa: B905 - stops at the shortest

    def state(self) -> State:
        return {"sources": [source.state() for source in self.sources]}

    def position(self) -> Position | None:
        return self.sources[0].position()

    def yielded(self) -> int:
        return min(source.yielded() for source in self.sources)

    def inputs(self) -> list[Pass]:
        return list(self.sources)


class Zipper(IterDataPipe):
    """Tuples of one item from each input, until the shortest input ends."""

    pass_type = ZipperPass
    state_fields = {"sources": list}

    def __init__(self, *sources: IterDataPipe):
        self.sources = check_inputs("zip", sources)

    def __len__(self) -> int:
        return min(len(source) for source in self.sources)


@overload
def zip_(self: IterDataPipe[T], other: IterDataPipe[U], /) -> IterDataPipe[tuple[T, U]]: ...
@overload
def zip_(self: IterDataPipe[T], other: IterDataPipe[U], third: IterDataPipe[V], /) -> IterDataPipe[tuple[T, U, V]]: ...
@overload
def zip_(self: IterDataPipe[Any], *others: IterDataPipe[Any]) -> IterDataPipe[tuple[Any, ...]]: ...
@IterDataPipe.register_functional("zip", builds=Zipper)
def zip_(self: IterDataPipe[Any], *others: IterDataPipe[Any]) -> IterDataPipe[tuple[Any, ...]]:
    """Yields tuples of one item from this pipe and one from each of ``others``.

    Stops when the shortest input ends (``zip_longest`` goes on to the longest).

    Args:
        *others: The pipes whose items join this one's.

    Returns:
        A pipe of tuples, one element per input.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> list(IterableWrapper([0, 1, 2]).zip(IterableWrapper("ab")))
        [(0, 'a'), (1, 'b')]
    """
    return Zipper(self, *others)


class ZipperLongestPass(Pass):
    def __init__(self, pipe: ZipperLongest, state: State | None, context: PassContext):
        super().__init__(pipe, context)
        saved = state["sources"] if state is not None else [None] * len(pipe.sources)
        # An input that had ended resumes ended (its state is after its last item).
        self.sources = [context.open(p, s) for p, s in zip(pipe.sources, saved, strict=True)]
        self.items = self._zip(pipe.fill_value)

    def _zip(self, fill_value: Any) -> Iterator[tuple[Any, ...]]:
        readers = [source.items for source in self.sources]
        ended = [False] * len(readers)
        while True:
            values = []
            for i, reader in enumerate(readers):
                value = fill_value if ended[i] else next(reader, _END)
                if value is _END:
                    ended[i] = True
                    if all(ended):
                        return
                    value = fill_value
                values.append(value)
            yield tuple(values)

    def state(self) -> State:
        return {"sources": [source.state() for source in self.sources]}

    def position(self) -> Position | None:
        return None  # the inputs end at different items: no input's position names every tuple

    def yielded(self) -> int:
        return max(source.yielded() for source in self.sources)

    def inputs(self) -> list[Pass]:
        return list(self.sources)


_END = object()


class ZipperLongest(IterDataPipe):
    """Tuples of one item from each input until the longest ends; an input that ended
    gives ``fill_value`` (torchdata's ``zip_longest``)."""

    pass_type = ZipperLongestPass
    state_fields = {"sources": list}
    _params = ("fill_value",)

    def __init__(self, *sources: IterDataPipe, fill_value: Any = None):
        self.sources = check_inputs("zip_longest", sources)
        self.fill_value = fill_value

    def __len__(self) -> int:
        return max(len(source) for source in self.sources)


@IterDataPipe.register_functional("zip_longest", builds=ZipperLongest)
def zip_longest(
    self: IterDataPipe[Any], *others: IterDataPipe[Any], fill_value: Any = None
) -> IterDataPipe[tuple[Any, ...]]:
    """Yields tuples of one item from each input until the longest one ends.

    Args:
        *others: The pipes whose items join this one's.
        fill_value: What an input that has ended gives.

    Returns:
        A pipe of tuples, one element per input.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> list(IterableWrapper([0, 1, 2]).zip_longest(IterableWrapper("ab"), fill_value="-"))
        [(0, 'a'), (1, 'b'), (2, '-')]
    """
    return ZipperLongest(self, *others, fill_value=fill_value)
