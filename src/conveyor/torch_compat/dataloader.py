"""``conveyor.DataLoader``: torch's ``DataLoader`` (and torchdata's ``StatefulDataLoader``)
on conveyor's engine.

A map-style dataset is read as torch reads it: the main process iterates the (batch)
sampler and hands each batch of keys round-robin to the workers, which fetch and
collate it; batches come out in the sampler's order. Here the sampler is a resumable
source (:class:`~conveyor.pipes.torch.sampler_source.SamplerSource`) read by the
multiprocessing service's dispatcher, so a ``state_dict()`` at any step resumes exactly,
with any number of workers. An ``IterableDataset`` is iterated by every worker, with
torch's ``get_worker_info()`` set there, as torch does.

Seeds follow torch: each ``iter()`` draws a base seed from ``generator`` (torch's global
RNG without one) before the sampler draws its order; worker ``i`` seeds torch, ``random``
and numpy from ``base_seed + i`` when it starts. Without ``persistent_workers`` the
workers start again every epoch, as torch's do; persistent workers are seeded so again at
each later epoch, from its base seed (torch's go on drawing), so that a state saved
between epochs resumes the next one exactly.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from conveyor.core.base import IterDataPipe
from conveyor.core.plain_state import keeps_state
from conveyor.core.random import global_rng_digest
from conveyor.core.torch_support import require_torch
from conveyor.core.validation import check_int
from conveyor.errors import StateError
from conveyor.loader.inner import InnerLoader
from conveyor.pipes.batch import batch_count
from conveyor.pipes.torch.fetching import Fetch, Fetcher
from conveyor.pipes.torch.iterable_batches import IterableBatches
from conveyor.pipes.torch.sampler_source import (
    EpochStart,
    SamplerSource,
    encode_rng,
    epoch_origin,
    sampler_generator,
)
from conveyor.pipes.torch.torch_sources import TorchIterableDataset
from conveyor.reading_service import InProcessReadingService, MultiProcessingReadingService
from conveyor.torch_compat.accelerate_support import AccelerateParticipant
from conveyor.torch_compat.arguments import LoaderArguments, resolve, start_method
from conveyor.torch_compat.batches import EpochBatches
from conveyor.torch_compat.checkpoint import DataLoaderCheckpoint
from conveyor.torch_compat.resumed_epoch import ResumedEpoch
from conveyor.torch_compat.state import borrowed_rng, draw_base_seed, redraw_epoch_start
from conveyor.torch_compat.torch_workers import TorchWorkerStart, worker_collate

T_co = TypeVar("T_co", covariant=True)

if TYPE_CHECKING:  # what DataLoader derives from, for type checkers
    import torch as _torch
else:
    _torch = require_torch("conveyor.DataLoader")


class DataLoader(DataLoaderCheckpoint, AccelerateParticipant, _torch.utils.data.DataLoader[T_co]):
    """torch's ``DataLoader`` with torchdata's ``StatefulDataLoader`` checkpoints: the same
    arguments, checks, batches and worker conventions, on conveyor's engine.

    It is a subclass of ``torch.utils.data.DataLoader`` (none of whose machinery it runs),
    so that what trainers do to torch's loaders they do to this one: Lightning injects its
    ``DistributedSampler`` and re-creates the loader with it (a ``conveyor.DataLoader``
    again), and under plain DDP a ``DistributedSampler`` passed in shards it as it shards
    torch's. Accelerate's ``prepare()`` keeps it as it is (see
    :class:`~conveyor.torch_compat.accelerate_support.AccelerateParticipant`) and shards it by process,
    and its ``save_state`` and ``load_state`` save and load its state.

    ``state_dict()`` at any step is plain JSON-safe data; a new loader built with the same
    arguments resumes from it (``load_state_dict``) with exactly the batches that were
    still to come. Asked before the first ``iter()``, it starts nothing and holds what the
    first epoch will draw from, so a loader resumed from it reads the epoch this one's next
    ``iter()`` would (a dataset that keeps a state of its own makes the first epoch begin
    then, as torchdata's does, so the state holds the dataset's as it begins).
    ``snapshot_every_n_steps`` spaces the snapshots of an ``IterableDataset`` that keeps
    its own position (``0`` or ``None``: after every batch, as ``1``); every other state
    is exact at every step at no extra cost.

    Args:
        dataset: A map-style ``Dataset`` (``__getitem__`` and ``__len__``) or an
            ``IterableDataset``.
        batch_size: Items per batch; None: no batching, each item passes through ``collate_fn``
            alone.
        shuffle: Read a map-style dataset in a new random order each epoch (a ``RandomSampler``).
            Must be left unset for an ``IterableDataset``.
        sampler: The keys to read, in order (a ``Sampler`` or any iterable of keys); excludes
            ``shuffle``.
        batch_sampler: Lists of keys, one per batch; excludes ``batch_size``, ``shuffle``,
            ``sampler`` and ``drop_last``.
        num_workers: Worker processes that load the batches; 0: load them in this process.
        collate_fn: Makes a batch of a list of items; None: torch's ``default_collate`` (or
            ``default_convert`` without batching).
        pin_memory: Pin the batches' tensors in the main process, for faster copies to an
            accelerator (a warning, and no pinning, when there is none).
        drop_last: Leave out the last batch of an epoch when it is short.
        timeout: With workers, seconds to wait for a batch from them; past it,
            :class:`~conveyor.errors.WorkerTimeoutError`. 0: no limit.
        worker_init_fn: Called as ``worker_init_fn(worker_id)`` in each worker as it starts, after
            the worker's seeds are set, as in torch.
        multiprocessing_context: The workers' start method: a name (``"fork"``, ``"spawn"``,
            ``"forkserver"``) or a ``multiprocessing`` context; None: the platform's default.
        generator: A ``torch.Generator`` that draws each epoch's base seed and the
            ``RandomSampler``'s order; None: torch's global RNG.
        prefetch_factor: Batches each worker loads ahead (None: 2 with workers); only with
            ``num_workers > 0``.
        persistent_workers: Keep the workers (and their copies of the dataset) from one epoch to the
            next instead of starting them again.
        pin_memory_device: The device to pin for; ``""``: the current accelerator.
        in_order: Hand out the batches in the sampler's order (True), or each as soon as a worker
            has it (False).
        snapshot_every_n_steps: For an ``IterableDataset`` that keeps its own position
            (``state_dict()``): snapshot it every this many batches; a resume reads again the
            batches after the last snapshot. ``0`` or None: every batch, as ``1``.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int = 0,
        collate_fn: Any = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Any = None,
        multiprocessing_context: Any = None,
        generator: Any = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        snapshot_every_n_steps: int | None = 1,
    ) -> None:
        check_int("snapshot_every_n_steps", snapshot_every_n_steps, 0, allow_none=True)
        self._args: LoaderArguments = resolve(
            dataset,
            batch_size,
            shuffle,
            sampler,
            batch_sampler,
            num_workers,
            collate_fn,
            drop_last,
            timeout,
            generator,
            prefetch_factor,
            persistent_workers,
        )
        args = self._args
        self.dataset = dataset
        self.batch_size = args.batch_size
        self.drop_last = args.drop_last
        self.sampler = args.sampler
        self.batch_sampler = args.batch_sampler
        self.num_workers = num_workers
        self.collate_fn = args.collate_fn
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.generator = generator
        self.prefetch_factor = args.prefetch_factor
        self.persistent_workers = persistent_workers
        self.in_order = in_order
        self.snapshot_every_n_steps = snapshot_every_n_steps
        self._loader: InnerLoader | None = None
        self._start = EpochStart()  # where the sampler's next pass begins (its graphs share it)
        # Whether the dataset's own state outlives an epoch (persistent workers, or the
        # main process): then a state between epochs keeps where the last one ended.
        self._carries = keeps_state(dataset) and (num_workers == 0 or persistent_workers)
        self._base_seed: int | None = None
        self._resumed = False  # load_state_dict() loaded an epoch in progress: the next iter() goes on
        self._end_to_replay = False  # load_state_dict() loaded where the last epoch ended: replay it first
        self._next_rng: str | None = None  # the global RNG the next epoch draws from, as loaded
        self._rng_at_save: str | None = None  # where that RNG stood at a loaded mid-epoch state
        self._loaded: dict[str, Any] | None = None  # the state load_state_dict() took, until the next iter()
        # The epoch state_dict() began before the first iter() (a dataset that keeps a state).
        self._begun: Iterator[Any] | None = None
        self._epoch_origin: dict[str, Any] | None = None  # what the sampler drew this epoch's order from
        self._items_before = 0  # batches of this epoch handed out before the loader now reading it
        # An IterableDataset's len() as last reported: each iter() after it warns past it.
        self._reported_length: int | None = None
        self._initialized = True
        self.check_worker_number_rationality()  # torch's warning for more workers than CPUs

    def __setattr__(self, name: str, value: Any) -> None:
        # torch's rule: what the batches are made of is fixed once the loader is built.
        if name in _FIXED_AFTER_INIT and self.__dict__.get("_initialized", False):
            raise ValueError(f"{name} attribute should not be set after {type(self).__name__} is initialized")
        object.__setattr__(self, name, value)

    # --- iterating ---------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # conveyor's epoch, not torch's iterator class
        loaded, self._loaded = self._loaded, None
        if self._begun is not None:  # state_dict() began this epoch: iter() reads it
            begun, self._begun = self._begun, None
            return begun
        if self._resumed:  # load_state_dict() prepared the loader of the epoch in progress
            self._resumed = False
            assert self._loader is not None
            if self._rng_at_save is None or self._rng_at_save != global_rng_digest():
                self._redraw_epoch_start()  # unless the caller set the RNG back to the checkpoint's
            inner = loaded["epoch"] if loaded is not None else None
            handed_out = inner["items"] if inner is not None else 0
            return ResumedEpoch(self._epoch_batches(iter(self._loader), handed_out), self._fresh_epoch)
        return self._fresh_epoch()

    def _epoch_batches(self, batches: Iterator[Any], handed_out: int = 0) -> EpochBatches:
        """The epoch's batches as torch hands them out: a batch's error raised from its
        ``next()``, torch's warning past an ``IterableDataset``'s reported length."""
        args = self._args
        return EpochBatches(batches, args.dataset, self._reported_length, handed_out, args.num_workers > 0)

    def _redraw_epoch_start(self) -> None:
        redraw_epoch_start(self.generator, None if self._args.iterable else self._args.index_source)

    def _fresh_epoch(self) -> Iterator[Any]:
        """Begin the next epoch: its seeds drawn, its loader (new, or the persistent one) seeded."""
        if self._end_to_replay:
            self._replay_end()
        self._base_seed, start = self._draw_epoch()
        self._items_before = 0
        loader = self._loader if self.persistent_workers and self._loader is not None else None
        if loader is None:
            loader = self._new_loader(self._base_seed)
        self._start.set(start)
        loader.seed(self._base_seed)
        return self._epoch_batches(iter(loader))

    def _draw_epoch(self) -> tuple[int, dict[str, Any] | None]:
        """The epoch's base seed, drawn as torch draws it (from ``generator`` or the global
        RNG) before the sampler draws its order, and where the sampler begins. After a
        state saved between epochs, what came from the global RNG then comes from it."""
        rng, self._next_rng = self._next_rng, None
        borrowed = borrowed_rng(rng)
        base_seed = draw_base_seed(self.generator if self.generator is not None else borrowed)
        if self._args.iterable:
            self._epoch_origin = None
            return base_seed, None
        index_source = self._args.index_source
        if borrowed is not None and sampler_generator(index_source) is None:
            origin = encode_rng(borrowed.get_state())
            self._epoch_origin = {"rng": origin}
            return base_seed, {"rng": origin, "yielded": 0}
        self._epoch_origin = epoch_origin(index_source)
        return base_seed, None

    def _replay_end(self) -> None:
        """Read the loaded end of the last epoch: nothing is left to read, but each copy of
        the dataset loads the state it ended with, as the uninterrupted loader's held it."""
        self._end_to_replay = False
        assert self._loader is not None
        leftover = next(iter(self._loader), _NOTHING)
        if leftover is not _NOTHING:
            raise StateError(
                "DataLoader state: 'end' should be where an epoch ended, but the epoch it names still has "
                "batches to read; save the state between epochs, or as it stands mid-epoch"
            )

    def _new_loader(self, base_seed: int) -> InnerLoader:
        if self._loader is not None:
            self._loader.shutdown()
        args = self._args
        service: Any
        if args.num_workers == 0:
            service = InProcessReadingService()
        else:
            service = MultiProcessingReadingService(
                args.num_workers,
                multiprocessing_context=start_method(self.multiprocessing_context),
                worker_prefetch_cnt=max(1, args.prefetch_factor or 0),
                worker_init_fn=TorchWorkerStart(args.dataset, base_seed, self.worker_init_fn),
                in_order=self.in_order,
                timeout=args.timeout or None,
            )
        # This loader begins each epoch itself (ResumedEpoch): the inner one does not roll over.
        self._loader = InnerLoader(self._graph(), reading_service=service, keep_end_state=self._carries)
        return self._loader

    def _graph(self) -> IterDataPipe:
        graph = self._batches()
        if self.pin_memory:  # in the main process, as torch's pin-memory thread (no accelerator: as is)
            torch = require_torch("conveyor.DataLoader")
            if not torch.cuda.is_available():
                warnings.warn(
                    "'pin_memory' argument is set as true but no accelerator is found, "
                    "then device pinned memory won't be used.",
                    UserWarning,
                    stacklevel=4,
                )
            graph = graph.pin_memory(self.pin_memory_device or None)
        return graph

    def _batches(self) -> IterDataPipe:
        args = self._args
        if args.iterable:
            # torchdata's snapshot_every_n_steps counts batches: in items of the dataset here.
            every = (self.snapshot_every_n_steps or 1) * (args.batch_size or 1)
            source = TorchIterableDataset(args.dataset, share_dataset=True, snapshot_every=every, errors_in_place=True)
            source._splits_itself = True  # each worker iterates the dataset, as under torch
            return IterableBatches(source, args.batch_size, args.drop_last, worker_collate(args.collate_fn))
        keys: IterDataPipe = SamplerSource(args.index_source, self._start)
        if args.num_workers > 0:
            keys = keys.sharding_round_robin_dispatch()
        fetch = Fetch(args.dataset, worker_collate(args.collate_fn), args.auto_collation)
        return Fetcher(keys, fetch, errors_in_place=True)  # a batch's error raised in its place

    def __len__(self) -> int:
        """Batches per epoch, as torch counts them. An epoch resumed on another world size
        (:mod:`conveyor.torch_compat.elastic`) counts the batches each old rank handed out
        before the checkpoint (trainers restore that many steps) and this rank's share of
        what was left, and is never reported shorter than any other epoch, so that a
        trainer that reads ``len()`` once cuts neither it nor a later epoch short."""
        args = self._args
        if not args.iterable:
            length = len(args.index_source)
            origin, inner = self._epoch_origin, self._loader
            resumed = self._loaded is not None or (inner is not None and inner.in_progress)
            if origin is not None and "keys" in origin and resumed:  # while the elastic epoch lasts
                return max(length, origin.get("before", 0) + len(origin["keys"]))
            return length
        length = len(args.dataset)  # a TypeError when the dataset has no length, as torch
        # The next iter() warns when its batches outnumber it: the dataset's length, not
        # the batches', as torch's does.
        self._reported_length = length
        if args.batch_size is not None:
            length = batch_count(length, args.batch_size, args.drop_last)
        return length

    def shutdown(self) -> None:
        """Stop the workers now. They also stop when the loader and its iterators are all
        dropped (an iterator keeps the loader it reads alive, as torch's does)."""
        if self._loader is not None:
            self._loader.shutdown()
            self._loader = None


_NOTHING = object()
_FIXED_AFTER_INIT = frozenset({"batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers"})
