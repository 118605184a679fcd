"""``cycle``: repeat the input ``count`` times (forever when None)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from conveyor.pipes.base import IterDataPipe, check_int
from conveyor.state import require_keys, require_non_negative, reset_graph


@IterDataPipe.register_functional("cycle")
class Cycler(IterDataPipe):
    """Re-reads its input ``count`` times. Random ops upstream draw anew each round. An
    input that yields nothing ends the cycle instead of spinning forever.
    """

    _params = ("count",)

    def __init__(self, source: IterDataPipe, count: int | None = None):
        check_int("count", count, 0, allow_none=True)
        self.source = source
        self.count = count
        self._round = 0

    def __iter__(self) -> Iterator[Any]:
        resume = self._take_restored()
        self._round = resume["round"] if resume else 0
        resumed = resume is not None
        while self.count is None or self._round < self.count:
            if not resumed:
                # A fresh round: nothing upstream may keep a state staged for the resumed
                # round (an op that stopped early, like header, never consumed it).
                reset_graph(self.source)
            produced = False
            for item in self.source:
                produced = True
                yield item
            if not produced and not resumed:
                return
            resumed = False
            self._round += 1

    def __len__(self) -> int:
        if self.count is None:
            raise self._no_length("cycle() without a count never ends")
        return len(self.source) * self.count

    def reset(self) -> None:
        super().reset()
        self._round = 0

    def _current_state(self) -> dict[str, Any]:
        return {"round": self._round}

    def _check_state(self, state: Mapping[str, Any]) -> None:
        require_keys(state, {"round": int}, repr(self))
        require_non_negative(state, "round", repr(self))
