"""The loader's own state: the checks a state passes before ``DataLoader2.load_state_dict``
accepts it (its fields first, :mod:`conveyor.core.loader_schema`; then its graph's and its
services' parts; nothing from the state is run). See docs/DESIGN.md, "State"."""

from __future__ import annotations

import copy
from typing import Any

from conveyor.core.base import IterDataPipe
from conveyor.core.earlier_fingerprints import fingerprint_before_layers
from conveyor.core.loader_schema import STATE_FORMAT, STATE_VERSION, check_loader_fields
from conveyor.core.passes import State
from conveyor.errors import StateError
from conveyor.reading_service.interface import CheckpointableReadingServiceInterface, ReadingServiceInterface

__all__ = ["STATE_FORMAT", "STATE_VERSION", "check_loader_state"]


def check_loader_state(
    state: Any, fingerprint: str, service: ReadingServiceInterface, graph: IterDataPipe
) -> tuple[dict[str, Any], State | None, bool]:
    """``(a copy of the state, its pipeline state adapted to the services, whether it
    could be adapted and checked now)`` for a loader of ``graph`` (whose fingerprint is
    ``fingerprint``) reading through ``service``; raises :class:`StateError` for a bad
    state. Runs no code from the state."""
    where = "DataLoader2 state"
    state = check_loader_fields(state, where)
    if state["fingerprint"] != fingerprint and state["fingerprint"] != fingerprint_before_layers(graph):
        raise StateError(
            f"{where}: it was saved from another pipeline (graph fingerprint "
            f"{state['fingerprint'][:40]!r}, this loader's is {fingerprint})"
        )
    checked = copy.deepcopy(dict(state))
    if not checked["in_progress"]:
        return checked, None, True
    if not isinstance(service, CheckpointableReadingServiceInterface):
        return checked, _uncheckpointed_pipeline(checked, service, where), True
    if checked["reading_service"] is None:
        raise StateError(
            f"{where}: it was saved mid-epoch without a reading service's state (through a service that is "
            f"not checkpointable); {type(service).__name__} needs its own to resume"
        )
    service.validate_checkpoint(graph, checked["reading_service"])
    final = service.preview(graph)
    if final is None:
        return checked, None, False  # adapted and checked once the services built the graph
    pipeline = service.adapt_pipeline_state(
        final, copy.deepcopy(checked["pipeline"]), checked["position"], checked["reading_service"]
    )
    if pipeline is not None:
        if not isinstance(final, IterDataPipe):
            raise StateError(f"{where}: {type(service).__name__} reads no conveyor pipe, so no pipeline state")
        final.check_state(pipeline, f"{where}.pipeline")
    return checked, pipeline, True


def _uncheckpointed_pipeline(checked: dict[str, Any], service: ReadingServiceInterface, where: str) -> State:
    """A mid-epoch state for a service that is not checkpointable: its pipeline state,
    which the pass checks against the graph the service hands back when it opens."""
    name = type(service).__name__
    if checked["reading_service"] is not None:
        raise StateError(f"{where}: it holds a reading service's state, and {name} is not checkpointable")
    if checked["pipeline"] is None:
        raise StateError(
            f"{where}: it was saved mid-epoch through a service that reads something other than a conveyor "
            "pipe, so where it stood is unknown and resuming could repeat or skip items; save between epochs"
        )
    return checked["pipeline"]
