"""Merging the workers' outputs into one deterministic stream. No I/O.

``in_order=True`` with a sharding point: items leave in order of their position at the
sharding point, which for per-item pipelines is exactly the order of a single process,
whatever the number of workers. Each lane (worker) yields increasing positions, so every
future item of a lane lies beyond its *frontier* (its last buffered position, or the last
one it handed out); all buffered items up to the smallest frontier among unfinished
lanes can leave at once, in position order. A worker that dropped items (``filter``) is
waited for until it shows where it is. Without a sharding point the merge is a strict
round robin over workers; ``in_order=False`` hands out whatever arrived first.

The merge works in runs (lists of entries) rather than item by item: deciding once per
run keeps the per-item cost in the main process to a few list operations.

A worker whose pipeline raised ends its lane with that error (:meth:`Merge.fail_lane`),
at the position of the item it was working on: the error is raised once every item that
comes before it in the merged order has left, as a single process would raise it.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, Final

from conveyor.core.state import require_keys
from conveyor.core.validation import require_position
from conveyor.errors import ConveyorError, StateError
from conveyor.workers.transport.chunk_states import ChunkStates, StateRef, resolve

#: An entry of the merge: ``(lane, item, index, position, states)``: the worker that sent
#: the item, the item (None once handed out), its place in its chunk, its position at the
#: sharding point, and its chunk's states (``states[index]`` is the worker's state after
#: it; see :mod:`conveyor.workers.transport.chunk_states`). Read only through the field
#: names below. A plain tuple, made in C by ``zip`` a chunk at a time: instances of a
#: class (a NamedTuple's included) cost about three times as much to make, read and free,
#: measured, and the main process makes one per item.
Entry = tuple[int, Any, Any, Any, ChunkStates | None]
LANE: Final = 0
ITEM: Final = 1
INDEX: Final = 2
POSITION: Final = 3
STATES: Final = 4

_POSITION = itemgetter(POSITION)
_BEYOND_ANY_SUB_POSITION = 1 << 62


def _state_of(entry: Entry) -> Any:
    """The worker's state after the entry's item (None for a skipped item's record)."""
    return entry[STATES][entry[INDEX]]  # type: ignore[index]


@dataclass
class Lane:
    """One worker's side of the merge."""

    entries: deque[Entry] = field(default_factory=deque)
    chunk_sizes: deque[int] = field(default_factory=deque)  # entries left of each received chunk
    ended: bool = False  # the worker sent EpochEnd
    bound: Any = None  # position of the last entry that left this lane
    floor: Any = None  # dispatch mode: the worker's later outputs all lie beyond this
    failure: BaseException | None = None  # the worker's pipeline raised this ...
    failed_at: Any = None  # ... working on the item at this position (None: unknown)
    received: Any = None  # the worker's state after the last item received from it (or a StateRef)
    void_chunks: int = 0  # chunks of a dead worker's still here: their use grants no credit

    @property
    def done(self) -> bool:
        return self.ended and not self.entries and self.failure is None


class Merge:
    """Chooses the order in which buffered worker outputs reach the user."""

    def __init__(self, num_workers: int, in_order: bool, positional: bool, sub_positions: bool = True):
        self.in_order = in_order
        self.positional = positional
        # Without ops that make several items of one position (flatmap, unbatch), a lane's
        # next item lies at the next whole position or beyond: it need not be waited for to
        # know that (a worker stuck in a slow item does not hold back items before it).
        self._beyond_last = not sub_positions
        self.lanes = [Lane() for _ in range(num_workers)]
        self.turn = 0  # round robin: the lane whose entry comes next
        self._lowest: list[int] = []  # by position: the lanes the last empty run waits for
        if positional:
            # Worker w only ever sees positions >= w (it keeps every num_workers-th item
            # from w on, or every one after that when ranks share too), so the first item
            # can leave before the other workers have said anything.
            for index, lane in enumerate(self.lanes):
                lane.floor = (index - 1, _BEYOND_ANY_SUB_POSITION)

    def add_chunk(self, lane: int, items: Sequence[Any], positions: Sequence[Any], states: ChunkStates) -> None:
        """A chunk from worker ``lane``: its items, their positions and their states."""
        target = self.lanes[lane]
        if self.positional and self.in_order:
            self._check_increasing(lane, target, positions)
        lanes, indices, chunks = itertools.repeat(lane), itertools.count(), itertools.repeat(states)
        # Entries made in C; items and positions have one length (the chunk's), the rest are endless
        target.entries.extend(zip(lanes, items, indices, positions, chunks, strict=False))
        target.chunk_sizes.append(len(items))
        if states.last >= 0:  # a skipped item's record has no state
            target.received = StateRef(states, states.last)

    def rewind(self, lane: int) -> tuple[Any, Any]:
        """Worker ``lane`` died and a new process takes its place: drop the records of
        skipped items after its last item (the new process reads them again), let its
        buffered chunks grant no credits, and return ``(its state after the last item
        received from it, that item's position)`` for the new process to resume from."""
        target = self.lanes[lane]
        while target.entries and _state_of(target.entries[-1]) is None:
            target.entries.pop()
            sizes = target.chunk_sizes
            sizes[-1] -= 1
            if not sizes[-1]:
                sizes.pop()
        target.void_chunks = len(target.chunk_sizes)
        position = target.entries[-1][POSITION] if target.entries else target.bound
        return resolve(target.received), position

    def _check_increasing(self, lane: int, target: Lane, positions: Sequence[Any]) -> None:
        """Positions must grow within a lane, or the merge could wait forever: fail instead."""
        previous = target.entries[-1][POSITION] if target.entries else target.bound
        for position in positions:
            if position is None or (previous is not None and not position > previous):
                raise ConveyorError(
                    f"worker {lane} yielded position {position} after {previous}: an op after "
                    "sharding_filter reorders items but declares keeps_order = True; fix that flag"
                )
            previous = position

    def end_lane(self, lane: int) -> None:
        self.lanes[lane].ended = True

    def fail_lane(self, lane: int, error: BaseException, position: Any) -> None:
        """The worker raised ``error`` at ``position``: no more entries come from it, and
        :meth:`take_run` raises the error once nothing may leave before it."""
        target = self.lanes[lane]
        target.failure = error
        target.failed_at = tuple(position) if position is not None else None

    def raise_floor(self, lane: int, taken_position: int) -> None:
        """Dispatch mode: the worker took the item at ``taken_position``; whatever it yields
        later comes from that item or later ones (per-item pipelines only)."""
        floor = (taken_position - 1, _BEYOND_ANY_SUB_POSITION)
        target = self.lanes[lane]
        if target.floor is None or floor > target.floor:
            target.floor = floor

    def restore(self, bounds: list[Any], last_lane: int | None) -> None:
        for lane, bound in zip(self.lanes, bounds, strict=True):
            lane.bound = tuple(bound) if bound is not None else None
        self.turn = (last_lane + 1) % len(self.lanes) if last_lane is not None else 0

    @property
    def finished(self) -> bool:
        return all(lane.done for lane in self.lanes)

    def take_run(self) -> tuple[list[Entry], list[int]]:
        """``(entries that may leave now, lanes whose received chunks they used up)``; an
        empty run means: wait for the workers (or, when :attr:`finished`, the epoch is over)."""
        if not self.in_order:
            run = self._take_all()
        elif self.positional:
            run = self._take_by_position()
        else:
            run = self._take_round_robin()
        if not run:
            self._raise_due_failure()
        return run, self._freed(run)

    def _raise_due_failure(self) -> None:
        """Raise a worker's error when nothing that comes before it can still leave: first
        come (``in_order=False``) once its own entries left; round robin at its turn; by
        position when its lane is the one the merge waits for."""
        if not self.in_order:
            due = [lane for lane in self.lanes if lane.failure is not None and not lane.entries]
        elif not self.positional:
            lane = self.lanes[self.turn]
            due = [lane] if lane.failure is not None and not lane.entries else []
        else:
            due = [self.lanes[i] for i in self._lowest if self.lanes[i].failure is not None]
        if due:
            failure = due[0].failure
            assert failure is not None  # each lane in due has one
            raise failure

    def awaited(self) -> list[int] | None:
        """After :meth:`take_run`: the lanes whose next message can let more entries leave;
        None when any lane's can. A lane that failed has no next message: its error is
        raised here when it is the one awaited."""
        self._raise_due_failure()
        if not self.in_order:
            return None
        if not self.positional:
            return [self.turn]
        return self._lowest or None

    def holding_up(self) -> list[int]:
        """After an empty :meth:`take_run`: the lanes whose output must come before any
        other's can leave (every lane still running, first come first served). Unlike
        :meth:`awaited`, it raises nothing: it explains a wait."""
        if self.in_order and not self.positional:
            return [self.turn]
        if self.in_order and self._lowest:
            return list(self._lowest)
        return [index for index, lane in enumerate(self.lanes) if not lane.ended and lane.failure is None]

    def _take_all(self) -> list[Entry]:
        run: list[Entry] = []
        for lane in self.lanes:
            run.extend(lane.entries)
            lane.entries.clear()
        return run

    def _take_by_position(self) -> list[Entry]:
        threshold = None
        lowest: list[int] = []  # the lanes at the smallest frontier: the ones awaited
        self._lowest = lowest
        for index, lane in enumerate(self.lanes):
            if lane.ended and lane.failure is None:
                continue
            frontier = lane.entries[-1][POSITION] if lane.entries else lane.bound
            if lane.failure is not None and not lane.entries and lane.failed_at is not None:
                frontier = lane.failed_at if frontier is None else max(frontier, lane.failed_at)
            elif frontier is not None and self._beyond_last and lane.failure is None:
                # Its next position is at least the next whole one, which no other lane
                # holds if this one emits it (a position belongs to one shard).
                frontier = (frontier[0] + 1,)
            if lane.floor is not None and (frontier is None or lane.floor > frontier):
                frontier = lane.floor
            if frontier is None:
                # This worker has shown nothing yet: it may come first (its error, if it
                # failed before any item, does).
                lowest[:] = [index] if lane.failure is not None else []
                return []
            if threshold is None or frontier < threshold:
                threshold = frontier
                lowest[:] = [index]
            elif frontier == threshold:
                lowest.append(index)
        run: list[Entry] = []
        for lane in self.lanes:
            entries = lane.entries
            while entries and (threshold is None or entries[0][POSITION] <= threshold):
                run.append(entries.popleft())
        if len(self.lanes) > 1:
            run.sort(key=_POSITION)
        for entry in run:  # cheap: bounds only need each lane's last entry
            self.lanes[entry[LANE]].bound = entry[POSITION]
        return run

    def _take_round_robin(self) -> list[Entry]:
        run: list[Entry] = []
        count = len(self.lanes)
        skipped = 0
        while skipped < count:
            lane = self.lanes[self.turn]
            if lane.done:
                self.turn = (self.turn + 1) % count
                skipped += 1
                continue
            if not lane.entries:
                return run
            run.append(lane.entries.popleft())
            self.turn = (self.turn + 1) % count
            skipped = 0
        return run

    def _freed(self, run: list[Entry]) -> list[int]:
        """Lanes whose received chunks this run used up (one credit back per chunk)."""
        if not run:
            return []
        taken: dict[int, int] = {}
        for entry in run:
            taken[entry[LANE]] = taken.get(entry[LANE], 0) + 1
        freed: list[int] = []
        for index, count in taken.items():
            sizes = self.lanes[index].chunk_sizes
            while count and sizes:
                used = min(count, sizes[0])
                sizes[0] -= used
                count -= used
                if sizes[0] == 0:
                    sizes.popleft()
                    if self.lanes[index].void_chunks:
                        self.lanes[index].void_chunks -= 1  # sent by a worker that died
                    else:
                        freed.append(index)
        return freed


def check_merge_state(state: Any, num_workers: int, where: str) -> None:
    require_keys(state, {"last_lane": (int, type(None)), "bounds": list}, where)
    if len(state["bounds"]) != num_workers:
        raise StateError(f"{where}: expected {num_workers} lanes")
    if state["last_lane"] is not None and not 0 <= state["last_lane"] < num_workers:
        raise StateError(f"{where}: 'last_lane' out of range")
    for bound in state["bounds"]:
        if bound is not None:
            require_position(bound, where)
