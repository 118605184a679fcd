"""``SequentialReadingService``: services composed in order, each adapting the graph for the next.

``SequentialReadingService(DistributedReadingService(), MultiProcessingReadingService(4))``
is the usual multi-rank, multi-worker set-up: the distributed service shards by rank and
shares rank 0's seed, then the multiprocessing service splits the rank's shard between
its workers. Set-up and checkpoints go in order; tear-down goes in reverse, so each
service is torn down before the one it was built on.
"""

from __future__ import annotations

import itertools
from typing import Any

from conveyor.core.base import DataPipe
from conveyor.core.passes import State
from conveyor.core.random import SeedGenerator
from conveyor.core.validation import require_keys
from conveyor.errors import StateError
from conveyor.observe.stats import StageTotals
from conveyor.reading_service.elastic import is_elastic
from conveyor.reading_service.interface import (
    CheckpointableReadingServiceInterface,
    IterResetFn,
    ReadingServiceInterface,
)


class SequentialReadingService(CheckpointableReadingServiceInterface):
    """Runs ``reading_services`` in sequence: ``initialize``, ``initialize_iteration``,
    ``checkpoint`` and ``restore`` in the given order, ``finalize_iteration`` and
    ``finalize`` in reverse. The last service runs the graph and checkpoints its state;
    checkpoints need every service to be checkpointable.

    Args:
        *reading_services: The services, in the order they initialise; the last one runs the graph.
    """

    def __init__(self, *reading_services: ReadingServiceInterface):
        if not reading_services:
            raise ValueError("SequentialReadingService needs at least one reading service")
        for index, service in enumerate(reading_services):
            if not isinstance(service, ReadingServiceInterface):
                raise TypeError(
                    f"SequentialReadingService argument {index} must be a reading service, got {type(service).__name__}"
                )
        if len({id(s) for s in reading_services}) != len(reading_services):
            raise ValueError("SequentialReadingService got the same reading service twice; pass distinct ones")
        self.reading_services = list(reading_services)

    # --- lifecycle -----------------------------------------------------------------------

    def initialize(self, datapipe: DataPipe) -> DataPipe:
        self._link()
        return self._set_up(datapipe, lambda service, graph, _: service.initialize(graph), [None] * len(self))

    def _set_up(self, datapipe: DataPipe, step: Any, parts: list[Any]) -> DataPipe:
        """Run ``step(service, graph, part)`` for each service in order; if one fails, the
        ones already set up are finalized (last first), so nothing they hold leaks."""
        done: list[ReadingServiceInterface] = []
        try:
            for service, part in zip(self.reading_services, parts, strict=True):
                datapipe = step(service, datapipe, part)
                done.append(service)
        except BaseException as error:
            for cleanup in _in_reverse(done, "finalize", raise_first=False):
                error.add_note(f"also, finalizing the services set up before: {type(cleanup).__name__}: {cleanup}")
            raise
        return datapipe

    def __len__(self) -> int:
        return len(self.reading_services)

    def epoch_length(self, datapipe: DataPipe) -> int:
        """The length the services agree on: a service that shards (across ranks) changes
        it, the others keep the graph's own."""
        lengths = [service.epoch_length(datapipe) for service in self.reading_services]
        plain = len(datapipe)
        return next((length for length in lengths if length != plain), plain)

    def resumed_epoch_length(self, datapipe: DataPipe, state: Any) -> int | None:
        """What the first service that knows says of the resumed epoch (each is asked with
        its own part of ``state``)."""
        services, parts = self._checked(state)
        lengths = (service.resumed_epoch_length(datapipe, part) for service, part in zip(services, parts, strict=True))
        return next((length for length in lengths if length is not None), None)

    def initialize_iteration(
        self, seed_generator: SeedGenerator, iter_reset_fn: IterResetFn | None = None
    ) -> IterResetFn | None:
        for service in self.reading_services:
            # One argument while no earlier service returned a function: a service written
            # with torchdata's one-argument form works here as under DataLoader2.
            if iter_reset_fn is None:
                iter_reset_fn = service.initialize_iteration(seed_generator)
            else:
                iter_reset_fn = service.initialize_iteration(seed_generator, iter_reset_fn)
        return iter_reset_fn

    def finalize_iteration(self) -> None:
        _in_reverse(self.reading_services, "finalize_iteration")

    def finalize(self) -> None:
        _in_reverse(self.reading_services, "finalize")

    def set_stats_collection(self, enabled: bool | str) -> None:
        for service in self.reading_services:
            service.set_stats_collection(enabled)

    def worker_stage_totals(self) -> list[StageTotals] | None:
        """The last service's: it runs the graph."""
        return self.reading_services[-1].worker_stage_totals()

    def epoch_read(self, items: int) -> None:
        for service in self.reading_services:
            service.epoch_read(items)

    def tuning(self) -> dict[str, Any] | None:
        """The last service's: it runs the graph."""
        return self.reading_services[-1].tuning()

    def worker_restarts(self) -> list[dict[str, Any]]:
        """The last service's: it runs the graph."""
        return self.reading_services[-1].worker_restarts()

    def pause_iteration(self) -> None:
        _in_reverse(self.reading_services, "pause_iteration")

    def resume_iteration(self) -> None:
        for service in self.reading_services:
            service.resume_iteration()

    # --- checkpoints ---------------------------------------------------------------------

    def checkpoint(self) -> dict[str, Any]:
        return {"services": [service.checkpoint() for service in self._checkpointables("save a state")]}

    def validate_checkpoint(self, datapipe: DataPipe, state: Any) -> None:
        """Checks every service's part against the graph it will receive: the user's for
        the first, the previous service's :meth:`preview` of it for the others (when that
        can be known)."""
        services, parts = self._checked(state)
        self._link()
        graph: DataPipe | None = datapipe
        for service, part in zip(services, parts, strict=True):
            service.validate_checkpoint(graph if graph is not None else datapipe, part)
            graph = service.preview(graph) if graph is not None else None

    def preview(self, datapipe: DataPipe) -> DataPipe | None:
        graph: DataPipe | None = datapipe
        for service in self._checkpointables("preview a graph"):
            if graph is None:
                return None
            graph = service.preview(graph)
        return graph

    def adapt_pipeline_state(
        self, datapipe: DataPipe, pipeline: State | None, position: list[int] | None, state: Any
    ) -> State | None:
        """Each service in order adapts the pipeline state for the graph it runs."""
        for service, part in zip(*self._checked(state), strict=True):
            pipeline = service.adapt_pipeline_state(datapipe, pipeline, position, part)
        return pipeline

    def restore(self, datapipe: DataPipe, state: Any) -> DataPipe:
        _, parts = self._checked(state)
        self._link()
        return self._set_up(datapipe, lambda service, graph, part: service.restore(graph, part), parts)

    def _checked(self, state: Any) -> tuple[list[CheckpointableReadingServiceInterface], list[Any]]:
        """The services and each one's part of ``state``. A state merged from several ranks
        (:mod:`conveyor.reading_service.elastic`) is one part that every service reads."""
        services = self._checkpointables("restore a state")
        if is_elastic(state):
            return services, [state] * len(services)
        require_keys(state, {"services": list}, "SequentialReadingService state")
        if len(state["services"]) != len(services):
            raise StateError(
                f"SequentialReadingService state: it holds {len(state['services'])} service states, this "
                f"composition has {len(services)} services; resume with the same reading services"
            )
        return services, state["services"]

    def _checkpointables(self, action: str) -> list[CheckpointableReadingServiceInterface]:
        for service in self.reading_services:
            if not isinstance(service, CheckpointableReadingServiceInterface):
                raise TypeError(
                    f"SequentialReadingService cannot {action}: {type(service).__name__} does not implement "
                    "CheckpointableReadingServiceInterface"
                )
        return self.reading_services  # type: ignore[return-value]

    def _link(self) -> None:
        for service, successor in itertools.pairwise(self.reading_services):
            service.precedes(successor)

    def __repr__(self) -> str:
        return f"SequentialReadingService({', '.join(type(s).__name__ for s in self.reading_services)})"


def _in_reverse(services: list[ReadingServiceInterface], hook: str, raise_first: bool = True) -> list[Exception]:
    """Call ``hook`` on every service, last first; all run even if one fails. The errors
    are raised at the end (the first, with the others attached as notes) or, when the
    caller is already handling an error, returned for it to report."""
    errors: list[Exception] = []
    for service in reversed(services):
        try:
            getattr(service, hook)()
        except Exception as error:  # collected: the others must still run
            errors.append(error)
    if errors and raise_first:
        first = errors[0]
        for other in errors[1:]:
            first.add_note(f"also, during {hook}: {type(other).__name__}: {other}")
        raise first
    return errors
