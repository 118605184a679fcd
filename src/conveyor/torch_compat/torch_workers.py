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
    (torch's scheme: ``base_seed + id``), then the user's ``worker_init_fn(worker_id)``."""

    #: The worker keeps these seeds for as long as it lives, as torch's workers do (a
    #: persistent worker's RNGs go on from one epoch to the next): conveyor's own seeding
    #: of the global RNGs at each epoch is left out.
    seeds_global_rngs = True

    def __init__(self, dataset: Any, base_seed: int, user_fn: Any) -> None:
        self.dataset = dataset
        self.base_seed = base_seed
        self.user_fn = user_fn

    def __deepcopy__(self, memo: dict[int, Any]) -> TorchWorkerStart:
        # The loader's copy of its reading service shares the dataset: here it is only the
        # fallback for get_worker_info().dataset (a worker finds its own copy in its graph),
        # and torch never copies a dataset, some of which cannot be (synchronized values,
        # nested tensors).
        return TorchWorkerStart(self.dataset, self.base_seed, self.user_fn)

    def __call__(self, graph: IterDataPipe, info: Any) -> IterDataPipe:
        torch = require_torch("conveyor.DataLoader")
        worker = torch.utils.data._utils.worker
        seed = self.base_seed + info.worker_id
        random.seed(seed)
        torch.manual_seed(seed)
        generate_state = getattr(worker, "_generate_state", None)
        if generate_state is not None:
            import numpy as np

            np.random.seed(generate_state(self.base_seed, info.worker_id))
        worker._worker_info = worker.WorkerInfo(
            id=info.worker_id, num_workers=info.num_workers, seed=seed, dataset=_dataset_in(graph, self.dataset)
        )
        if self.user_fn is not None:
            self.user_fn(info.worker_id)
        return graph


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
