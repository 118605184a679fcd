"""``set_length``: declare the length of a pipe whose length cannot be derived."""

from __future__ import annotations

from conveyor.core.base import IterDataPipe, check_int
from conveyor.core.passes import PassContext, State, ThroughPass


class LengthSetterPass(ThroughPass):
    def __init__(self, pipe: LengthSetter, state: State | None, context: PassContext):
        super().__init__(pipe, state, context)
        self.items = self.source.items


@IterDataPipe.register_functional("set_length", aliases={"n": "length"})
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
