"""The three workloads of ``bench_peers.py``: what every loader computes per item, and how
what a loader delivered is tallied (in the run's process) and checked (by the orchestrator).

This module imports only the standard library and numpy: it runs inside every peer's
virtual environment, and in the worker processes of every loader (Grain's are spawned,
so its item functions are imported there by name).

- ``small``: ``plus_one(i) = i + 1`` for ``i`` in ``range(n)``: a loader's own per-item cost.
- ``arrays``: ``array_mib(i)``: a new 1 MiB int64 array filled with ``i``, made in the
  worker: moving bulk data.
- ``compute``: ``compute(i) = (i, x)``: :data:`COMPUTE_ROUNDS` rounds of a fixed numpy
  op on a :data:`COMPUTE_SIZE`-sample signal, returning the id and a float: workers
  doing real work, small results. Issue 18 defines it as ~200 µs of work per item; the
  op's cost differs from machine to machine (6,144 samples: 207-264 µs on the machine
  of the issue's figures, 134 µs on a later one), so the orchestrator sizes the signal
  for ~200 µs on the machine it runs on (:func:`size_for`) and hands the size to every
  process through :data:`SIZE_VARIABLE` (Grain's spawned workers import this module
  afresh). It measures the op's cost in every run and prints it.

A :class:`Tally` counts each id's deliveries (one byte per id), the items that are not
what their workload makes, and a checksum over the delivered values (an exact integer
sum, or ``math.fsum`` of the floats, so the order of delivery does not change it).
:func:`check_delivery` compares a tally's summary with what ``n`` items must give: every
id exactly once, nothing malformed, the checksum of the right values.
"""

from __future__ import annotations

import functools
import math
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

WORKLOADS = ("small", "arrays", "compute")
#: int64 elements in 1 MiB.
ARRAY_ELEMENTS = (1 << 20) // 8
#: Signal lengths the orchestrator chooses from (products of small primes: quick FFTs).
COMPUTE_SIZES = (3072, 4096, 5120, 6144, 7168, 8192, 9216, 10240, 12288, 14336, 16384)
#: Where the orchestrator hands every process the length it chose (see :func:`size_children_for`).
SIZE_VARIABLE = "PEERS_COMPUTE_SIZE"
#: The length when none was chosen: the one of issue 18's first figures.
DEFAULT_SIZE = 6144
COMPUTE_SIZE = int(os.environ.get(SIZE_VARIABLE, str(DEFAULT_SIZE)))
if COMPUTE_SIZE not in COMPUTE_SIZES:
    raise ValueError(f"{SIZE_VARIABLE}={COMPUTE_SIZE}: choose from {COMPUTE_SIZES}")
COMPUTE_ROUNDS = 1
#: How many problems a tally describes in words (the count of bad items is kept whole).
MAX_DESCRIBED = 3


def plus_one(i: int) -> int:
    """``small``: nothing to compute, so only the loader's own cost shows."""
    return i + 1


def array_mib(i: int) -> np.ndarray:
    """``arrays``: a new 1 MiB int64 array whose every element is ``i``."""
    return np.full(ARRAY_ELEMENTS, i, dtype=np.int64)


