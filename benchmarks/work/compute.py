"""The items of ``bench_peers.py``'s workloads (and of the suites that reuse them): what
every loader computes per item, and how a run counts what a loader delivered.

This module imports only the standard library, numpy and the harness's tally: it runs
inside every peer's virtual environment, and in the worker processes of every loader
(Grain's are spawned, so its item functions are imported there by name).

- ``small``: ``plus_one(i) = i + 1`` for ``i`` in ``range(n)``: a loader's own per-item cost.
- ``arrays``: ``array_mib(i)``: a new 1 MiB int64 array filled with ``i``, made in the
  worker: moving bulk data.
- ``compute``: ``compute(i) = (i, x)``: :data:`COMPUTE_ROUNDS` rounds of a fixed numpy
  op on a :data:`COMPUTE_SIZE`-sample signal, returning the id and a float: workers
  doing real work, small results. Issue 18 defines it as ~200 µs of work per item; the
  op's cost differs from machine to machine, so the orchestrator sizes the signal for
  ~200 µs on the machine it runs on (:func:`size_for`) and hands the size to every
  process through :data:`SIZE_VARIABLE` (Grain's spawned workers import this module
  afresh). It measures the op's cost in every run and prints it.
- ``images``: ``image(i)``: a new 224x224x3 uint8 image filled with ``i % 251``, its
  first pixel's three bytes holding ``i`` (so a batch names its items), made in the
  worker and delivered in batches of :data:`BATCH`: stacking bulk data.

The bare bounds do the same work without a loader: :func:`fill_array` and
:func:`fill_image` write an item straight into its place in a shared buffer (what
``image(i)`` and ``array_mib(i)`` do, less making a new array).

:func:`tally_for` makes a workload's :class:`harness.tally.Tally`: each id's deliveries,
the items that are not what the workload makes, and a checksum over the delivered values.
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

from conveyor.tools.bench.harness.tally import PairTally, Tally

WORKLOADS = ("small", "arrays", "compute", "images")
#: int64 elements in 1 MiB.
ARRAY_ELEMENTS = (1 << 20) // 8
#: ``images``: an image's shape, the modulus of its fill value, and the items per batch.
IMAGE_SHAPE = (224, 224, 3)
IMAGE_MODULUS = 251
BATCH = 64
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


def plus_one(i: int) -> int:
    """``small``: nothing to compute, so only the loader's own cost shows."""
    return i + 1


def array_mib(i: int) -> np.ndarray:
    """``arrays``: a new 1 MiB int64 array whose every element is ``i``."""
    return np.full(ARRAY_ELEMENTS, i, dtype=np.int64)


def fill_array(i: int, out: np.ndarray) -> None:
    """``arrays``' item written in place: every element of ``out`` (1 MiB int64) is ``i``."""
    out.fill(i)


def fill_image(i: int, out: np.ndarray) -> None:
    """``images``' item written in place into ``out`` (an :data:`IMAGE_SHAPE` uint8 array):
    every byte ``i % 251``, then the first pixel's three bytes ``i`` (big-endian)."""
    out.fill(i % IMAGE_MODULUS)
    out[0, 0] = ((i >> 16) & 255, (i >> 8) & 255, i & 255)


def image(i: int) -> np.ndarray:
    """``images``: a new image made the ordinary way (``np.full``, then its first pixel)."""
    out = np.full(IMAGE_SHAPE, i % IMAGE_MODULUS, dtype=np.uint8)
    out[0, 0] = ((i >> 16) & 255, (i >> 8) & 255, i & 255)
    return out


def stack_images(ids: list[int]) -> np.ndarray:
    """A batch of ``images``' items, as a loader that batches indices makes it in a worker."""
    return np.stack([image(i) for i in ids])


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


ITEM_FUNCTIONS: dict[str, Callable[[int], Any]] = {
    "small": plus_one,
    "arrays": array_mib,
    "compute": compute,
    "images": image,
}
#: The bare bounds' in-place work, per workload.
FILL_FUNCTIONS: dict[str, Callable[[int, np.ndarray], None]] = {"arrays": fill_array, "images": fill_image}


class SmallTally(Tally):
    """``small``: each item an int, its id one less."""

    def see(self, item: Any) -> None:
        self.count += 1
        if type(item) is not int:
            self.wrong(item, "an int")
            return
        self.add(item)
        self.id(item - 1)


class ArrayTally(Tally):
    """``arrays``: each item a 1 MiB int64 array filled with its id (its ends compared)."""

    def see(self, item: Any) -> None:
        self.count += 1
        if not (
            isinstance(item, np.ndarray)
            and item.shape == (ARRAY_ELEMENTS,)
            and item.dtype == np.int64
            and item[0] == item[-1]
        ):
            self.wrong(item, f"an int64 array of {ARRAY_ELEMENTS} equal elements")
            return
        i = int(item[0])
        self.add(i)
        self.id(i)


class ImageBatchTally(Tally):
    """``images``: each item a batch, ``(k, 224, 224, 3)`` uint8 with ``1 <= k <=`` :data:`BATCH`
    (a numpy array or a torch tensor, read through ``np.asarray`` without a copy): each
    image's first pixel names its id, and two other bytes (the middle, the last) must be
    the id's fill value. The ids are the checksum."""

    def see(self, item: Any) -> None:
        self.count += 1
        batch = np.asarray(item)
        if not (batch.dtype == np.uint8 and batch.shape[1:] == IMAGE_SHAPE and 1 <= len(batch) <= BATCH):
            self.wrong(f"{type(item).__name__} {getattr(item, 'shape', '')}", f"a batch of <= {BATCH} images")
            return
        first = batch[:, 0, 0].astype(np.int64)
        ids = (first[:, 0] << 16) | (first[:, 1] << 8) | first[:, 2]
        fill = (ids % IMAGE_MODULUS).astype(np.uint8)
        middle, last = IMAGE_SHAPE[0] // 2, IMAGE_SHAPE[0] - 1
        if not (np.array_equal(batch[:, middle, middle, 1], fill) and np.array_equal(batch[:, last, last, 2], fill)):
            self.wrong(f"batch {self.count}", "images filled with their id's value")
            return
        listed = ids.tolist()
        self.add(sum(listed))
        self.ids(listed)


TALLIES: dict[str, type[Tally]] = {
    "small": SmallTally,
    "arrays": ArrayTally,
    "compute": PairTally,  # each item an (id, float) pair
    "images": ImageBatchTally,
}


def tally_for(workload: str, n: int) -> Tally:
    """A fresh count of one epoch of ``n`` items of ``workload``."""
    return TALLIES[workload](n)


def expected_checksum(workload: str, n: int, compute_size: int | None = None) -> float | int:
    """The checksum of ``n`` items delivered once each (``compute``: computes every item
    on ``compute_size`` samples, ``n`` times the op's cost)."""
    if workload == "small":
        return n * (n + 1) // 2
    if workload in ("arrays", "images"):
        return n * (n - 1) // 2
    return math.fsum(compute_value(i, compute_size) for i in range(n))
