"""What one epoch delivered, counted as it arrives, and the check of that count.

A run's process counts every item it receives (cheaply: a byte per id and a running
checksum), and the orchestrator checks the summary against what the epoch must give:
each id delivered exactly ``times`` times (once per epoch), nothing malformed, and the
checksum of the right values. Checking in the run's process keeps the items there
(nothing but the summary crosses back), and checking every item keeps a loader that
drops, repeats or spoils one from ever counting as fast.

Standard library only: it runs in every peer's virtual environment, and in the worker
processes of the bounds, which send their tallies to be merged.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

#: How many problems a tally describes in words (the count of bad items is kept whole).
MAX_DESCRIBED = 3


class Tally:
    """Deliveries per id (``0 .. n-1``), malformed items, and a checksum of the values.

    A workload's tally subclass (or the workload's code) calls :meth:`id` or :meth:`ids`
    for what each item names, :meth:`add` for the values it sums, and :meth:`wrong` for an
    item that is not what the workload makes. Integer values sum exactly; floats with
    ``math.fsum``, so that the order of delivery does not change the checksum.
    """

    def __init__(self, n: int, times: int = 1) -> None:
        self.n, self.times = n, times
        self.counts = bytearray(n)  # deliveries per id, saturating at 255
        self.count = 0  # items seen
        self.bad = 0
        self.problems: list[str] = []
        self.total = 0  # the exact sum of integer values
        self.values: list[float] = []  # float values, summed at the end

    def see(self, item: Any) -> None:
        """Count one delivered item: by default, the item is its own id."""
        self.count += 1
        if type(item) is not int:
            self.wrong(item, "an int")
            return
        self.id(item)

    def id(self, i: int) -> None:
        """One delivery of id ``i``."""
        if 0 <= i < self.n:
            if self.counts[i] < 255:
                self.counts[i] += 1
        else:
            self.wrong(i, f"an id in range({self.n})")

    def ids(self, ids: Iterable[int]) -> None:
        """One delivery of each of ``ids`` (a batch's)."""
        for i in ids:
            self.id(i)

    def add(self, value: int | float) -> None:
        """Add ``value`` to the checksum."""
        if isinstance(value, float):
            self.values.append(value)
        else:
            self.total += value

    def wrong(self, item: Any, expected: str) -> None:
        """Count ``item`` as malformed: it is not ``expected``."""
        self.bad += 1
        if len(self.problems) < MAX_DESCRIBED:
            shown = repr(item) if isinstance(item, int | float | str | tuple | list) else type(item).__name__
            self.problems.append(f"item {self.count}: expected {expected}, got {shown[:80]}")

    def merge(self, other: Tally) -> None:
        """Add ``other``'s deliveries (another process's share of the epoch)."""
        for i, c in enumerate(other.counts):
            if c:
                self.counts[i] = min(255, self.counts[i] + c)
        self.count += other.count
        self.bad += other.bad
        self.problems.extend(other.problems[: MAX_DESCRIBED - len(self.problems)])
        self.total += other.total
        self.values.extend(other.values)

    def checksum(self) -> int | float:
        return self.total + math.fsum(self.values) if self.values else self.total

    def summary(self) -> dict[str, Any]:
        """Plain data for the orchestrator: counts, the checksum, the first problems."""
        return {
            "count": self.count,
            "right": self.counts.count(self.times),
            "missing": self.counts.count(0),
            "times": self.times,
            "bad": self.bad,
            "checksum": self.checksum(),
            "problems": self.problems,
        }


class PairTally(Tally):
    """Each item an ``(id, float)`` pair (torch's ``default_convert`` makes the tuple a
    list: either is the pair); the floats are the checksum."""

    def see(self, item: Any) -> None:
        self.count += 1
        if not (type(item) in (tuple, list) and len(item) == 2 and type(item[0]) is int and type(item[1]) is float):
            self.wrong(item, "an (int, float) pair")
            return
        self.add(item[1])
        self.id(item[0])


def check_delivery(summary: dict[str, Any], n: int, expected: float | int | None) -> list[str]:
    """The problems of a tally's summary against ``n`` ids each delivered ``times`` times
    with checksum ``expected`` (``None``: the workload has no checksum); empty when the
    epoch is right. A summary with ``expected`` says how many ids this loader's epoch must
    deliver when that is not all of them (a loader that skips bad items, or stops at the
    first): its ``right`` and ``missing`` count those ids only."""
    problems: list[str] = []
    right, missing, times = summary["right"], summary["missing"], summary.get("times", 1)
    n = summary.get("expected", n)  # a tally that knows the epoch delivers fewer ids (skips, a failure)
    if right != n:
        wrong = n - right - missing
        often = "more than once" if times == 1 else f"other than {times} times"
        problems.append(
            f"{summary['count']:,} item(s) delivered for {n:,} ids: {missing:,} id(s) never delivered, "
            f"{wrong:,} delivered {often}"
        )
    if summary["bad"]:
        problems.append(f"{summary['bad']:,} malformed item(s): " + "; ".join(summary["problems"][:MAX_DESCRIBED]))
    got = summary["checksum"]
    if expected is None or got is None:  # no checksum for this workload, or for this loader's epoch
        return problems
    if isinstance(expected, int) and got != expected:
        problems.append(f"checksum {got} != {expected}: some values are wrong")
    elif isinstance(expected, float) and not math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-9):
        problems.append(f"checksum {got!r} != {expected!r}: some values are wrong")
    return problems
