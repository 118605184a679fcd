"""The torch side of the workloads: ``torch.utils.data.IterableDataset`` classes doing, in
each torch worker, what the conveyor graphs do in each conveyor worker.

A module of its own because it imports torch at import time (the classes must subclass
torch's ``IterableDataset``), and ``conveyor bench`` must still run, and report torch
as unavailable, without torch.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import IterableDataset, default_collate, get_worker_info

from conveyor.tools.bench.per_item import augment_keyed, buffer_shuffle


def _worker() -> tuple[int, int]:
    """``(worker id, number of workers)``; ``(0, 1)`` when reading in the main process."""
    info = get_worker_info()
    return (info.id, info.num_workers) if info is not None else (0, 1)


class ShardedRange(IterableDataset):
    """``fn(i)`` for this worker's share of ``range(n)``: what ``sharding_filter().map(fn)``
    yields in a conveyor or torchdata worker."""

    def __init__(self, n: int, fn: Callable[[int], Any]):
        self.n, self.fn = n, fn

    def __iter__(self) -> Iterator[Any]:
        worker_id, num_workers = _worker()
        return map(self.fn, range(worker_id, self.n, num_workers))


class DemoShards(IterableDataset):
    """The demo pipeline, per torch worker: every worker shuffles the shard list with the
    same seed and keeps every ``num_workers``-th shard (the sharding point), decodes its
    shards, shuffles items in a buffer, augments each item, and yields collated batches
    (torch's ``default_collate``: tensors), as conveyor's graph does per worker."""

    def __init__(self, files: list[str], batch_size: int, shuffle_buffer: int, seed: int):
        self.files, self.batch_size, self.shuffle_buffer, self.seed = list(files), batch_size, shuffle_buffer, seed

    def __iter__(self) -> Iterator[Any]:
        from conveyor.tools.demo import load_shard

        worker_id, num_workers = _worker()
        files = list(self.files)
        random.Random(self.seed).shuffle(files)  # the same order in every worker
        items: Iterator[Any] = (item for path in files[worker_id::num_workers] for item in load_shard(path))
        if self.shuffle_buffer > 1:
            items = buffer_shuffle(items, self.shuffle_buffer, random.Random(self.seed * 1009 + worker_id))
        batch: list[Any] = []
        for item in items:
            batch.append(augment_keyed(item))
            if len(batch) == self.batch_size:
                yield default_collate(batch)
                batch = []
        if batch:
            yield default_collate(batch)
