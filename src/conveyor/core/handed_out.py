"""Positions at the sharding point that an epoch already handed out, kept compactly.

An elastic resume (:mod:`conveyor.reading_service.elastic`) must tell the new ranks which
positions the old ones handed out. Ranks split positions by arithmetic (rank ``r`` of
``W`` keeps ``p % W == r``) and hand their share out in order, so what a job handed out
is a *frontier* (every position below it) plus, above it, one arithmetic run per rank
(``r, r + W, ...`` up to the last position that rank handed out, or without end for a
rank that ran out): its size grows with the number of ranks, never with the items.

As plain data (inside a sharding point's state and a merged loader state)::

    {"below": F, "runs": [[start, stop, step], ...]}   # stop None: no end

Position ``p`` was handed out when ``p < F``, or ``start <= p < stop`` and ``(p - start)
% step == 0`` for some run.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from conveyor.core.validation import MAX_COUNTER, describe_state_value, require_keys, require_non_negative
from conveyor.errors import StateError

#: The runs' steps may repeat together every this many positions at most (the lcm of the
#: world sizes of the jobs whose runs are above the frontier; one job: its world size).
MAX_PERIOD = 1 << 20

#: At most this many runs in one set: a merge makes one per rank of the job it merges
#: (plus those of earlier merges above the frontier), so this admits jobs of thousands of
#: ranks and keeps the per-position test of a resumed sharding point bounded.
MAX_RUNS = 65_536

Run = tuple[int, int | None, int]


@dataclass(frozen=True)
class HandedOut:
    """A set of positions: all below ``below``, and every run's members (``start``,
    ``start + step``, ... while below ``stop``; ``stop`` None: no end)."""

    below: int = 0
    runs: tuple[Run, ...] = ()

    def __contains__(self, position: int) -> bool:
        if position < self.below:
            return True
        for start, stop, step in self.runs:
            if start <= position and (stop is None or position < stop) and (position - start) % step == 0:
                return True
        return False

    def count_in_share(self, rank: int, world_size: int, positions: int) -> int:
        """How many of rank ``rank``'s positions (``p % world_size == rank``) below
        ``positions`` are in this set."""
        whole = min(self.below, positions)
        count = max(0, -(-(whole - rank) // world_size))  # those below the frontier
        stops = [stop for _, stop, _ in self.runs]
        if not stops:
            return count
        end = positions if None in stops else min(positions, max(stop for stop in stops if stop is not None))
        first = whole + (rank - whole) % world_size
        return count + sum(1 for position in range(first, end, world_size) if position in self)

    def __bool__(self) -> bool:
        return self.below > 0 or bool(self.runs)

    def union(self, runs: Iterable[Run]) -> HandedOut:
        """This set and ``runs``, normalized (see :meth:`normalized`)."""
        return HandedOut(self.below, (*self.runs, *runs)).normalized()

    def first_missing(self) -> int:
        """The smallest position not in the set (``MAX_COUNTER - 1`` when the runs without
        end leave nothing out).

        Positions fall in classes modulo the lcm ``L`` of the runs' steps, and a run covers
        a whole class or none of it: so, per class, the first member at or above the
        frontier is pushed past each run that covers it, in the order of their starts.
        That costs ``L`` times the runs of one class, never a walk over positions."""
        if not self.runs:
            return self.below
        by_class: dict[tuple[int, int], list[tuple[int, int | None]]] = {}
        for start, stop, step in self.runs:
            by_class.setdefault((step, start % step), []).append((start, stop))
        steps = sorted({step for step, _ in by_class})
        period = math.lcm(*steps)
        if period > MAX_PERIOD:
            raise StateError(
                f"handed-out positions: runs of steps {steps[:8]} repeat every {period} positions, more than "
                f"{MAX_PERIOD}; merge fewer successive jobs before the frontier passes them"
            )
        lowest = MAX_COUNTER - 1
        for residue in range(period):
            position = self.below + (residue - self.below) % period
            spans = sorted((span for step in steps for span in by_class.get((step, residue % step), ())), key=_start)
            for start, stop in spans:
                if start <= position and (stop is None or position < stop):
                    if stop is None:
                        position = MAX_COUNTER - 1
                        break
                    position = stop + (residue - stop) % period  # the class's first member past the run
            lowest = min(lowest, position)
        return lowest

    def normalized(self) -> HandedOut:
        """The same set with the frontier as high as it goes, runs cut to start above it,
        runs wholly below it dropped, and duplicates removed (in a stable order)."""
        below = HandedOut(self.below, self.runs).first_missing()
        kept: list[Run] = []
        for start, stop, step in self.runs:
            if start < below:
                start += -(-(below - start) // step) * step  # the first member at or above the frontier
            if stop is not None and start >= stop:
                continue
            run = (start, stop, step)
            if run not in kept:
                kept.append(run)
        kept.sort(key=lambda run: (run[2], run[0], -1 if run[1] is None else run[1]))
        return HandedOut(below, tuple(kept))

    def as_state(self) -> dict[str, Any]:
        return {"below": self.below, "runs": [list(run) for run in self.runs]}

    @classmethod
    def from_state(cls, state: Any, where: str) -> HandedOut:
        """The set a plain-data ``state`` describes, checked (:class:`StateError`)."""
        require_keys(state, {"below": int, "runs": list}, where)
        require_non_negative(state, "below", where)
        runs = state["runs"]
        if len(runs) > MAX_RUNS:
            raise StateError(f"{where}: {len(runs)} runs of handed-out positions, more than {MAX_RUNS}")
        checked: list[Run] = []
        for index, run in enumerate(runs):
            if not _is_run(run):
                raise StateError(
                    f"{where}: runs[{index}] must be [start, stop or null, step] with 0 <= start, "
                    f"start < stop and step >= 1, got {describe_state_value(run)}"
                )
            checked.append((run[0], run[1], run[2]))
        return cls(state["below"], tuple(checked))


def _start(span: tuple[int, int | None]) -> int:
    return span[0]


def _is_run(run: Any) -> bool:
    if type(run) is not list or len(run) != 3:
        return False
    start, stop, step = run
    if type(start) is not int or type(step) is not int or not 0 <= start < MAX_COUNTER or not 1 <= step < MAX_COUNTER:
        return False
    return stop is None or (type(stop) is int and start < stop < MAX_COUNTER)
