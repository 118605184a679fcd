"""In-process throughput: conveyor's ``DataLoader2`` against ``torch.utils.data.DataLoader``.

The workload is the per-item overhead of the loaders themselves: ``range(N)`` mapped by a
trivial function, read in the calling process (no workers). Each loader is timed from its
creation to its last item; runs alternate between loaders (so drift such as CPU
frequency changes hits all of them alike) and the median of the repeats is reported.

    python benchmarks/bench_in_process.py [--items N] [--repeats R]

torchdata 0.7.1's ``DataLoader2`` is included when it can be imported; otherwise its row
says why not. A last row iterates the bare ``map`` with no loader: the floor that every
loader adds its overhead to. Timings are never asserted anywhere: they depend on the machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

CONVEYOR = "conveyor DataLoader2"
PLAIN = "no loader: map(add_one, range(N)) (floor)"


def add_one(x: int) -> int:
    """The mapped function: trivial, so the loader's own overhead dominates."""
    return x + 1


@dataclass
class Candidate:
    """A loader under test: ``make(n)`` builds it (timed) and returns ``(iterable, cleanup)``."""

    name: str
    make: Callable[[int], tuple[Iterable[Any], Callable[[], None]]] | None
    unavailable: str = ""
    seconds: list[float] = field(default_factory=list)

    def median_rate(self, n: int) -> float:
        return n / statistics.median(self.seconds)


def _nothing() -> None:
    pass


def _conveyor(n: int) -> tuple[Iterable[Any], Callable[[], None]]:
    from conveyor import DataLoader2
    from conveyor.pipes import IterableWrapper

    loader = DataLoader2(IterableWrapper(range(n)).map(add_one))
    return loader, loader.shutdown


def _plain(n: int) -> tuple[Iterable[Any], Callable[[], None]]:
    return map(add_one, range(n)), _nothing


def _torch_candidates() -> list[Candidate]:
    try:
        import torch
        from torch.utils.data import DataLoader, IterableDataset
    except Exception as err:  # ImportError, or a broken install
        reason = f"unavailable: {type(err).__name__}: {err}"
        return [Candidate(f"torch DataLoader ({mode})", None, reason) for mode in ("batch_size=1", "batch_size=None")]

    class MappedRange(IterableDataset):
        """``f(i)`` for ``i`` in ``range(n)``: the same iterable conveyor reads."""

        def __init__(self, n: int, fn: Callable[[int], int]):
            self.n, self.fn = n, fn

        def __iter__(self) -> Iterator[int]:
            return map(self.fn, range(self.n))

    def batched(n: int) -> tuple[Iterable[Any], Callable[[], None]]:
        return DataLoader(MappedRange(n, add_one), num_workers=0), _nothing

    def unbatched(n: int) -> tuple[Iterable[Any], Callable[[], None]]:
        return DataLoader(MappedRange(n, add_one), batch_size=None, num_workers=0), _nothing

    version = torch.__version__
    return [
        Candidate(f"torch {version} DataLoader (batch_size=1)", batched),
        Candidate(f"torch {version} DataLoader (batch_size=None)", unbatched),
    ]


def _torchdata_candidate() -> Candidate:
    name = "torchdata 0.7.1 DataLoader2"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torchdata announces its deprecation on import
            import torchdata
            from torchdata.dataloader2 import DataLoader2
            from torchdata.datapipes.iter import IterableWrapper
    except Exception as err:  # ImportError, or torchdata failing against this torch
        return Candidate(name, None, f"unavailable: {type(err).__name__}: {err}")
    version = getattr(torchdata, "__version__", "?")
    name = f"torchdata {version} DataLoader2"

    def make(n: int) -> tuple[Iterable[Any], Callable[[], None]]:
        loader = DataLoader2(IterableWrapper(range(n)).map(add_one))
        return loader, loader.shutdown

    return Candidate(name, make)


def _check(last: Any, count: int, n: int, name: str) -> None:
    value = last.item() if hasattr(last, "item") else last  # torch's batch_size=1 yields tensor([x])
    if count != n or value != add_one(n - 1):
        raise RuntimeError(f"{name}: read {count} items ending with {last!r}, expected {n} ending with {n}")


def time_once(candidate: Candidate, n: int) -> float:
    """Seconds from creating the loader to receiving its last item (checked)."""
    assert candidate.make is not None
    start = time.perf_counter()
    loader, cleanup = candidate.make(n)
    count, last = 0, None
    for last in loader:  # noqa: B007 - the last item is checked below
        count += 1
    seconds = time.perf_counter() - start
    cleanup()
    _check(last, count, n, candidate.name)
    return seconds


def run(n: int, repeats: int) -> list[Candidate]:
    """Time every available loader ``repeats`` times, alternating between loaders."""
    candidates = [
        Candidate(CONVEYOR, _conveyor),
        *_torch_candidates(),
        _torchdata_candidate(),
        Candidate(PLAIN, _plain),
    ]
    runnable = [c for c in candidates if c.make is not None]
    for c in runnable:  # warm-up: imports, first-call caches
        time_once(c, min(n, 1000))
    for _ in range(repeats):
        for c in runnable:
            c.seconds.append(time_once(c, n))
    return candidates


def format_table(candidates: Sequence[Candidate], n: int) -> str:
    """A Markdown table: loader, items/s, and conveyor's rate divided by the loader's."""
    conveyor_rate = next(c for c in candidates if c.name == CONVEYOR).median_rate(n)
    rows = [("loader", "items/s (median)", "ratio conveyor/this")]
    for c in candidates:
        if c.make is None:
            rows.append((c.name, c.unavailable, "-"))
        else:
            rate = c.median_rate(n)
            rows.append((c.name, f"{rate:,.0f}", f"{conveyor_rate / rate:.2f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = ["| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, run, print the setup line and the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--items", type=int, default=200_000, metavar="N", help="items per run (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=5, metavar="R", help="runs per loader (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.items < 1 or args.repeats < 1:
        parser.error("--items and --repeats must be >= 1")
    print(
        f"items={args.items} repeats={args.repeats} python={platform.python_version()} "
        f"machine={platform.machine()} cpus={_cpu_count()}",
        flush=True,
    )
    candidates = run(args.items, args.repeats)
    print(format_table(candidates, args.items))
    return 0


def _cpu_count() -> int | str:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or "?"


if __name__ == "__main__":
    sys.exit(main())