@functools.cache
def _low_pass(size: int) -> np.ndarray:
    return 1.0 / (1.0 + np.arange(size // 2 + 1))


def compute_value(i: int, size: int | None = None) -> float:
    """The fixed numpy op of ``compute``: a sine whose frequency depends on ``i``, then
    :data:`COMPUTE_ROUNDS` rounds of FFT low-pass filtering and a cosine, on ``size``
    samples (:data:`COMPUTE_SIZE`). Deterministic: the same ``i`` and size give the same
    float in every process with the same numpy."""
    size = COMPUTE_SIZE if size is None else size
    x = np.sin(np.arange(size, dtype=np.float64) * ((i % 1009) + 1) * 1e-3)
    for _ in range(COMPUTE_ROUNDS):
        x = np.cos(3.0 * np.fft.irfft(np.fft.rfft(x) * _low_pass(size), size))
    return float(x.sum())


def op_seconds(size: int, calls: int = 200, batches: int = 5) -> float:
    """CPU seconds of one call of the op on ``size`` samples: the median of ``batches``
    batches of ``calls`` calls (after one batch that warms numpy's caches up)."""
    per_batch = []
    for batch in range(batches + 1):
        started = time.process_time()
        for i in range(calls):
            compute_value(i, size)
        if batch:
            per_batch.append((time.process_time() - started) / calls)
    return statistics.median(per_batch)


def size_for(target_s: float) -> tuple[int, float]:
    """``(signal length, its measured seconds per call)``: the length in
    :data:`COMPUTE_SIZES` whose op costs closest to ``target_s`` here. The cost grows
    about as the length, not exactly: measured at 6,144 samples and scaled, the two
    nearest lengths are measured, and the closer one wins."""
    base = op_seconds(DEFAULT_SIZE)
    nearest = sorted(COMPUTE_SIZES, key=lambda candidate: abs(base * candidate / DEFAULT_SIZE - target_s))[:2]
    measured = {size: op_seconds(size) for size in nearest}
    size = min(measured, key=lambda candidate: abs(measured[candidate] - target_s))
    return size, measured[size]


def size_children_for(target_us: float) -> tuple[int, float]:
    """:func:`size_for` ``target_us`` µs, handed to every process this one starts from now
    on (through :data:`SIZE_VARIABLE` in its environment, which they inherit)."""
    size, seconds = size_for(target_us / 1e6)
    os.environ[SIZE_VARIABLE] = str(size)
    return size, seconds


def compute(i: int) -> tuple[int, float]:
    """``compute``: the id and its value (a small result for a costly item)."""
    return i, compute_value(i)


ITEM_FUNCTIONS: dict[str, Callable[[int], Any]] = {"small": plus_one, "arrays": array_mib, "compute": compute}


class Tally:
    """What one run delivered, seen one item at a time (cheaply: a byte per id, a sum)."""

    def __init__(self, workload: str, n: int) -> None:
        if workload not in ITEM_FUNCTIONS:
            raise ValueError(f"unknown workload {workload!r}; choose from {', '.join(WORKLOADS)}")
        self.workload, self.n = workload, n
        self.counts = bytearray(n)  # deliveries per id, saturating at 255
        self.count = 0
        self.bad = 0
        self.problems: list[str] = []
        self.total = 0  # small, arrays: the exact sum of the delivered values
        self.values: list[float] = []  # compute: summed with math.fsum at the end
        self.see = self._seer()

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without its bound ``see`` (the bare bound's workers send their tallies)."""
        return {k: v for k, v in self.__dict__.items() if k != "see"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.see = self._seer()

    def _seer(self) -> Callable[[Any], None]:
        """The workload's ``see(item)``: counts one delivered item."""
        return {"small": self._see_small, "arrays": self._see_array, "compute": self._see_compute}[self.workload]

    def _wrong(self, item: Any, expected: str) -> None:
        self.bad += 1
        if len(self.problems) < MAX_DESCRIBED:
            shown = repr(item) if isinstance(item, int | float | str | tuple | list) else type(item).__name__
            self.problems.append(f"item {self.count}: expected {expected}, got {shown[:80]}")

    def _id(self, i: int) -> None:
        if 0 <= i < self.n:
            if self.counts[i] < 255:
                self.counts[i] += 1
        else:
            self._wrong(i, f"an id in range({self.n})")

    def _see_small(self, item: Any) -> None:
        self.count += 1
        if type(item) is not int:
            self._wrong(item, "an int")
            return
        self.total += item
        self._id(item - 1)

    def _see_array(self, item: Any) -> None:
        self.count += 1
        if not (
            isinstance(item, np.ndarray)
            and item.shape == (ARRAY_ELEMENTS,)
            and item.dtype == np.int64
            and item[0] == item[-1]
        ):
            self._wrong(item, f"an int64 array of {ARRAY_ELEMENTS} equal elements")
            return
        i = int(item[0])
        self.total += i
        self._id(i)

    def _see_compute(self, item: Any) -> None:
        self.count += 1
        # torch's default_convert turns the tuple into a list: either is the pair
        if not (type(item) in (tuple, list) and len(item) == 2 and type(item[0]) is int and type(item[1]) is float):
            self._wrong(item, "an (int, float) pair")
            return
        self.values.append(item[1])
        self._id(item[0])

    def merge(self, other: Tally) -> None:
        """Add ``other``'s deliveries (the bare bound's two workers) to this tally."""
        for i, c in enumerate(other.counts):
            if c:
                self.counts[i] = min(255, self.counts[i] + c)
        self.count += other.count
        self.bad += other.bad
        self.problems.extend(other.problems[: MAX_DESCRIBED - len(self.problems)])
        self.total += other.total
        self.values.extend(other.values)

    def summary(self) -> dict[str, Any]:
        """Plain data for the orchestrator: counts, the checksum, the first problems."""
        checksum: float | int = math.fsum(self.values) if self.workload == "compute" else self.total
        return {
            "count": self.count,
            "once": self.counts.count(1),
            "missing": self.counts.count(0),
            "bad": self.bad,
            "checksum": checksum,
            "problems": self.problems,
        }


def expected_checksum(workload: str, n: int, compute_size: int | None = None) -> float | int:
    """The checksum of ``n`` items delivered once each (``compute``: computes every item
    on ``compute_size`` samples, ``n`` times the op's cost)."""
    if workload == "small":
        return n * (n + 1) // 2
    if workload == "arrays":
        return n * (n - 1) // 2
    return math.fsum(compute_value(i, compute_size) for i in range(n))


def check_delivery(summary: dict[str, Any], n: int, expected: float | int) -> list[str]:
    """The problems of a run's tally summary against ``n`` items with checksum
    ``expected``; empty when every id arrived exactly once and every value is right."""
    problems: list[str] = []
    count, once, missing = summary["count"], summary["once"], summary["missing"]
    if count != n or once != n:
        repeated = n - once - missing
        problems.append(
            f"{count:,} item(s) delivered for {n:,} ids: {missing:,} id(s) never delivered, "
            f"{repeated:,} delivered more than once"
        )
    if summary["bad"]:
        problems.append(f"{summary['bad']:,} malformed item(s): " + "; ".join(summary["problems"][:MAX_DESCRIBED]))
    got = summary["checksum"]
    if isinstance(expected, int) and got != expected:
        problems.append(f"checksum {got} != {expected}: some values are wrong")
    elif isinstance(expected, float) and not math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-9):
        problems.append(f"checksum {got!r} != {expected!r}: some values are wrong")
    return problems
