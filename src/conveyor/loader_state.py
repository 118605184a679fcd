"""The loader's own state: its schema, its version, and the checks a state passes before
``DataLoader2.load_state_dict`` accepts it (exact JSON types first, bounded; nothing from
the state is run). See docs/DESIGN.md, "State"."""

from __future__ import annotations

import copy
from typing import Any

from conveyor.error_budget import check_records
from conveyor.errors import StateError
from conveyor.pipes.base import IterDataPipe
from conveyor.pipes.passes import State
from conveyor.reading_service.interface import CheckpointableReadingServiceInterface, ReadingServiceInterface
from conveyor.validation import (
    check_plain_data,
    describe_state_value,
    require_keys,
    require_non_negative,
    require_position,
)

STATE_FORMAT = "conveyor.DataLoader2"
#: 2: the pipeline's state nested like the graph, beside the reading service's own part.
#: 3: ``seeded``: whether the seed was the user's (``seed()``) or drawn for the epoch; a
#: version-2 state is read as ``seeded`` (its epochs derived from one seed).
#: 4: ``skipped``: the items the epoch in progress dropped for errors
#: (``on_error="skip"``; :mod:`conveyor.error_budget`); a version-3 state has none.
STATE_VERSION = 4

_STATE_FIELDS: dict[str, Any] = {
    "format": str,
    "version": int,
    "fingerprint": str,
    "seed": int,
    "seeded": bool,
    "epoch": int,
    "in_progress": bool,
    "items": int,
    "pipeline": (dict, type(None)),
    "position": (list, type(None)),
    "reading_service": object,
    "skipped": list,
}


def check_loader_state(
    state: Any, fingerprint: str, service: ReadingServiceInterface, graph: IterDataPipe
) -> tuple[dict[str, Any], State | None, bool]:
    """``(a copy of the state, its pipeline state adapted to the services, whether it
    could be adapted and checked now)`` for a loader of ``graph`` (whose fingerprint is
    ``fingerprint``) reading through ``service``; raises :class:`StateError` for a bad
    state. Runs no code from the state."""
    check_plain_data(state, "DataLoader2 state")  # first: exact JSON types, bounded size
    where = "DataLoader2 state"
    if type(state) is dict and state.get("version") == 2 and "seeded" not in state:
        state = {**state, "version": 3, "seeded": True}  # version 2: one seed for every epoch
    if type(state) is dict and state.get("version") == 3 and "skipped" not in state:
        state = {**state, "version": STATE_VERSION, "skipped": []}  # version 3: nothing skipped
    require_keys(state, _STATE_FIELDS, where)
    if state["format"] != STATE_FORMAT:
        raise StateError(f"{where}: format {describe_state_value(state['format'])} is not {STATE_FORMAT!r}")
    if state["version"] != STATE_VERSION:
        raise StateError(
            f"{where}: version {state['version']} is not supported (this conveyor reads version {STATE_VERSION})"
        )
    if state["fingerprint"] != fingerprint:
        raise StateError(
            f"{where}: it was saved from another pipeline (graph fingerprint "
            f"{state['fingerprint'][:40]!r}, this loader's is {fingerprint})"
        )
    for key in ("epoch", "items"):
        require_non_negative(state, key, where)
    if state["seed"] < 0:
        raise StateError(f"{where}: 'seed' must be >= 0, got {state['seed']}")
    if state["seed"] >= 1 << 64:
        raise StateError(f"{where}: 'seed' must be below 2**64")
    if state["reading_service"] is not None and not state["in_progress"]:
        raise StateError(f"{where}: a state between epochs holds no reading_service state")
    if state["pipeline"] is not None and not state["in_progress"]:
        raise StateError(f"{where}: a state between epochs holds no pipeline state")
    if state["position"] is not None:
        require_position(state["position"], f"{where} position")
    check_records(state["skipped"], where)
    if state["skipped"] and not state["in_progress"]:
        raise StateError(f"{where}: a state between epochs holds no skipped items")
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
