"""What each item goes through in the workloads of ``conveyor bench``: the per-item
functions (module level, so graphs pickle under every start method) and the demo's item
shuffle and keyed augmentation for loaders without conveyor's ops.

Every item names its id (an int is its own; a 1 MiB array holds it in its first bytes; a
``cpu`` item is a pair), so that a run's tally checks each item was delivered once. Both
sides use these: the conveyor and torchdata graphs (:mod:`conveyor.tools.bench.workloads`)
and the torch ``IterableDataset`` classes (:mod:`conveyor.tools.bench.torch_datasets`).
Nothing here imports torch at import time.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

MIB = 1 << 20
#: A 1 MiB item's first bytes: its id, an int64 (the rest is the id's fill value).
ID_BYTES = 8
#: The fill value of item ``i`` is ``i % FILL_MODULUS``.
FILL_MODULUS = 251
CPU_FFT_SIZE = 4096
#: Rounds of rfft -> filter -> irfft -> cos per item: about 1 ms on a 2020s x86 core.
CPU_ROUNDS = 12
_CPU_FILTER = 1.0 / (1.0 + np.arange(CPU_FFT_SIZE // 2 + 1))


def identity(i: int) -> int:
    """The ``small`` workload: nothing to compute, so only the loader's own cost shows."""
    return i


def numpy_mib(i: int) -> np.ndarray:
    """1 MiB of uint8, every byte ``i % 251`` but the first :data:`ID_BYTES`, which hold
    ``i``: cheap to make, and it names its id."""
    out = np.full(MIB, i % FILL_MODULUS, dtype=np.uint8)
    out[:ID_BYTES].view(np.int64)[0] = i
    return out


def tensor_mib(i: int) -> Any:
    """The torch twin of :func:`numpy_mib`, to exercise each loader's tensor path."""
    import torch

    out = torch.full((MIB,), i % FILL_MODULUS, dtype=torch.uint8)
    out[:ID_BYTES].view(torch.int64)[0] = i
    return out


def cpu_value(i: int) -> float:
    """About 1 ms of deterministic CPU work (FFT filtering of a 4096-sample signal): the
    same input gives the same float in every process, so the result is checkable."""
    x = np.sin(np.arange(CPU_FFT_SIZE, dtype=np.float64) * ((i % 1009) + 1) * 1e-3)
    for _ in range(CPU_ROUNDS):
        x = np.cos(3.0 * np.fft.irfft(np.fft.rfft(x) * _CPU_FILTER, CPU_FFT_SIZE))
    return float(x.sum())


def cpu_heavy(i: int) -> tuple[int, float]:
    """The ``cpu`` workload's item: the id and its :func:`cpu_value`."""
    return i, cpu_value(i)


#: The seed of the torch and torchdata sides' per-item augmentation and shard order.
DEMO_SEED = 20240601


def augment_keyed(item: Any) -> Any:
    """The demo's ``augment`` with a generator keyed by the item's dataset index: the same
    per-item cost as conveyor's ``random_map`` (a fresh Philox generator per item), for
    loaders without a keyed random map."""
    from conveyor.tools.demo import augment

    return augment(item, np.random.Generator(np.random.Philox(key=[DEMO_SEED, int(item[2])])))


def buffer_shuffle(items: Iterable[Any], buffer_size: int, rng: random.Random) -> Iterator[Any]:
    """Shuffle within a buffer of ``buffer_size`` items, as the shuffle pipes do (fill the
    buffer, then hand out a random slot and refill it): the torch side's item shuffle."""
    buffer: list[Any] = []
    for item in items:
        if len(buffer) < buffer_size:
            buffer.append(item)
            continue
        slot = rng.randrange(buffer_size)
        yield buffer[slot]
        buffer[slot] = item
    rng.shuffle(buffer)
    yield from buffer
