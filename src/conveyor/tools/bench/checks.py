"""What a benchmark run must have delivered, checked the same way for every loader: the
count, the type and value of items at a few positions (or of every batch for the demo),
the last item again after the loader shut down, and a fingerprint of the checked items
that must match across loaders."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Container
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

MIB = 1 << 20


class ItemCheck(Protocol):
    """Checks one run's items. ``inspect`` sees the items at ``positions`` (0-based) while
    the run is timed, so it must stay cheap; ``finish`` gets the count and the last item
    (after the loader shut down) and gives the verdict."""

    @property
    def positions(self) -> Container[int]: ...

    def inspect(self, position: int, item: Any) -> None: ...

    def finish(self, count: int, last: Any) -> Verdict: ...


@dataclass(frozen=True)
class Verdict:
    """What a run's check found: ``items`` counts samples (images for the demo), and
    ``fingerprint`` summarizes the checked items so that loaders can be compared."""

    problems: tuple[str, ...]
    items: int
    fingerprint: str


class _Everything:
    """A container holding every position: the demo checks every batch."""

    def __contains__(self, position: object) -> bool:
        return True


def sample_positions(n: int) -> set[int]:
    """A few positions whose items are checked in full during the run (checking all of
    them would add the check's cost to every loader's time)."""
    return {p for p in (0, 1, n // 3, n // 2 + 1, n - 2, n - 1) if 0 <= p < n}


def _torch_tensor_type() -> type[Any] | None:
    torch = sys.modules.get("torch")
    return None if torch is None else torch.Tensor


def check_item(kind: str, item: Any, position: int, expected: Any) -> tuple[str | None, str]:
    """``(problem or None, descriptor)``: whether ``item`` is the ``kind`` of item expected at
    ``position``, and a loader-independent description of it for the fingerprint."""
    if kind in ("int", "float"):
        wanted_type = int if kind == "int" else float
        if type(item) is wanted_type and item == expected:
            return None, repr(item)
        return f"item {position} is {item!r}, expected {expected!r}", "bad"
    tensor_type = _torch_tensor_type()
    if kind == "tensor":
        if tensor_type is None or not isinstance(item, tensor_type):
            return f"item {position} is a {type(item).__name__}, expected a torch.Tensor", "bad"
        array = item.numpy()
    else:
        if not isinstance(item, np.ndarray):
            return f"item {position} is a {type(item).__name__}, expected a numpy.ndarray", "bad"
        array = item
    if array.dtype != np.uint8 or array.shape != (MIB,):
        return f"item {position} has dtype {array.dtype} and shape {array.shape}, expected uint8 ({MIB},)", "bad"
    if array[0] != expected or array.min() != expected or array.max() != expected:
        got = f"{array[0]}..{array.min()}..{array.max()}"
        return f"item {position} holds {got}, expected {expected} throughout", "bad"
    return None, f"uint8{array.shape}={expected}"


@dataclass
class RangeCheck:
    """The check of a ``range(n)``-based workload: the count, and the type and value of
    the items at a few positions (all loaders keep ``range`` order with the settings
    used), and the last item once more after shutdown (it must stay intact)."""

    kind: str
    n: int
    expected: dict[int, Any]
    positions: set[int] = field(init=False)
    problems: list[str] = field(default_factory=list)
    seen: dict[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.positions = sample_positions(self.n)

    def inspect(self, position: int, item: Any) -> None:
        problem, descriptor = check_item(self.kind, item, position, self.expected[position])
        if problem:
            self.problems.append(problem)
        self.seen[position] = descriptor

    def finish(self, count: int, last: Any) -> Verdict:
        problems = list(self.problems)
        if count != self.n:
            problems.append(f"read {count} items, expected {self.n}")
        elif self.n:
            problem, _ = check_item(self.kind, last, self.n - 1, self.expected[self.n - 1])
            if problem:
                problems.append(f"after shutdown: {problem}")
        digest = hashlib.sha256(repr(sorted(self.seen.items())).encode()).hexdigest()[:12]
        fingerprint = f"{count:,} items in order; {len(self.seen)} sampled items sha256:{digest}"
        return Verdict(tuple(problems), count, fingerprint)


@dataclass
class DemoCheck:
    """The check of the demo workload, on every batch: shapes and dtypes, each label
    against the dataset's, every image of the dataset delivered exactly once; the last
    batch once more after shutdown. Augmented pixels are not compared: each loader
    draws its own random numbers."""

    labels: np.ndarray  # the dataset's label of each index
    batch_size: int
    tensors: bool  # torch collates into tensors, conveyor into numpy arrays
    positions: _Everything = field(default_factory=_Everything)
    problems: list[str] = field(default_factory=list)
    counts: np.ndarray = field(init=False)
    samples: int = 0

    def __post_init__(self) -> None:
        self.counts = np.zeros(len(self.labels), dtype=np.int64)

    def _problem(self, position: int, batch: Any) -> str | None:
        if not isinstance(batch, (tuple, list)) or len(batch) != 3:
            return f"batch {position} is a {type(batch).__name__}, expected (images, labels, index)"
        tensor_type = _torch_tensor_type()
        wanted = tensor_type if self.tensors else np.ndarray
        if wanted is None or not all(isinstance(part, wanted) for part in batch):
            expected = "torch.Tensor" if self.tensors else "numpy.ndarray"
            return f"batch {position} holds {[type(p).__name__ for p in batch]}, expected {expected}s"
        images, labels, index = (np.asarray(part) for part in batch)
        size = len(index)
        if not 0 < size <= self.batch_size:
            return f"batch {position} has {size} items, expected 1..{self.batch_size}"
        if images.dtype != np.float32 or images.shape != (size, 3, 32, 32):
            return f"batch {position} images are {images.dtype} {images.shape}, expected float32 ({size}, 3, 32, 32)"
        if labels.dtype != np.int64 or index.dtype != np.int64 or labels.shape != (size,):
            return f"batch {position} labels/index are {labels.dtype}/{index.dtype} {labels.shape}, expected int64"
        if index.min() < 0 or index.max() >= len(self.labels):
            return f"batch {position} has indices outside 0..{len(self.labels) - 1}"
        if not np.array_equal(labels, self.labels[index]):
            return f"batch {position} has labels that do not match their images' indices"
        return None

    def inspect(self, position: int, item: Any) -> None:
        problem = self._problem(position, item)
        if problem:
            self.problems.append(problem)
            return
        index = np.asarray(item[2])
        np.add.at(self.counts, index, 1)
        self.samples += len(index)

    def finish(self, count: int, last: Any) -> Verdict:
        problems = list(self.problems)
        missing, repeated = int((self.counts == 0).sum()), int((self.counts > 1).sum())
        if missing or repeated:
            problems.append(f"{missing} images missing and {repeated} delivered more than once")
        if count and not problems:
            problem = self._problem(count - 1, last)
            if problem:
                problems.append(f"after shutdown: {problem}")
        digest = hashlib.sha256(self.counts.tobytes() + self.labels.tobytes()).hexdigest()[:12]
        fingerprint = f"{self.samples:,} images in {count} batches, each once, labels ok; sha256:{digest}"
        return Verdict(tuple(problems), self.samples, fingerprint)
