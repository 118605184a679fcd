"""``enumerate``: pair each item with its index."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypeVar

from conveyor.core.base import IterDataPipe
from conveyor.core.passes import PassContext, State, ThroughPass

T = TypeVar("T")


class EnumeratorPass(ThroughPass):
    """``count``: items yielded so far in this pass."""

    def __init__(self, pipe: Enumerator, state: State | None, context: PassContext):
        super().__init__(pipe, state, context)
        self.count = self._start = state["count"] if state is not None else 0
        self.items = self._enumerate(pipe.starting_index)

    def _enumerate(self, starting_index: int) -> Iterator[tuple[int, Any]]:
        for item in self.source:
            index = starting_index + self.count
            self.count += 1
            yield index, item

    def own_state(self) -> State:
        return {"count": self.count}

    def yielded(self) -> int:
        return self.count - self._start


class Enumerator(IterDataPipe):
    """Yields ``(index, item)``, the index counting from ``starting_index`` each pass."""

    keeps_order = True
    pass_type = EnumeratorPass
    state_fields = {"count": int, "source": dict}

    _params = ("starting_index",)

    def __init__(self, source: IterDataPipe, starting_index: int = 0):
        self.source = source
        self.starting_index = starting_index

    def __len__(self) -> int:
        return len(self.source)


@IterDataPipe.register_functional("enumerate", builds=Enumerator)
def enumerate_(self: IterDataPipe[T], starting_index: int = 0) -> IterDataPipe[tuple[int, T]]:
    """Pairs each item with its index in the pass.

    Args:
        starting_index: The first item's index.

    Returns:
        A pipe of ``(index, item)`` tuples.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> list(IterableWrapper("ab").enumerate(starting_index=1))
        [(1, 'a'), (2, 'b')]
    """
    return Enumerator(self, starting_index)
