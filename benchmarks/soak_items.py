"""Integrity soak of the whole loader: large numpy items through worker processes and the
shared-memory ring, every item and every epoch checked.

Pipeline: ``IterableWrapper(range(N)).shuffle().sharding_filter().map(make_array)``, where
``make_array(i)`` is an int64 array whose element ``k`` is ``k * 7919 + i * 1000003`` (it
names its item and can be checked whole), in ``MultiProcessingReadingService(workers,
"fork")``, with ``state_dict()`` and ``stats()`` after every epoch. Each epoch must yield
exactly the items of a single-process reference loader, in its order, every array
consistent; with ``--hold`` every item is kept to the end of its epoch and checked again
(a page overwritten after the item arrived shows there). ``--hogs K`` runs K busy
processes alongside (started and killed by this script): the ring's races showed only
under CPU load.

    python benchmarks/soak_items.py [--epochs E] [--seconds S] [--items N] [--kib K]
        [--workers W] [--hogs K] [--hold]

Prints each failing epoch, then a summary; exits 1 if any epoch failed.
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import time
from collections import Counter
from typing import Any

import numpy as np

from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.pipes import IterableWrapper

_STEP, _ITEM = 7919, 1000003


def make_array(i: int, length: int) -> np.ndarray:
    return np.arange(length, dtype=np.int64) * _STEP + i * _ITEM


def identify(array: np.ndarray) -> tuple[int, bool]:
    """``(the item an array names, whether all of it agrees)``."""
    i = int(array[0]) // _ITEM
    return i, bool(np.array_equal(array, make_array(i, array.shape[0])))


def soak_epoch(loader: DataLoader2, expected: list[int], hold: bool) -> dict[str, Any] | None:
    """One epoch; what went wrong, or None."""
    got: list[int] = []
    held: list[tuple[int, np.ndarray]] = []
    bad: list[Any] = []
    for item in loader:
        i, whole = identify(item)
        got.append(i)
        if not whole:
            bad.append(("inconsistent", len(got) - 1, i))
        if hold:
            held.append((i, item))
    for index, (i, item) in enumerate(held):
        again, whole = identify(item)
        if again != i or not whole:
            bad.append(("changed", index, i, again))
    held.clear()
    counts = Counter(got)
    if got == expected and not bad:
        return None
    return {
        "missing": sorted(set(expected) - set(counts)),
        "duplicated": sorted(i for i, n in counts.items() if n > 1),
        "out_of_order_at": [k for k, (e, g) in enumerate(zip(expected, got, strict=False)) if e != g][:10],
        "bad": bad[:10],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=0.0, help="stop after this long (0: run every epoch)")
    parser.add_argument("--items", type=int, default=100)
    parser.add_argument("--kib", type=int, default=128, help="item size in KiB (64 and up go through the ring)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--hogs", type=int, default=0)
    parser.add_argument("--hold", action="store_true")
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()
    length = args.kib * 1024 // 8
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
    try:
        loader = DataLoader2(
            IterableWrapper(range(args.items))
            .shuffle()
            .sharding_filter()
            .map(functools.partial(make_array, length=length)),
            reading_service=MultiProcessingReadingService(args.workers, multiprocessing_context="fork"),
        )
        reference = DataLoader2(IterableWrapper(range(args.items)).shuffle().sharding_filter())
        loader.seed(args.seed)
        reference.seed(args.seed)
        started, epochs, failures = time.monotonic(), 0, 0
        try:
            for epoch in range(args.epochs):
                failure = soak_epoch(loader, list(reference), args.hold)
                loader.state_dict()
                loader.stats()
                epochs += 1
                if failure is not None:
                    failures += 1
                    print(json.dumps({"epoch": epoch, **failure}), flush=True)
                if args.seconds and time.monotonic() - started > args.seconds:
                    break
        finally:
            loader.shutdown()
            reference.shutdown()
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    print(
        f"{epochs} epochs of {args.items} items of {args.kib} KiB, {args.workers} workers, {args.hogs} hogs: "
        f"{failures} failed ({time.monotonic() - started:.0f} s)"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
