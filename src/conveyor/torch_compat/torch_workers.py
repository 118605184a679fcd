"""torch's worker conventions in conveyor's workers, for ``conveyor.DataLoader``: each
worker's ``torch.utils.data.get_worker_info()``, its seeds, and the user's
``worker_init_fn``."""

from __future__ import annotations

import functools
import random
from typing import Any

from conveyor.core import shared_arrays
from conveyor.core.base import IterDataPipe
from conveyor.core.graph import list_dps
from conveyor.core.torch_support import require_torch
from conveyor.pipes.torch.fetching import Fetcher
from conveyor.pipes.torch.torch_sources import TorchIterableDataset


class TorchWorkerStart:
    """Runs once in each worker process: torch's worker info (``id``, ``num_workers``,
    ``seed``, ``dataset``) for ``torch.utils.data.get_worker_info()``, the worker's seeds
    (torch's scheme: ``base_seed + id``), then the user's ``worker_init_fn(worker_id)``.

    The worker leaves its global RNGs to :meth:`seed_epoch` (conveyor's own seeding of
    them is left out), so they hold torch's seeds, not conveyor's.
    """

    def __init__(self, dataset: Any, base_seed: int, user_fn: Any) -> None:
        self.dataset = dataset
        self.base_seed = base_seed
        self.user_fn = user_fn
        self._seeded_with: int | None = None  # the base seed the worker's RNGs were last seeded from
        self._info: tuple[int, Any] | None = None  # (num_workers, dataset) in this worker

    def __deepcopy__(self, memo: dict[int, Any]) -> TorchWorkerStart:
        # The loader's copy of its reading service shares the dataset: here it is only the
        # fallback for get_worker_info().dataset (a worker finds its own copy in its graph),
        # and torch never copies a dataset, some of which cannot be (synchronized values,
        # nested tensors).
        return TorchWorkerStart(self.dataset, self.base_seed, self.user_fn)

    def __call__(self, graph: IterDataPipe, info: Any) -> IterDataPipe:
        self._info = (info.num_workers, _dataset_in(graph, self.dataset))
        self._seed(self.base_seed, info.worker_id)
        if self.user_fn is not None:
            self.user_fn(info.worker_id)
        return graph

    def seed_epoch(self, base_seed: int, worker_id: int) -> None:
        """At each epoch's start in the worker, with the epoch's base seed. Its first epoch
        keeps the seeds it started with (and what ``worker_init_fn`` made of them), as
        torch's workers do. A persistent worker is seeded again for each later epoch, by
        torch's scheme from that epoch's base seed (torch's would go on drawing), so that an
        epoch's draws follow from the base seed a state holds and resume exactly."""
        if base_seed != self._seeded_with:
            self._seed(base_seed, worker_id)

    def _seed(self, base_seed: int, worker_id: int) -> None:
        torch = require_torch("conveyor.DataLoader")
        worker = torch.utils.data._utils.worker
        seed = base_seed + worker_id
        random.seed(seed)
        torch.manual_seed(seed)
        generate_state = getattr(worker, "_generate_state", None)
        if generate_state is not None:
            import numpy as np

            np.random.seed(generate_state(base_seed, worker_id))
        assert self._info is not None  # set as the worker starts
        num_workers, dataset = self._info
        worker._worker_info = worker.WorkerInfo(id=worker_id, num_workers=num_workers, seed=seed, dataset=dataset)
        self._seeded_with = base_seed


def _dataset_in(graph: IterDataPipe, default: Any) -> Any:
    """The dataset this worker's graph reads (its own copy: what ``get_worker_info().dataset``
    must be, so that a ``worker_init_fn`` that configures it configures what is read)."""
    for node in list_dps(graph):
        if isinstance(node, TorchIterableDataset):
            return node.dataset
        if isinstance(node, Fetcher):
            return node.fetch.dataset
    return default


def worker_collate(collate_fn: Any) -> Any:
    """The collate function conveyor's workers run for ``collate_fn``: torch's
    ``default_collate`` stacks tensors straight into the worker's ring here
    (:func:`conveyor.core.shared_arrays.stack_tensors`), which the batch is then sent
    from without a copy, where torch's own would make a new shared-memory segment for
    each batch (a second copy, and page faults on every batch). Same values, types and
    errors; any other ``collate_fn`` runs as given."""
    torch = require_torch("conveyor.DataLoader")
    collate = torch.utils.data._utils.collate
    if collate_fn is not collate.default_collate:
        return collate_fn
    return functools.partial(collate.collate, collate_fn_map={**collate.default_collate_fn_map, torch.Tensor: _stack})


def _stack(batch: Any, *, collate_fn_map: Any = None) -> Any:
    torch = require_torch("conveyor.DataLoader")
    first = batch[0]
    if first.is_nested or first.layout != torch.strided:  # torch's errors for these, as torch raises them
        return torch.utils.data._utils.collate.collate_tensor_fn(batch, collate_fn_map=collate_fn_map)
    return shared_arrays.stack_tensors(batch)
