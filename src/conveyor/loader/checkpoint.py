"""``DataLoader2``'s checkpoint: the state it saves (``state_dict()``) and the state it
loads (``load_state_dict()``), one rank's part or every rank's.

A mixin of :class:`~conveyor.loader.dataloader2.DataLoader2` (kept apart so that the loader's
module holds its lifecycle and epochs): it reads the loader's attributes, declared below,
and asks it to restart its service when a state is loaded into a used loader.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from conveyor.core.base import DataPipe, IterDataPipe
from conveyor.core.loader_schema import READING_SERVICE_STATE_KEY_NAME, SERIALIZED_DATAPIPE_KEY_NAME
from conveyor.core.passes import State
from conveyor.core.random import SeedGenerator, global_rng_digest
from conveyor.distributed import rank_parts
from conveyor.loader.epoch import Epoch
from conveyor.loader.intake import replays
from conveyor.loader.state import STATE_FORMAT, STATE_VERSION, check_loader_state
from conveyor.reading_service.distributed import DistributedReadingService
from conveyor.reading_service.interface import (
    CheckpointableReadingServiceInterface,
    ReadingServiceInterface,
)
from conveyor.reading_service.sequential import SequentialReadingService


class LoaderCheckpoint:
    """``state_dict()`` and ``load_state_dict()`` of a ``DataLoader2``."""

    # What it reads and sets of the loader (see DataLoader2.__init__).
    reading_service: ReadingServiceInterface
    datapipe: DataPipe | None
    _graph: IterDataPipe
    _fingerprint: str
    _seeds: SeedGenerator
    _seeded: bool
    _next_epoch: int
    _epoch: int | None
    _current: Epoch | None
    _pending: dict[str, Any] | None
    _pending_pipeline: State | None
    _pending_adapted: bool
    _resumed_length: int | None
    _loaded_epoch_length: Callable[[], int | None]
    _initialized: bool
    _shut_down: bool
    _final_state: dict[str, Any] | None
    _restart_service: Callable[[], None]

    def state_dict(self) -> dict[str, Any]:
        """Where the loader is, as plain data (JSON-safe): before the first epoch, mid-epoch
        (right after the last item handed out), between epochs, or where it stood when it
        was shut down.

        In a ``torch.distributed`` job (one rank included), every rank's call gathers
        every rank's part, so the state any one rank returns resumes every rank (see
        :mod:`conveyor.distributed.rank_parts`): call it on every rank at the same step, as trainers
        do. Never slower than the wait for the other ranks (the
        ``DistributedReadingService``'s ``timeout``, else
        :data:`~conveyor.distributed.rank_parts.DEFAULT_TIMEOUT_S`); a rank that calls it alone gets
        its own part back, with a warning."""
        service = self._distributed_service()
        return rank_parts.gather(self._local_state(), "DataLoader2", service.timeout if service else None)

    def _distributed_service(self) -> DistributedReadingService | None:
        """The ``DistributedReadingService`` this loader reads through, alone or in sequence."""
        service = self.reading_service
        services = service.reading_services if isinstance(service, SequentialReadingService) else [service]
        return next((each for each in services if isinstance(each, DistributedReadingService)), None)

    def _local_state(self) -> dict[str, Any]:
        """This process's state (:meth:`state_dict` without the other ranks' parts)."""
        if self._final_state is not None:
            return copy.deepcopy(self._final_state)
        if self._pending is not None:
            return copy.deepcopy(self._pending)
        in_progress = self._epoch is not None
        current = self._current if in_progress else None
        opened = current.opened if current is not None else None
        service_state = pipeline = position = None
        checkpointable = isinstance(self.reading_service, CheckpointableReadingServiceInterface)
        if in_progress and checkpointable:
            service_state = self.reading_service.checkpoint()  # type: ignore[attr-defined]
            if opened is None:
                raise TypeError(
                    f"{type(self.reading_service).__name__} reads the graph through something other than a "
                    "conveyor pipe, so a mid-epoch state cannot be saved; save between epochs"
                )
        # A service that is not checkpointable has no part (None), as in torchdata; the
        # loader's own part is still exact when the service iterates a conveyor pipe here
        # whose sources replay (a state without it is refused at load).
        if opened is not None and (checkpointable or replays(self.datapipe)):
            pipeline = opened.state()
            last = opened.position()
            position = list(last) if last is not None else None
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "fingerprint": self._fingerprint,
            "seed": self._seeds.base_seed,
            "seeded": self._seeded,
            "epoch": self._epoch if in_progress else self._next_epoch,
            "in_progress": in_progress,
            "items": current.handed_out if current is not None else 0,
            SERIALIZED_DATAPIPE_KEY_NAME: pipeline,
            "position": position,
            READING_SERVICE_STATE_KEY_NAME: service_state,
            "skipped": copy.deepcopy(current.ledger.records)
            if current is not None and current.ledger is not None
            else [],
            "rng_at_save": global_rng_digest() if in_progress and not self._seeded else None,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Validate ``state`` at once and make the next ``iter()`` resume from it.

        Raises :class:`~conveyor.errors.StateError` (a ``ValueError``) for anything that is
        not a state of this pipeline, or that holds no part for this rank. Loading never
        unpickles or evaluates anything.
        """
        if self._shut_down:
            raise RuntimeError("this DataLoader2 was shut down; create a new one to load a state")
        # A state holding every rank's part: this rank's, or one merged from all of them on
        # another world size (elastic resume, through a DistributedReadingService).
        merge = DistributedReadingService.merge_rank_states if self._distributed_service() else None
        state = rank_parts.own_part(state, "DataLoader2", merge)
        checked, pipeline, adapted = self._check_state(state)
        if self._initialized:
            self._restart_service()
        self._pending, self._pending_pipeline, self._pending_adapted = checked, pipeline, adapted
        self._resumed_length = None
        if checked["in_progress"]:
            self._warn_if_longer()
        self._seeds.seed(checked["seed"])
        self._seeded = checked["seeded"]
        self._next_epoch = checked["epoch"]

    def _warn_if_longer(self) -> None:
        """An epoch resumed on another world size may take more steps than a fresh one:
        say so now, while the trainer can still be told (:func:`rank_parts.warn_if_longer`)."""
        resumed = self._loaded_epoch_length()
        if resumed is None:
            return
        try:
            usual = self.reading_service.epoch_length(self._graph)
        except TypeError:  # no length to compare with: nothing a trainer could have fixed
            return
        rank_parts.warn_if_longer("DataLoader2", resumed, usual)

    def _check_state(self, state: Any) -> tuple[dict[str, Any], State | None, bool]:
        """``(a copy of the state, its pipeline state adapted to the services, whether it
        could be adapted and checked now)``; raises :class:`StateError` for a bad state."""
        return check_loader_state(state, self._fingerprint, self.reading_service, self._graph)

    def _checkpointable(self, action: str) -> CheckpointableReadingServiceInterface:
        service = self.reading_service
        if not isinstance(service, CheckpointableReadingServiceInterface):
            raise TypeError(
                f"{type(service).__name__} cannot {action}: it does not implement CheckpointableReadingServiceInterface"
            )
        return service
