"""What :class:`~conveyor.reading_service.TorchDataLoaderReadingService` hands to torch (imports torch).

* :class:`GraphDataset`: the conveyor graph as a ``torch.utils.data.IterableDataset``. In
  each torch worker it applies conveyor's ``MULTIPROCESSING`` sharding once, and at each
  epoch it seeds the graph and the worker's global RNGs from the loader's seeds.
* :class:`SeedMailbox`: how each epoch's seeds reach the workers. Torch pickles the
  dataset into a worker when the worker starts; with ``persistent_workers=True`` that copy
  lives on across epochs and never sees later changes to the main process's object. Torch
  only re-seeds persistent workers for its own datapipes (with a seed of its own making),
  so the mailbox is a small tensor in shared memory: the main process writes the epoch's
  ``SeedGenerator`` (base seed, epoch, path) into it before each ``iter()`` of the torch
  loader, and every worker reads it when torch asks it for the epoch's iterator, which
  happens after the loader told it that the new epoch started.
* :class:`WorkerInit`: torch's ``worker_init_fn`` hook, run in each worker before the
  user's own ``worker_init_fn(worker_id)``.

Under ``spawn``/``forkserver`` torch pickles the dataset and the init hook with its own
pickler; the graph and the user's function travel through :mod:`conveyor.core.serialization`
(by value, so lambdas work), the mailbox as a shared-memory tensor.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import IterableDataset, get_worker_info

from conveyor.core.base import IterDataPipe
from conveyor.core.graph import SHARDING_PRIORITIES, apply_random_seed, apply_sharding, find_dps
from conveyor.core.random import SeedGenerator, seed_global_rngs
from conveyor.core.serialization import dumps, loads
from conveyor.core.worker_info import WorkerInfo, set_worker_info
from conveyor.pipes.torch.torch_sources import TorchIterableDataset

_MASK32 = (1 << 32) - 1


class SeedMailbox:
    """One epoch's :class:`SeedGenerator`, in a shared-memory tensor that every copy of the
    dataset (in any worker, under any start method) reads the same.

    Layout (int64 slots): ``[published, epoch, base >> 32, base & 0xFFFFFFFF, len(path), *path]``.
    """

    SLOTS = 64

    def __init__(self, tensor: torch.Tensor | None = None):
        if tensor is None:
            tensor = torch.zeros(self.SLOTS, dtype=torch.int64).share_memory_()
        self.tensor = tensor

    def write(self, seeds: SeedGenerator) -> None:
        path = seeds.path
        if len(path) > self.SLOTS - 5:
            raise ValueError(f"a seed path of {len(path)} levels does not fit the mailbox ({self.SLOTS - 5} at most)")
        base = seeds.base_seed
        values = [2 if seeds.drawn else 1, seeds.epoch, base >> 32, base & _MASK32, len(path), *path]
        self.tensor[: len(values)] = torch.tensor(values, dtype=torch.int64)

    def read(self) -> SeedGenerator:
        values = self.tensor.tolist()
        if values[0] not in (1, 2):  # published: 1 a seed of the user's, 2 one drawn for the epoch
            raise RuntimeError("no epoch seeds were published; the reading service starts each epoch")
        epoch, high, low, length = values[1:5]
        return SeedGenerator((high << 32) | low, epoch=epoch, path=tuple(values[5 : 5 + length]), drawn=values[0] == 2)

    def __reduce__(self) -> tuple[Any, ...]:
        return (SeedMailbox, (self.tensor,))


class GraphDataset(IterableDataset):
    """The replicated part of a conveyor graph, iterated by ``torch.utils.data.DataLoader``.

    In the main process (``num_workers=0``) it reads the whole graph with the epoch's seeds
    and leaves the global RNGs alone (as conveyor's in-process services do). In worker
    ``w`` of ``n`` it keeps shard ``w`` of ``n`` at ``MULTIPROCESSING`` priority, seeds its
    random ops from ``seeds.spawn(w)`` and ``random``/numpy/torch from
    ``seeds.spawn(w).global_rng_seed()``, new each epoch.
    """

    def __init__(self, graph: IterDataPipe, mailbox: SeedMailbox):
        self.graph = graph
        self.mailbox = mailbox
        self._worker: WorkerInfo | None = None  # set once in a worker process

    def enter_worker(self, worker_id: int, num_workers: int) -> None:
        """Shard the graph for this worker (once per process: persistent workers keep it)."""
        if self._worker is not None:
            return
        info = WorkerInfo(num_workers, worker_id)
        set_worker_info(info)
        with warnings.catch_warnings():
            if find_dps(self.graph, TorchIterableDataset):
                # Torch's worker info is set here, so a torch IterableDataset may split
                # itself, as under torch: conveyor's "no sharding_filter()" warning would
                # be wrong for it (and torch gives none either way).
                warnings.filterwarnings("ignore", message=".*has no sharding_filter", category=UserWarning)
            apply_sharding(self.graph, num_workers, worker_id, SHARDING_PRIORITIES.MULTIPROCESSING)
        self._worker = info

    def __iter__(self) -> Iterator[Any]:
        # Eager (not a generator function): torch calls iter() when the worker starts an
        # epoch, which is when the mailbox holds that epoch's seeds.
        seeds = self.mailbox.read()
        info = get_worker_info()
        if info is not None:
            self.enter_worker(info.id, info.num_workers)
            seeds = seeds.spawn(info.id)
            seed_global_rngs(seeds.global_rng_seed())
        apply_random_seed(self.graph, seeds)
        return iter(self.graph)  # a fresh pass

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_dataset, (dumps(self.graph), self.mailbox))


def _rebuild_dataset(graph: bytes, mailbox: SeedMailbox) -> GraphDataset:
    return GraphDataset(loads(graph), mailbox)


class WorkerInit:
    """Torch's ``worker_init_fn``: makes the worker a conveyor worker (sharding, worker
    info for :func:`conveyor.get_worker_info`), then calls ``fn(worker_id)`` as torch would."""

    def __init__(self, fn: Callable[[int], Any] | None):
        self.fn = fn

    def __call__(self, worker_id: int) -> None:
        info = get_worker_info()
        if info is not None and isinstance(info.dataset, GraphDataset):
            info.dataset.enter_worker(worker_id, info.num_workers)
        if self.fn is not None:
            self.fn(worker_id)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_init, (dumps(self.fn),))


def _rebuild_init(fn: bytes) -> WorkerInit:
    return WorkerInit(loads(fn))


def no_collate(item: Any) -> Any:
    """Torch's ``collate_fn`` with ``batch_size=None``: items as the graph made them (torch's
    default would turn numpy arrays into tensors; batching and collation are pipes here)."""
    return item
