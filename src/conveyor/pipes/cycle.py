"""``cycle``: repeat the input ``count`` times (forever when None)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

from conveyor.core.base import IterDataPipe
from conveyor.core.passes import Pass, PassContext, Position, State
from conveyor.core.validation import check_int
from conveyor.errors import StateError

T = TypeVar("T")


class CyclerPass(Pass):
    """Opens a fresh pass over the input for each round, in a context that carries the
    round, so random ops upstream draw anew each round (and a resumed round draws what
    it drew). ``source`` is the current round's pass (None once the last round ended)."""

    pipe: Cycler

    def __init__(self, pipe: Cycler, state: State | None, context: PassContext):
        super().__init__(pipe, context)
        self.round = state["round"] if state is not None else 0
        resumed_from = state["source"] if state is not None else None
        self._resumed = resumed_from is not None
        self.source: Pass | None = None
        if pipe.count is None or self.round < pipe.count:
            self.source = context.with_round(self.round).open(pipe.source, resumed_from)
        self._done = 0  # items of the rounds already read
        self.items = self._cycle(pipe.count)

    def _cycle(self, count: int | None) -> Iterator[Any]:
        resumed = self._resumed
        while self.source is not None:
            produced = False
            for item in self.source:
                produced = True
                yield item
            if not produced and not resumed:
                return  # an input that yields nothing would make an endless loop
            resumed = False
            self.round += 1
            self._done += self.source.yielded()
            self.context.retire(self.source)
            self.source = None
            if count is None or self.round < count:
                self.source = self.context.with_round(self.round).open(self.pipe.source, None)

    def state(self) -> State:
        return {"round": self.round, "source": self.source.state() if self.source is not None else None}

    def position(self) -> Position | None:
        return self.source.position() if self.source is not None else None

    def yielded(self) -> int:
        return self._done + (self.source.yielded() if self.source is not None else 0)

    def inputs(self) -> list[Pass]:
        return [self.source] if self.source is not None else []


class Cycler(IterDataPipe):
    """Re-reads its input ``count`` times. Random ops upstream draw anew each round. An
    input that yields nothing ends the cycle instead of spinning forever.
    """

    pass_type = CyclerPass
    state_fields = {"round": int, "source": (dict, type(None))}

    _params = ("count",)

    def __init__(self, source: IterDataPipe, count: int | None = None):
        check_int("count", count, 0, allow_none=True)
        self.source = source
        self.count = count

    def check_own_state(self, state: Mapping[str, Any], where: str) -> None:
        if self.count is not None and state["round"] > self.count:
            raise StateError(f"{where}: round {state['round']} is past the last ({self.count})")

    def __len__(self) -> int:
        if self.count is None:
            raise self._no_length("cycle() without a count never ends")
        return len(self.source) * self.count


@IterDataPipe.register_functional("cycle", aliases={"n": "count"}, builds=Cycler)
def cycle(self: IterDataPipe[T], count: int | None = None) -> IterDataPipe[T]:
    """Reads this pipe again and again: ``count`` times, or forever.

    Random ops before it draw anew each round. An input that yields nothing ends the
    cycle instead of spinning forever.

    Args:
        count: How many rounds (``n=`` is accepted for it too); None: without end.

    Returns:
        A pipe of the rounds' items, one round after the other.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> list(IterableWrapper([0, 1]).cycle(3))
        [0, 1, 0, 1, 0, 1]
    """
    return Cycler(self, count)
