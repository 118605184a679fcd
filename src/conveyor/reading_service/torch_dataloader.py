"""``TorchDataLoaderReadingService``: run a conveyor graph with ``torch.utils.data.DataLoader``.

The older of torchdata's multiprocessing services, for users who want torch's own worker
machinery (its ``worker_init_fn``, ``pin_memory`` thread, ``persistent_workers``,
``timeout``, start methods) under a conveyor ``DataLoader2``. The graph is wrapped in a
``torch.utils.data.IterableDataset`` and read by a ``DataLoader`` with automatic batching
off (``batch_size=None``) and no collation: batching and collation are pipes.

* Sharding: each torch worker keeps its ``MULTIPROCESSING`` shard of the graph
  (``apply_sharding(graph, num_workers, worker_id, MULTIPROCESSING)``), so together the
  workers yield every item once. Torch merges the workers round robin. Torch's
  ``get_worker_info()`` is set in the workers as usual, so a torch ``IterableDataset``
  that splits itself by it (torch's recipe) works without a ``sharding_filter``.
* Seeds: each epoch's seeds come from the loader's ``SeedGenerator``, through shared
  memory, so they reach ``persistent_workers`` too (see
  :mod:`conveyor.reading_service._torch_worker`). Worker ``w`` seeds its random ops from
  ``seeds.spawn(w)`` and the global RNGs (``random``, numpy, torch) from
  ``seeds.spawn(w).global_rng_seed()``; torch's own per-worker seeding happens before and is
  overridden at each epoch. A seeded ``DataLoader2`` yields the same items every run.
* Non-replicable ops (``pin_memory``, ``fullsync``) and what follows them stay in the main
  process, reading torch's output, as with :class:`MultiProcessingReadingService`.
* Not checkpointable: torch's DataLoader cannot say where its workers are, so a mid-epoch
  ``DataLoader2.state_dict()`` raises ``TypeError``; between epochs it works.
* ``finalize()`` (``DataLoader2.shutdown()``) stops the workers, persistent ones included.

Requires torch (``pip install 'conveyor[torch]'``); the class can be imported without it
and says so when it is created.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator
from typing import Any

from conveyor.core.base import DataPipe, IterDataPipe
from conveyor.core.graph import apply_random_seed, replace_dp
from conveyor.core.random import SeedGenerator
from conveyor.core.read_ahead import close_iterator
from conveyor.core.torch_support import require_torch
from conveyor.reading_service.graph_split import split_replicable
from conveyor.reading_service.interface import IterResetFn, ReadingServiceInterface

_SEED_MASK = (1 << 63) - 1


class TorchDataLoaderReadingService(ReadingServiceInterface):
    """Reads the graph through ``torch.utils.data.DataLoader``; the arguments are torch's.

    Args:
        num_workers: worker processes (0: torch reads in the main process).
        pin_memory: torch's pin-memory thread for the output (a no-op without an accelerator).
        timeout: seconds to wait for a worker's next item (0: forever), as torch.
        worker_init_fn: ``fn(worker_id)``, called in each worker at start, as torch does
            (after conveyor's sharding, so :func:`conveyor.get_worker_info` works in it).
        multiprocessing_context: a start method name or a multiprocessing context.
        prefetch_factor: items each worker loads ahead (torch's default 2 when None).
        persistent_workers: keep the workers between epochs.

    With ``num_workers=0`` the three worker options are dropped, as the reference does.

    Arguments are checked here, by torch's rules, so a mistake fails when the service is
    built rather than at the first ``iter()``.
    """

    def __init__(
        self,
        num_workers: int = 0,
        pin_memory: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], Any] | None = None,
        multiprocessing_context: Any = None,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
    ):
        require_torch("TorchDataLoaderReadingService")
        _check_arguments(
            num_workers,
            pin_memory,
            timeout,
            worker_init_fn,
            multiprocessing_context,
            prefetch_factor,
            persistent_workers,
        )
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        # As the reference: without workers these worker options mean nothing (torch would
        # refuse them), so they are dropped.
        self.multiprocessing_context = multiprocessing_context if num_workers else None
        self.prefetch_factor = prefetch_factor if num_workers else None
        self.persistent_workers = persistent_workers if num_workers else False
        self._loader: Any = None  # torch.utils.data.DataLoader, built by initialize
        self._mailbox: Any = None
        self._generator: Any = None
        self._end: IterDataPipe | None = None
        self._live: Any = None  # the torch iterator of the epoch being read

    # --- lifecycle -----------------------------------------------------------------------

    def initialize(self, datapipe: DataPipe) -> DataPipe:
        if not isinstance(datapipe, IterDataPipe):
            raise TypeError(f"expected an IterDataPipe, got {type(datapipe).__name__}")
        if self._loader is not None:
            raise RuntimeError("TorchDataLoaderReadingService is already initialized; DataLoader2 uses a copy of it")
        torch = require_torch("TorchDataLoaderReadingService")
        from conveyor.reading_service._torch_worker import GraphDataset, SeedMailbox, WorkerInit, no_collate

        worker_graph, tail = split_replicable(datapipe)
        self._mailbox = SeedMailbox()
        self._generator = torch.Generator()  # torch's own worker seeds, from ours (not the global RNG)
        self._loader = torch.utils.data.DataLoader(
            GraphDataset(worker_graph, self._mailbox),
            batch_size=None,
            collate_fn=no_collate,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            timeout=self.timeout,
            worker_init_fn=WorkerInit(self.worker_init_fn) if self.num_workers else self.worker_init_fn,
            multiprocessing_context=self.multiprocessing_context,
            generator=self._generator,
            prefetch_factor=self.prefetch_factor,
            persistent_workers=self.persistent_workers,
        )
        reader = TorchLoaderReader(self)
        if tail:
            replace_dp(tail[-1], worker_graph, reader)
            self._end = tail[0]
        else:
            self._end = reader
        return self._end

    def initialize_iteration(
        self, seed_generator: SeedGenerator, iter_reset_fn: IterResetFn | None = None
    ) -> IterResetFn | None:
        if self._end is None:
            raise RuntimeError("TorchDataLoaderReadingService is not initialized; iterate the loader first")
        self._mailbox.write(seed_generator)
        self._generator.manual_seed(seed_generator.generate_shared_seed() & _SEED_MASK)
        apply_random_seed(self._end, seed_generator)  # ops kept in the main process
        return iter_reset_fn

    def finalize(self) -> None:
        """Stop every worker (the epoch's, and persistent ones); idempotent."""
        live, self._live = self._live, None
        _shutdown(live)
        loader, self._loader = self._loader, None
        if loader is not None:
            _shutdown(getattr(loader, "_iterator", None))  # persistent workers live there
            loader._iterator = None
        self._end = self._mailbox = self._generator = None

    # --- reading -------------------------------------------------------------------------

    def _read(self) -> Iterator[Any]:
        if self._loader is None:
            raise RuntimeError("TorchDataLoaderReadingService was finalized; create a new DataLoader2")
        iterator = iter(self._loader)
        self._live = iterator
        try:
            yield from iterator
        finally:
            # An epoch left early (a new iter(), shutdown): its workers stop now, unless
            # they are persistent (torch reuses them for the next epoch; finalize stops them).
            if self._live is iterator:
                self._live = None
            if not self.persistent_workers:
                _shutdown(iterator)

    def __getstate__(self) -> dict[str, Any]:
        if self._loader is not None:
            raise TypeError("an initialized TorchDataLoaderReadingService cannot be copied or pickled")
        return dict(self.__dict__)


class TorchLoaderReader(IterDataPipe):
    """The end of the adapted graph: the torch DataLoader's output, one epoch per pass.
    A mid-epoch state cannot resume it: torch's epoch is not replayed to a position."""

    replayable = False

    def __init__(self, service: TorchDataLoaderReadingService):
        self._service = service

    def __iter__(self) -> Iterator[Any]:
        items = self._service._read()
        try:
            yield from items
        finally:
            close_iterator(items)


def _shutdown(iterator: Any) -> None:
    """Stop a torch DataLoader iterator's workers (torch's own shutdown: it joins them)."""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


def _check_arguments(
    num_workers: Any,
    pin_memory: Any,
    timeout: Any,
    worker_init_fn: Any,
    multiprocessing_context: Any,
    prefetch_factor: Any,
    persistent_workers: Any,
) -> None:
    """torch.utils.data.DataLoader's rules, checked up front with conveyor's wording."""
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        raise ValueError(f"num_workers must be an int >= 0 (0 reads in the main process), got {num_workers!r}")
    if not isinstance(pin_memory, bool):
        raise TypeError(f"pin_memory must be a bool, got {type(pin_memory).__name__}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
        raise ValueError(f"timeout must be a number of seconds >= 0 (0: wait forever), got {timeout!r}")
    if worker_init_fn is not None and not callable(worker_init_fn):
        raise TypeError(f"worker_init_fn must be callable or None, got {type(worker_init_fn).__name__}")
    if not isinstance(persistent_workers, bool):
        raise TypeError(f"persistent_workers must be a bool, got {type(persistent_workers).__name__}")
    if prefetch_factor is not None and (
        isinstance(prefetch_factor, bool) or not isinstance(prefetch_factor, int) or prefetch_factor < 1
    ):
        raise ValueError(f"prefetch_factor must be an int >= 1 or None, got {prefetch_factor!r}")
    if multiprocessing_context is not None:
        if isinstance(multiprocessing_context, str):
            methods = multiprocessing.get_all_start_methods()
            if multiprocessing_context not in methods:
                raise ValueError(f"multiprocessing_context must be one of {methods}, got {multiprocessing_context!r}")
        elif not isinstance(multiprocessing_context, multiprocessing.context.BaseContext):
            raise TypeError(
                "multiprocessing_context must be a start method name or a multiprocessing context, "
                f"got {type(multiprocessing_context).__name__}"
            )
