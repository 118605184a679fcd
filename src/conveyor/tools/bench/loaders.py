"""The loaders ``conveyor bench`` compares, how each is built for a run and shut down.

- conveyor: ``DataLoader2(graph, reading_service=MultiProcessingReadingService(num_workers))``
  with its defaults (``num_workers=0`` reads in the calling process).
- torch: ``torch.utils.data.DataLoader(dataset, batch_size=None, num_workers)`` over the
  workload's ``IterableDataset`` (defaults otherwise: ``prefetch_factor=2``, no pinned
  memory, no persistent workers).
- torchdata 0.7.1: its ``DataLoader2`` with its ``MultiProcessingReadingService(num_workers)``,
  or ``InProcessReadingService`` for ``num_workers=0`` (what torchdata asks for then).

All use Python's default start method. torch and torchdata are optional: a loader that
cannot be imported is listed with the reason, never raised. Each :class:`Session` ends
every worker process it started in ``close()``, on every path.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from conveyor.tools.bench.workloads import CONVEYOR, TORCH, TORCHDATA, Prepared


class Session(ABC):
    """One loader built for one run: iterated once, then closed. ``close()`` must end
    every worker process the loader started, after an error too, so that no run leaves
    processes (and their CPU time) behind for the next one."""

    @abstractmethod
    def __iter__(self) -> Iterator[Any]:
        """The run's iterator (called once)."""

    @abstractmethod
    def close(self) -> None:
        """Shut the loader down and join its workers."""


class ConveyorSession(Session):
    """conveyor's ``DataLoader2``; ``shutdown()`` joins its workers."""

    def __init__(self, prepared: Prepared, workers: int):
        from conveyor import DataLoader2, MultiProcessingReadingService

        service = MultiProcessingReadingService(num_workers=workers)
        self.loader = DataLoader2(prepared.conveyor_pipe(), reading_service=service)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.loader)

    def close(self) -> None:
        self.loader.shutdown()


class TorchSession(Session):
    """torch's ``DataLoader``. Its workers are joined when its iterator is exhausted or
    deleted; ``close()`` joins them explicitly, because after an exception a traceback
    may still hold the iterator and delay its deletion."""

    def __init__(self, prepared: Prepared, workers: int):
        from torch.utils.data import DataLoader

        # batch_size=None: the datasets yield items (or the demo's batches) themselves.
        self.loader = DataLoader(prepared.torch_dataset(), batch_size=None, num_workers=workers)
        self._iterator: Any = None

    def __iter__(self) -> Iterator[Any]:
        self._iterator = iter(self.loader)
        return self._iterator

    def close(self) -> None:
        iterator, self._iterator = self._iterator, None
        shutdown = getattr(iterator, "_shutdown_workers", None)  # only the multi-process iterator has workers
        if shutdown is not None:
            shutdown()


class TorchdataSession(Session):
    """torchdata's ``DataLoader2``; ``shutdown()`` joins its workers."""

    def __init__(self, prepared: Prepared, workers: int):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torchdata announces its deprecation
            from torchdata.dataloader2 import DataLoader2, InProcessReadingService, MultiProcessingReadingService

        service = MultiProcessingReadingService(num_workers=workers) if workers else InProcessReadingService()
        self.loader = DataLoader2(prepared.torchdata_pipe(), reading_service=service)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.loader)

    def close(self) -> None:
        self.loader.shutdown()


_SESSIONS: dict[str, Callable[[Prepared, int], Session]] = {
    CONVEYOR: ConveyorSession,
    TORCH: TorchSession,
    TORCHDATA: TorchdataSession,
}


@dataclass(frozen=True)
class Loader:
    """A loader under test. ``unavailable`` holds why it cannot run here ('' when it can);
    a ``required`` loader's failure makes the benchmark's exit code 1 (torchdata is
    deprecated upstream, so its failures are only reported)."""

    key: str
    name: str
    unavailable: str = ""
    required: bool = True

    @property
    def available(self) -> bool:
        return not self.unavailable

    def open(self, prepared: Prepared, workers: int) -> Session:
        """Build this loader over ``prepared`` with ``workers`` worker processes."""
        return _SESSIONS[self.key](prepared, workers)


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


def torch_version() -> str:
    """torch's version, or '-' when it cannot be imported."""
    try:
        return str(_import_torch().__version__)
    except Exception:  # the reason is reported by torch_problem()
        return "-"


def torch_threads() -> str:
    """torch's intra-op threads in this process ('-' without torch): with ``num_workers=0``
    the tensor workload's ``torch.full`` runs here, and on a busy machine those threads
    wait for each other."""
    try:
        return str(_import_torch().get_num_threads())
    except Exception:  # the reason is reported by torch_problem()
        return "-"


def torchdata_version() -> str:
    """torchdata's version, or '-' when it cannot be imported."""
    try:
        return str(getattr(_import_torchdata(), "__version__", "?"))
    except Exception:  # the reason is reported in torchdata's rows
        return "-"


def available_loaders() -> list[Loader]:
    """conveyor, torch and torchdata, in the order runs alternate between them; the ones
    that cannot be imported carry ``unavailable: <reason>``."""
    loaders = [Loader(CONVEYOR, "conveyor DataLoader2")]
    problem = torch_problem()
    if problem:
        loaders.append(Loader(TORCH, "torch DataLoader", f"unavailable: {problem}"))
    else:
        loaders.append(Loader(TORCH, f"torch {torch_version()} DataLoader"))
    if problem:
        # torchdata runs on torch: without it, say so instead of torchdata's own import error.
        loaders.append(Loader(TORCHDATA, "torchdata DataLoader2", f"unavailable: needs torch ({problem})", False))
        return loaders
    try:
        torchdata = _import_torchdata()
    except Exception as err:  # ImportError, or torchdata failing against this torch
        loaders.append(Loader(TORCHDATA, "torchdata DataLoader2", f"unavailable: {_reason(err)}", False))
    else:
        version = getattr(torchdata, "__version__", "?")
        loaders.append(Loader(TORCHDATA, f"torchdata {version} DataLoader2", required=False))
    return loaders
