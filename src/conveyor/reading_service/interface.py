"""The reading-service contract: how a ``DataLoader2`` runs a graph.

The lifecycle, called by the loader: ``initialize(graph)`` (or ``restore(graph, state)``)
once, at the first ``iter()``; ``initialize_iteration(seed_generator)`` at every
``iter()``; ``finalize_iteration()`` when an epoch ends; ``finalize()`` at ``shutdown()``.
A service must be picklable before ``initialize``: the loader works on its own copy.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from conveyor.core.base import DataPipe
from conveyor.core.passes import State
from conveyor.core.random import SeedGenerator
from conveyor.observe.stats import StageTotals

IterResetFn = Callable[[DataPipe], DataPipe]


class ReadingServiceInterface(ABC):
    """Adapts a graph for execution and owns whatever runs it (threads, processes, groups)."""

    @abstractmethod
    def initialize(self, datapipe: DataPipe) -> DataPipe:
        """Adapt the user's graph (sharding, workers, prefetch) and return the graph to read."""

    def finalize(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release everything the service holds. Called by ``shutdown()``; idempotent."""

    def initialize_iteration(
        self, seed_generator: SeedGenerator, iter_reset_fn: IterResetFn | None = None
    ) -> IterResetFn | None:
        """Prepare an epoch: apply its seeds. May return a function the loader applies to
        the graph (services composed in sequence pass it along)."""
        return iter_reset_fn

    def finalize_iteration(self) -> None:  # noqa: B027 - optional hook
        """An epoch ended (its iterator is exhausted)."""

    def epoch_length(self, datapipe: DataPipe) -> int:
        """Items an epoch of the user's graph ``datapipe`` yields in this process when this
        service runs it, worked out without side effects (nothing starts); ``TypeError``
        when it is not known in advance. ``len(DataLoader2)`` asks it once and keeps the
        answer, so trainers see one length before, during and after ``iter()``. The
        default: the graph's own length (a service that only moves work elsewhere yields
        the same items)."""
        return len(datapipe)

    def resumed_epoch_length(self, datapipe: DataPipe, state: Any) -> int | None:
        """Items the epoch a state resumes yields in this process, counting those it
        handed out before the checkpoint, when that differs from :meth:`epoch_length`
        (``state`` is this service's part of it): an epoch resumed on another world size.
        None by default: the epoch is as long as any other."""
        return None

    def precedes(self, successor: ReadingServiceInterface) -> None:  # noqa: B027 - optional hook
        """A :class:`SequentialReadingService` placed ``successor`` after this service: the
        successor runs (and checkpoints) the graph this one adapts. Called before
        ``initialize``/``restore``."""

    def set_stats_collection(self, enabled: bool | str) -> None:  # noqa: B027 - optional hook
        """How the loader collects statistics (``True``, ``False`` or ``"sample"``): a
        service running graph copies elsewhere collects theirs the same way. Called before
        ``initialize``/``restore``."""

    def worker_stage_totals(self) -> list[StageTotals] | None:
        """Per-stage numbers of the graph copies this service runs elsewhere (worker
        processes), summed over them; ``None`` when it runs none. For ``DataLoader2.stats``."""
        return None

    def epoch_read(self, items: int) -> None:  # noqa: B027 - optional hook
        """A whole epoch of ``items`` items was read since ``initialize_iteration`` (for a
        service that tunes itself between epochs)."""

    def tuning(self) -> dict[str, Any] | None:
        """What the service chose for itself and why (``"auto"`` settings), as plain data;
        None when it chose nothing. For ``DataLoader2.stats``."""
        return None

    def worker_restarts(self) -> list[dict[str, Any]]:
        """The dead workers this service replaced so far (``max_worker_restarts``), as
        plain records: ``worker_id``, ``death``, ``at``, ``restart``. For ``DataLoader2.stats``."""
        return []

    def pause_iteration(self) -> None:  # noqa: B027 - optional hook
        """The loader's iterator reached its ``limit()``: stop reading ahead if you can."""

    def resume_iteration(self) -> None:  # noqa: B027 - optional hook
        """The loader's iterator was resumed after a pause."""


class CheckpointableReadingServiceInterface(ReadingServiceInterface):
    """A service that can save what it needs to resume an epoch exactly.

    The pipeline's own state (where each pass is) belongs to the loader, which saves it
    beside the service's part; the service saves how it ran the graph (its worker count,
    its rank), and may re-shape the pipeline state when it runs the graph differently now
    (:meth:`adapt_pipeline_state`). States are plain data (dicts, lists, ints, strings,
    bools: they survive JSON), never pickled bytes: loading a state must not run code.
    """

    @abstractmethod
    def checkpoint(self) -> Any:
        """What this service needs to resume the current epoch, as plain data."""

    @abstractmethod
    def restore(self, datapipe: DataPipe, state: Any) -> DataPipe:
        """Like ``initialize``, for a graph that resumes from ``state``."""

    def preview(self, datapipe: DataPipe) -> DataPipe | None:
        """The graph as ``initialize`` would return it, built without side effects (no
        processes, groups or sharding; ``datapipe`` is left as it is), so that a state can
        be checked before anything starts; None when it cannot be known beforehand (a hook
        that builds it). The default: the graph itself."""
        return datapipe

    def adapt_pipeline_state(
        self, datapipe: DataPipe, pipeline: State | None, position: list[int] | None, state: Any
    ) -> State | None:
        """The saved pipeline state as a pass over ``datapipe`` (what ``initialize`` or
        :meth:`preview` returned) must start from, given this service's saved ``state``;
        ``position`` is where the last item handed out stood. Raise
        :class:`~conveyor.errors.StateError` when it cannot be resumed this way. The
        default: unchanged."""
        return pipeline

    def validate_checkpoint(self, datapipe: DataPipe, state: Any) -> None:
        """Raise :class:`conveyor.errors.StateError` unless ``state`` suits ``datapipe``.

        Called by ``DataLoader2.load_state_dict`` so that a bad state fails at once; it must
        not change anything. ``restore`` validates too, so the default accepts all.
        """
