"""``set_length``: declare the length of a pipe whose length cannot be derived."""

from __future__ import annotations

from typing import TypeVar

from conveyor.core.base import IterDataPipe
from conveyor.core.passes import PassContext, State, ThroughPass
from conveyor.core.validation import check_int

T = TypeVar("T")


class LengthSetterPass(ThroughPass):
    def __init__(self, pipe: LengthSetter, state: State | None, context: PassContext):
        super().__init__(pipe, state, context)
        self.items = self.source.items


class LengthSetter(IterDataPipe):
    """Passes items through; ``len()`` returns ``length`` (the items are not counted)."""

    per_item = True
    keeps_order = True
    pass_type = LengthSetterPass
    state_fields = {"source": dict}

    _params = ("length",)

    def __init__(self, source: IterDataPipe, length: int):
        check_int("length", length, 0)
        self.source = source
        self.length = length

    def __len__(self) -> int:
        return self.length


@IterDataPipe.register_functional("set_length", aliases={"n": "length"}, builds=LengthSetter)
def set_length(self: IterDataPipe[T], length: int) -> IterDataPipe[T]:
    """Says how many items this pipe has, for a pipe whose ``len()`` is not known.

    The items are not counted: ``len()`` returns ``length`` whatever passes.

    Args:
        length: The ``len()`` to report (``n=`` is accepted for it too).

    Returns:
        A pipe of the same items, with a ``len()``.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> pipe = IterableWrapper(range(10)).filter(lambda x: x % 2 == 0).set_length(5)
        >>> len(pipe)
        5
    """
    return LengthSetter(self, length)
