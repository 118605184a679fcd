"""``conveyor.DataLoader``: torch's ``DataLoader`` (and torchdata's ``StatefulDataLoader``)
on conveyor's engine.

A map-style dataset is read as torch reads it: the main process iterates the (batch)
sampler and hands each batch of keys round-robin to the workers, which fetch and
collate it; batches come out in the sampler's order. Here the sampler is a resumable
source (:class:`~conveyor.pipes.sampler_source.SamplerSource`) read by the
multiprocessing service's dispatcher, so a ``state_dict()`` at any step resumes exactly,
with any number of workers. An ``IterableDataset`` is iterated by every worker, with
torch's ``get_worker_info()`` set there, as torch does.

Seeds follow torch: each ``iter()`` draws a base seed from ``generator`` (torch's global
RNG without one) before the sampler draws its order; worker ``i`` seeds torch, ``random``
and numpy from ``base_seed + i`` when it starts. Without ``persistent_workers`` the
workers start again every epoch, as torch's do.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from conveyor import rank_parts
from conveyor.accelerate_support import AccelerateParticipant
from conveyor.dataloader2 import DataLoader2
from conveyor.dataloader_elastic import distributed_record, merge_for_rank
from conveyor.dataloader_state import (
    STATE_FORMAT,
    STATE_VERSION,
    borrowed_rng,
    check_state,
    draw_base_seed,
    draws_from_global_rng,
    global_rng_text,
    redraw_epoch_start,
)
from conveyor.errors import StateError
from conveyor.loader_arguments import LoaderArguments, resolve, start_method
from conveyor.pipes.base import IterDataPipe, check_int
from conveyor.pipes.fetching import Fetch, Fetcher
from conveyor.pipes.sampler_source import (
    EpochStart,
    SamplerSource,
    decode_rng,
    encode_rng,
    epoch_origin,
    sampler_generator,
)
from conveyor.pipes.torch_sources import TorchIterableDataset
from conveyor.plain_state import keeps_state
from conveyor.random import global_rng_digest
from conveyor.reading_service import InProcessReadingService, MultiProcessingReadingService
from conveyor.resumed_epoch import ResumedEpoch
from conveyor.torch_support import require_torch
from conveyor.torch_workers import TorchWorkerStart, worker_collate

T_co = TypeVar("T_co", covariant=True)

if TYPE_CHECKING:  # what DataLoader derives from, for type checkers
    import torch as _torch
else:
    _torch = require_torch("conveyor.DataLoader")


class DataLoader(AccelerateParticipant, _torch.utils.data.DataLoader[T_co]):
    """torch's ``DataLoader`` with torchdata's ``StatefulDataLoader`` checkpoints: the same
    arguments, checks, batches and worker conventions, on conveyor's engine.

    It is a subclass of ``torch.utils.data.DataLoader`` (none of whose machinery it runs),
    so that what trainers do to torch's loaders they do to this one: Lightning injects its
    ``DistributedSampler`` and re-creates the loader with it (a ``conveyor.DataLoader``
    again), and under plain DDP a ``DistributedSampler`` passed in shards it as it shards
    torch's. Accelerate's ``prepare()`` keeps it as it is (see
    :class:`~conveyor.accelerate_support.AccelerateParticipant`) and shards it by process,
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
        self._loader: DataLoader2 | None = None
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

    # --- iterating ---------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # conveyor's epoch, not torch's iterator class
        self._loaded = None
        if self._begun is not None:  # state_dict() began this epoch: iter() reads it
            begun, self._begun = self._begun, None
            return begun
        if self._resumed:  # load_state_dict() prepared the loader of the epoch in progress
            self._resumed = False
            assert self._loader is not None
            if self._rng_at_save is None or self._rng_at_save != global_rng_digest():
                self._redraw_epoch_start()  # unless the caller set the RNG back to the checkpoint's
            return ResumedEpoch(iter(self._loader), self._fresh_epoch)
        return self._fresh_epoch()

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
        return iter(loader)

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

    def _new_loader(self, base_seed: int) -> DataLoader2:
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
        self._loader = DataLoader2(self._graph(), reading_service=service)
        self._loader._keep_end_state = self._carries
        self._loader._rolls_over = False  # this loader begins each epoch itself (ResumedEpoch)
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
            source = TorchIterableDataset(args.dataset, share_dataset=True, snapshot_every=every)
            source._splits_itself = True  # each worker iterates the dataset, as under torch
            if args.batch_size is None:
                return source.map(worker_collate(args.collate_fn))
            return source.batch(args.batch_size, drop_last=args.drop_last).map(worker_collate(args.collate_fn))
        keys: IterDataPipe = SamplerSource(args.index_source, self._start)
        if args.num_workers > 0:
            keys = keys.sharding_round_robin_dispatch()
        return Fetcher(keys, Fetch(args.dataset, worker_collate(args.collate_fn), args.auto_collation))

    def __len__(self) -> int:
        args = self._args
        if not args.iterable:
            return len(args.index_source)
        length = len(args.dataset)  # a TypeError when the dataset has no length, as torch
        if args.batch_size is not None:
            length = length // args.batch_size if args.drop_last else -(-length // args.batch_size)
        return length

    # --- checkpoints ---------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where this loader is, as plain JSON-safe data (see
        :mod:`conveyor.dataloader_state`): the epoch in progress, or where the last one
        ended; the generators as they stand now. Before the first ``iter()`` nothing
        starts: the state holds what the first epoch will draw from (the generators, or
        torch's global RNG), so a loader resumed from it reads the epoch this one's next
        ``iter()`` would, and building a template state (as ``torch.distributed.checkpoint``
        does) costs no workers. A dataset that keeps a state of its own across epochs
        (``state_dict``/``load_state_dict``, read in the main process or by persistent
        workers) is the exception: the first epoch begins then, as torchdata's does, so the
        state holds the dataset's as that epoch begins.

        In a ``torch.distributed`` job (one rank included), every rank's call gathers every
        rank's part (see :mod:`conveyor.rank_parts`), so the one copy a trainer keeps
        (Lightning and Accelerate save rank 0's) resumes every rank exactly; call it on
        every rank at the same step. The wait is bounded by ``timeout`` (else
        :data:`~conveyor.rank_parts.DEFAULT_TIMEOUT_S`)."""
        return rank_parts.gather(self._local_state(), "DataLoader", self.timeout or None)

    def _local_state(self) -> dict[str, Any]:
        """This process's state (:meth:`state_dict` without the other ranks' parts)."""
        if self._loaded is not None:  # as loaded, until the next iter()
            return copy.deepcopy(self._loaded)
        if self._loader is None and self._carries:
            # The dataset keeps a state of its own across epochs: the first epoch begins
            # now, as torchdata's does, so the state holds the dataset's as it begins.
            self._begun = self.__iter__()
        loader = self._loader
        epoch = end = rng = rng_at_save = None
        sampler = None if self._args.iterable else self._args.index_source
        from_global_rng = draws_from_global_rng(self.generator, sampler)
        if loader is not None and loader._epoch is not None:
            epoch = self._epoch_record(loader._local_state())
            rng_at_save = global_rng_digest() if from_global_rng else None
        else:
            if loader is not None and self._carries and loader._end_state is not None:
                end = self._epoch_record(loader._end_state)
            if from_global_rng:
                rng = global_rng_text()
        generator, own = self.generator, self._sampler_generator()
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "num_workers": self.num_workers,
            "epoch": epoch["epoch"] if epoch is not None else None,
            "sampler": epoch["sampler"] if epoch is not None else None,
            "base_seed": self._base_seed,
            "end": end,
            "generator": encode_rng(generator.get_state()) if generator is not None else None,
            "sampler_generator": encode_rng(own.get_state()) if own is not None and own is not generator else None,
            "rng": rng,
            "rng_at_save": rng_at_save,
        }

    def _epoch_record(self, inner: dict[str, Any]) -> dict[str, Any]:
        """An epoch's part of the state, from the inner loader's: with where its keys stand
        whatever the worker count."""
        sampler = None
        if self._epoch_origin is not None:
            sampler = {**self._epoch_origin, "yielded": self._items_before + inner["items"]}
            record = None if "keys" in sampler else distributed_record(self._args.index_source)
            if record is not None:  # what an elastic resume rebuilds this rank's batches from
                sampler["distributed"] = record
        assert self._base_seed is not None
        return {"epoch": inner, "sampler": sampler, "base_seed": self._base_seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`'s data at the next ``iter()``. A state that cannot
        be honoured is a :class:`StateError` now, before anything runs; so is a state
        holding other ranks' parts and none for this rank, or saved on another world size."""
        state = check_state(rank_parts.own_part(state, "DataLoader", self._merge_ranks))
        self._restore_generator(self.generator, state["generator"], "generator")
        own = self._sampler_generator()
        self._restore_generator(
            own if own is not self.generator else None, state["sampler_generator"], "sampler's generator"
        )
        self._begun = None
        self._resumed = self._end_to_replay = False
        if state["epoch"] is not None or state["sampler"] is not None:  # mid-epoch, or an elastic epoch's keys
            self._resume_epoch(state)
            self._resumed = True
        elif state["end"] is not None and self._carries:
            self._resume_epoch({**state["end"], "num_workers": state["num_workers"]})
            self._end_to_replay = True
        self._next_rng = state["rng"]
        self._rng_at_save = state["rng_at_save"]
        self._base_seed = state["base_seed"]
        self._loaded = copy.deepcopy(state)

    @staticmethod
    def _restore_generator(generator: Any, saved: str | None, what: str) -> None:
        if saved is None:
            return
        if generator is None:
            raise StateError(f"DataLoader state: it holds the {what}'s state, but this loader has no such generator")
        try:
            generator.set_state(decode_rng(saved))
        except RuntimeError as error:
            raise StateError(f"DataLoader state: the {what}'s state does not fit it ({error})") from None

    def _resume_epoch(self, state: dict[str, Any]) -> None:
        """The loader of an epoch, from its part of a state: loaded whole with the same
        worker count (batches in flight included); on another count (map-style only), a
        loader whose sampler starts after the batches handed out."""
        base_seed, sampler = state["base_seed"], state["sampler"]
        if state["num_workers"] != self.num_workers and keeps_state(self._args.dataset):
            raise StateError(
                f"DataLoader state: saved with num_workers={state['num_workers']}, now {self.num_workers}; "
                f"the dataset ({type(self._args.dataset).__name__}) keeps a state of its own in each worker, "
                f"so resume it with num_workers={state['num_workers']}"
            )
        loader = self._new_loader(base_seed)
        if state["epoch"] is not None and (state["num_workers"] == self.num_workers or sampler is None):
            # A worker that had handed nothing out reads the keys from the epoch's start:
            # the sampler must draw the epoch's order again, not a new one.
            start = {"rng": sampler["rng"], "yielded": 0, **_keys_of(sampler)} if sampler is not None else None
            self._start.set(start)
            loader.load_state_dict(state["epoch"])
            self._items_before = sampler["yielded"] - state["epoch"]["items"] if sampler is not None else 0
        else:
            self._start.set({"rng": sampler["rng"], "yielded": sampler["yielded"], **_keys_of(sampler)})
            loader.seed(base_seed)
            self._items_before = sampler["yielded"]
        self._epoch_origin = _origin_of(sampler)
        self._base_seed = base_seed

    @staticmethod
    def _merge_ranks(parts: list[dict[str, Any]]) -> dict[str, Any]:
        """This rank's state from every rank's part saved on another world size."""
        place = rank_parts.world()
        rank, world_size = place if place is not None else (0, 1)
        return merge_for_rank([check_state(part) for part in parts], rank, world_size)

    def _sampler_generator(self) -> Any:
        args = self._args
        return None if args.iterable else sampler_generator(args.index_source)

    def shutdown(self) -> None:
        """Stop the workers now. They also stop when the loader and its iterators are all
        dropped (an iterator keeps the loader it reads alive, as torch's does)."""
        if self._loader is not None:
            self._loader.shutdown()
            self._loader = None


_NOTHING = object()


def _origin_of(sampler: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if sampler is None else {"rng": sampler["rng"], **_keys_of(sampler)}


def _keys_of(sampler: dict[str, Any]) -> dict[str, Any]:
    """An elastic epoch's explicit keys (:mod:`conveyor.dataloader_elastic`), if any."""
    return {"keys": sampler["keys"]} if "keys" in sampler else {}
