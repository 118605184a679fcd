"""Every item right, every epoch whole: a short version of ``benchmarks/soak_items.py`` and
``benchmarks/soak_ring.py`` (run those for long: at 410b81b, ~1 epoch in 1,400 under CPU
load yielded one item twice and lost another, through a ring page reused while its lease
was live).

Items are ring-sized arrays that name themselves in every element, so a page overwritten
under a live item shows, and every epoch is compared with a single-process reference.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

import conveyor.core.read_ahead
from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.pipes import IterableWrapper

pytestmark = [pytest.mark.timeout(300), pytest.mark.timing]

BENCHMARKS = pathlib.Path(__file__).resolve().parents[3] / "benchmarks"
STEP, ITEM = 7919, 1000003
LENGTH = 128 * 1024 // 8  # 128 KiB: through the ring


def make_array(i: int, length: int = LENGTH) -> np.ndarray:
    return np.arange(length, dtype=np.int64) * STEP + i * ITEM


def named(array: np.ndarray) -> int:
    """The item an array names; -1 if any element disagrees."""
    i = int(array[0]) // ITEM
    return i if np.array_equal(array, make_array(i, array.shape[0])) else -1


@pytest.mark.parametrize("receiver", ["adaptive", "reader thread"])
def test_ring_sized_items_arrive_whole_and_exactly_once_epoch_after_epoch(monkeypatch, receiver) -> None:
    if receiver == "reader thread":
        monkeypatch.setattr(conveyor.core.read_ahead, "_ENTRIES_PER_DECISION", 1)
        monkeypatch.setattr(conveyor.core.read_ahead.ReadAheadCosts, "thread_pays", property(lambda self: True))
        monkeypatch.setattr(conveyor.core.read_ahead.ReadAheadCosts, "thread_costs", property(lambda self: False))
    items, epochs = 100, 120
    pipe = IterableWrapper(range(items)).shuffle().sharding_filter().map(make_array)
    loader = DataLoader2(pipe, reading_service=MultiProcessingReadingService(2, multiprocessing_context="fork"))
    reference = DataLoader2(IterableWrapper(range(items)).shuffle().sharding_filter())
    loader.seed(1234)
    reference.seed(1234)
    try:
        for epoch in range(epochs):
            expected = list(reference)
            held = list(loader)  # every item kept to the end of its epoch, then checked again
            got = [named(array) for array in held]
            again = [named(array) for array in held]
            counts = Counter(got)
            assert got == expected, (
                f"epoch {epoch}: missing {sorted(set(expected) - set(counts))}, "
                f"duplicated {sorted(i for i, n in counts.items() if n > 1)}, inconsistent {got.count(-1)}"
            )
            assert again == got, f"epoch {epoch}: an item changed after it arrived"
            del held
            loader.state_dict()
            loader.stats()
    finally:
        loader.shutdown()
        reference.shutdown()


def test_the_ring_alone_never_hands_out_a_page_under_a_live_lease() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "soak_ring.py"), "--seconds", "3"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("0 read wrong"), done.stdout
    assert int(done.stdout.split()[0]) > 1000  # buffers checked
