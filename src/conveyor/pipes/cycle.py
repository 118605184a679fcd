"""``cycle``: repeat the input ``count`` times (forever when None)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from conveyor.pipes.base import CountingPipe, IterDataPipe, check_int
from conveyor.state import abandon_staged_states, reset_graph


@IterDataPipe.register_functional("cycle", aliases={"n": "count"})
class Cycler(CountingPipe):
    """Re-reads its input ``count`` times. Random ops upstream draw anew each round. An
    input that yields nothing ends the cycle instead of spinning forever.
    """

    _params = ("count",)
    _counter = "round"

    def __init__(self, source: IterDataPipe, count: int | None = None):
        check_int("count", count, 0, allow_none=True)
        self.source = source
        self.count = count

    def __iter__(self) -> Iterator[Any]:
        resumed = self._resuming()
        self._start_count()
        while self.count is None or self._count < self.count:
            if not resumed:
                # A fresh round: nothing upstream may keep a state staged for the resumed
                # round (an op that stopped early, like header, never consumed it), and a
                # random op that it names counts the resumed round's pass as begun, so
                # that this round draws what it drew without the interruption.
                abandon_staged_states(self.source)
                reset_graph(self.source)
            produced = False
            for item in self.source:
                produced = True
                yield item
            if not produced and not resumed:
                return
            resumed = False
            self._count += 1

    def __len__(self) -> int:
        if self.count is None:
            raise self._no_length("cycle() without a count never ends")
        return len(self.source) * self.count
