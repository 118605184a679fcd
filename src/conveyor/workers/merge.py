"""Merging the workers' outputs into one deterministic stream, and its state. No I/O.

``in_order=True`` with a sharding point: items leave in order of their position at the
sharding point (ties by worker id), which for per-item pipelines is exactly the order of
a single process, whatever the number of workers. An item may leave once every other
worker either has a buffered item behind it, has already passed its position, or is
done; a worker that dropped items (``filter``) is waited for until it shows where it is.
Without a sharding point the merge is a strict round robin over workers.
``in_order=False`` hands out whatever arrived first.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from conveyor.errors import StateError
from conveyor.state import require_keys

#: ``next_entry`` result: wait for a message from this worker (or from any, when None).
NEED = "need"


@dataclass
class Lane:
    """One worker's side of the merge."""

    entries: deque[tuple[Any, Any, Any]] = field(default_factory=deque)  # (item, state, position)
    ended: bool = False  # the worker sent EpochEnd
    bound: Any = None  # position of the last item handed out from this lane
    last_state: Any = None  # worker state after that item (None: nothing handed out yet)
    chunks_in_lane: deque[int] = field(default_factory=deque)  # entries left per received chunk

    @property
    def done(self) -> bool:
        return self.ended and not self.entries


class Merge:
    """Chooses which worker's item the user gets next and remembers where each lane is."""

    def __init__(self, num_workers: int, in_order: bool, positional: bool):
        self.in_order = in_order
        self.positional = positional
        self.lanes = [Lane() for _ in range(num_workers)]
        self.turn = 0  # round robin: the lane whose item comes next
        self.arrivals: deque[int] = deque()  # in_order=False: lanes in arrival order
        self.last_lane: int | None = None

    # --- input ---------------------------------------------------------------------------

    def add_chunk(self, lane: int, entries: list[tuple[Any, Any, Any]]) -> None:
        target = self.lanes[lane]
        target.entries.extend(entries)
        target.chunks_in_lane.append(len(entries))
        if not self.in_order:
            self.arrivals.extend([lane] * len(entries))

    def end_lane(self, lane: int) -> None:
        self.lanes[lane].ended = True

    # --- output --------------------------------------------------------------------------

    def next_entry(self) -> tuple[str, Any]:
        """``("item", (lane, (item, state, position), freed_chunk))``, ``(NEED, lane_or_None)``
        or ``("done", None)``."""
        if all(lane.done for lane in self.lanes):
            return "done", None
        if not self.in_order:
            return self._take(self.arrivals.popleft()) if self.arrivals else (NEED, None)
        if self.positional:
            return self._next_by_position()
        return self._next_round_robin()

    def _next_round_robin(self) -> tuple[str, Any]:
        count = len(self.lanes)
        for _ in range(count):
            lane = self.lanes[self.turn]
            if lane.done:
                self.turn = (self.turn + 1) % count
                continue
            if not lane.entries:
                return NEED, self.turn
            chosen = self.turn
            self.turn = (self.turn + 1) % count
            return self._take(chosen)
        return "done", None

    def _next_by_position(self) -> tuple[str, Any]:
        best, best_position = None, None
        for index, lane in enumerate(self.lanes):
            if lane.entries:
                position = lane.entries[0][2]
                if best is None or position < best_position:
                    best, best_position = index, position
        if best is None:
            waiting = next(i for i, lane in enumerate(self.lanes) if not lane.done)
            return NEED, waiting
        for index, lane in enumerate(self.lanes):
            if index == best or lane.entries or lane.ended:
                continue
            if lane.bound is None or not lane.bound > best_position:
                return NEED, index
        return self._take(best)

    def _take(self, index: int) -> tuple[str, Any]:
        lane = self.lanes[index]
        entry = lane.entries.popleft()
        lane.bound, lane.last_state = entry[2], entry[1]
        self.last_lane = index
        lane.chunks_in_lane[0] -= 1
        freed = False
        if lane.chunks_in_lane[0] == 0:
            lane.chunks_in_lane.popleft()
            freed = True
        return "item", (index, entry, freed)

    # --- state ---------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Where the merge is, given the items handed out (buffered ones are not counted)."""
        return {
            "turn": self.turn,
            "last_lane": self.last_lane,
            "bounds": [_plain_position(lane.bound) for lane in self.lanes],
            "ended": [lane.done for lane in self.lanes],
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state`; ``ended`` lanes are those whose items were all handed out."""
        self.turn = state["turn"]
        self.last_lane = state["last_lane"]
        for lane, bound, ended in zip(self.lanes, state["bounds"], state["ended"], strict=True):
            lane.bound = tuple(bound) if bound is not None else None
            lane.ended = ended


def check_merge_state(state: Any, num_workers: int, where: str) -> None:
    require_keys(state, {"turn": int, "last_lane": (int, type(None)), "bounds": list, "ended": list}, where)
    if len(state["bounds"]) != num_workers or len(state["ended"]) != num_workers:
        raise StateError(f"{where}: expected {num_workers} lanes")
    if not 0 <= state["turn"] < max(num_workers, 1):
        raise StateError(f"{where}: 'turn' out of range")
    if state["last_lane"] is not None and not 0 <= state["last_lane"] < num_workers:
        raise StateError(f"{where}: 'last_lane' out of range")
    for bound in state["bounds"]:
        if bound is not None and not (
            isinstance(bound, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in bound)
        ):
            raise StateError(f"{where}: a bound must be a list of ints or None, got {bound!r}")
    if not all(isinstance(e, bool) for e in state["ended"]):
        raise StateError(f"{where}: 'ended' must hold bools")


def _plain_position(position: Any) -> list[int] | None:
    return list(position) if position is not None else None
