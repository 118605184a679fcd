"""The loaders ``conveyor bench`` compares, how each is built for a run and shut down.

- conveyor: ``DataLoader2(graph, reading_service=MultiProcessingReadingService(num_workers))``
  with its defaults (``num_workers=0`` reads in the calling process).
- torch: ``torch.utils.data.DataLoader(dataset, batch_size=None, num_workers)`` over the
  workload's ``IterableDataset`` (defaults otherwise: ``prefetch_factor=2``, no pinned
  memory, no persistent workers).
- torchdata 0.7.1: its ``DataLoader2`` with its ``MultiProcessingReadingService(num_workers)``,
  or ``InProcessReadingService`` for ``num_workers=0`` (what torchdata asks for then).

All use Python's default start method, and the run's ``workers`` setting. torch and
torchdata are optional: a loader that cannot be imported is a row saying why (found in the
orchestrator, before any run), never an error. Each loader's shutdown ends every worker
process it started.
"""

from __future__ import annotations

import warnings
from types import ModuleType
from typing import Any

from conveyor.tools.bench.harness.declare import Context, Loader, Opened
from conveyor.tools.bench.workloads import conveyor_pipe, torch_dataset, torchdata_pipe


def open_conveyor(context: Context) -> Opened:
    from conveyor import DataLoader2, MultiProcessingReadingService

    service = MultiProcessingReadingService(num_workers=context.settings["workers"])
    loader = DataLoader2(conveyor_pipe(context), reading_service=service)
    return Opened(loader, loader.shutdown)


def _shut_torch(iterator: Any) -> None:
    """torch's ``DataLoader`` joins its workers when its iterator is exhausted or deleted;
    this joins them explicitly, because after an exception a traceback may still hold the
    iterator and delay its deletion."""
    shutdown = getattr(iterator, "_shutdown_workers", None)  # only the multi-process iterator has workers
    if shutdown is not None:
        shutdown()


def open_torch(context: Context) -> Opened:
    from torch.utils.data import DataLoader

    # batch_size=None: the datasets yield items (or the demo's batches) themselves.
    iterator = iter(DataLoader(torch_dataset(context), batch_size=None, num_workers=context.settings["workers"]))
    return Opened(iterator, lambda: _shut_torch(iterator))


def open_torchdata(context: Context) -> Opened:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchdata announces its deprecation
        from torchdata.dataloader2 import DataLoader2, InProcessReadingService, MultiProcessingReadingService

    workers = context.settings["workers"]
    service = MultiProcessingReadingService(num_workers=workers) if workers else InProcessReadingService()
    loader = DataLoader2(torchdata_pipe(context), reading_service=service)
    return Opened(loader, loader.shutdown)


def _import_torch() -> ModuleType:
    import torch

    return torch


def _import_torchdata() -> ModuleType:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchdata announces its deprecation on import
        import torchdata
        import torchdata.dataloader2
        import torchdata.datapipes.iter

    return torchdata


def _reason(err: BaseException) -> str:
    return " ".join(f"{type(err).__name__}: {err}".split())


def torch_problem() -> str:
    """Why torch cannot be used here ('' when it can)."""
    try:
        _import_torch()
    except Exception as err:  # ImportError, or a broken install failing in its own way
        return _reason(err)
    return ""


def torchdata_problem() -> str:
    """Why torchdata's ``DataLoader2`` cannot be used here ('' when it can)."""
    problem = torch_problem()
    if problem:  # torchdata runs on torch: say so instead of torchdata's own import error
        return f"needs torch ({problem})"
    try:
        _import_torchdata()
    except Exception as err:  # ImportError, or torchdata failing against this torch
        return _reason(err)
    return ""


LOADERS = (
    Loader("conveyor", "conveyor DataLoader2", open=open_conveyor, packages=("conveyor",)),
    Loader("torch", "torch DataLoader", open=open_torch, packages=("torch",), unavailable=torch_problem),
    Loader(
        "torchdata",
        "torchdata DataLoader2",
        open=open_torchdata,
        packages=("torch", "torchdata"),
        unavailable=torchdata_problem,
    ),
)
#: The loaders whose failure makes ``conveyor bench`` exit 1 (torchdata is deprecated
#: upstream: its failures are only reported in its rows).
REQUIRED = ("conveyor", "torch")
