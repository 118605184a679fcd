"""``header``: the first ``limit`` items."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypeVar

from conveyor.core.base import IterDataPipe
from conveyor.core.passes import PassContext, State, ThroughPass
from conveyor.core.validation import check_int

T = TypeVar("T")


class HeaderPass(ThroughPass):
    """``count``: items yielded so far in this pass."""

    def __init__(self, pipe: Header, state: State | None, context: PassContext):
        super().__init__(pipe, state, context)
        self.count = self._start = state["count"] if state is not None else 0
        self.items = self._head(pipe.limit)

    def _head(self, limit: int) -> Iterator[Any]:
        if self.count >= limit:
            return
        for item in self.source:
            self.count += 1
            yield item
            if self.count >= limit:
                self.source.close()  # read no further: what it holds (a thread, a file) goes now
                return

    def own_state(self) -> State:
        return {"count": self.count}

    def yielded(self) -> int:
        return self.count - self._start


class Header(IterDataPipe):
    """Yields at most ``limit`` items, and never reads an item past them."""

    keeps_order = True
    pass_type = HeaderPass
    state_fields = {"count": int, "source": dict}

    _params = ("limit",)

    def __init__(self, source: IterDataPipe, limit: int = 10):
        check_int("limit", limit, 0)
        self.source = source
        self.limit = limit

    def __len__(self) -> int:
        try:
            return min(self.limit, len(self.source))
        except TypeError:
            raise self._no_length(f"its input may hold fewer than {self.limit} items") from None


@IterDataPipe.register_functional("header", aliases={"n": "limit"}, builds=Header)
def header(self: IterDataPipe[T], limit: int = 10) -> IterDataPipe[T]:
    """Yields the first ``limit`` items, reading no item past them.

    Args:
        limit: How many items at most (``n=`` is accepted for it too).

    Returns:
        A pipe of at most ``limit`` items.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> list(IterableWrapper(range(100)).header(3))
        [0, 1, 2]
    """
    return Header(self, limit)
