"""``conveyor.DataLoader``'s checkpoint: the state it saves (``state_dict()``) and the
state it loads (``load_state_dict()``), one rank's part or every rank's.

A mixin of :class:`~conveyor.torch_compat.dataloader.DataLoader` (kept apart so that the
loader's module holds its epochs): it reads the loader's attributes, declared below, and
asks it for a new inner loader when a state is loaded (:meth:`_new_loader`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

from conveyor.core.plain_state import keeps_state
from conveyor.core.random import global_rng_digest
from conveyor.distributed import rank_parts
from conveyor.errors import StateError
from conveyor.loader.inner import InnerLoader
from conveyor.pipes.torch.sampler_source import EpochStart, decode_rng, encode_rng, sampler_generator
from conveyor.torch_compat.arguments import LoaderArguments
from conveyor.torch_compat.elastic import distributed_record, merge_for_rank
from conveyor.torch_compat.state import (
    STATE_FORMAT,
    STATE_VERSION,
    check_state,
    draws_from_global_rng,
    global_rng_text,
)


class DataLoaderCheckpoint:
    """``state_dict()`` and ``load_state_dict()`` of a ``conveyor.DataLoader``."""

    # What it reads and sets of the loader (see DataLoader.__init__).
    num_workers: int
    generator: Any
    timeout: float
    _args: LoaderArguments
    _loader: InnerLoader | None
    _start: EpochStart
    _carries: bool
    _base_seed: int | None
    _resumed: bool
    _end_to_replay: bool
    _next_rng: str | None
    _rng_at_save: str | None
    _loaded: dict[str, Any] | None
    _begun: Iterator[Any] | None
    _epoch_origin: dict[str, Any] | None
    _items_before: int
    _new_loader: Callable[[int], InnerLoader]
    # ... and the loader's own methods.
    __iter__: Callable[[], Iterator[Any]]
    __len__: Callable[[], int]

    def state_dict(self) -> dict[str, Any]:
        """Where this loader is, as plain JSON-safe data (see
        :mod:`conveyor.torch_compat.state`): the epoch in progress, or where the last one
        ended; the generators as they stand now. Before the first ``iter()`` nothing
        starts: the state holds what the first epoch will draw from (the generators, or
        torch's global RNG), so a loader resumed from it reads the epoch this one's next
        ``iter()`` would, and building a template state (as ``torch.distributed.checkpoint``
        does) costs no workers. A dataset that keeps a state of its own across epochs
        (``state_dict``/``load_state_dict``, read in the main process or by persistent
        workers) is the exception: the first epoch begins then, as torchdata's does, so the
        state holds the dataset's as that epoch begins.

        In a ``torch.distributed`` job (one rank included), every rank's call gathers every
        rank's part (see :mod:`conveyor.distributed.rank_parts`), so the one copy a trainer keeps
        (Lightning and Accelerate save rank 0's) resumes every rank exactly; call it on
        every rank at the same step. The wait is bounded by ``timeout`` (else
        :data:`~conveyor.distributed.rank_parts.DEFAULT_TIMEOUT_S`)."""
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
        generator, own = self.generator, self._sampler_generator()
        from_global_rng = draws_from_global_rng(generator, sampler, own)
        if loader is not None and loader.in_progress:
            epoch = self._epoch_record(loader.local_state())
            rng_at_save = global_rng_digest() if from_global_rng else None
        else:
            if loader is not None and self._carries and loader.end_state is not None:
                end = self._epoch_record(loader.end_state)
            if from_global_rng:
                rng = global_rng_text()
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
        if state["sampler"] is not None and "before" in state["sampler"]:  # an epoch merged on another world size
            rank_parts.warn_if_longer("DataLoader", len(self), len(self._args.index_source))

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

    def _merge_ranks(self, parts: list[dict[str, Any]]) -> dict[str, Any]:
        """This rank's state from every rank's part saved on another world size."""
        place = rank_parts.world()
        rank, world_size = place if place is not None else (0, 1)
        merged = merge_for_rank([check_state(part) for part in parts], rank, world_size)
        # A generator the loader no longer has is not restored: on another world size the
        # sampler may lack the one it had (Accelerate gives one to several processes
        # only), and the epochs after this one are the new job's own.
        if self.generator is None:
            merged["generator"] = None
        if self._sampler_generator() is None:
            merged["sampler_generator"] = None
        return merged

    def _sampler_generator(self) -> Any:
        args = self._args
        return None if args.iterable else sampler_generator(args.index_source)


def _origin_of(sampler: dict[str, Any] | None) -> dict[str, Any] | None:
    if sampler is None:
        return None
    before = {"before": sampler["before"]} if "before" in sampler else {}
    return {"rng": sampler["rng"], **_keys_of(sampler), **before}


def _keys_of(sampler: dict[str, Any]) -> dict[str, Any]:
    """An elastic epoch's explicit keys (:mod:`conveyor.torch_compat.elastic`), if any."""
    return {"keys": sampler["keys"]} if "keys" in sampler else {}
