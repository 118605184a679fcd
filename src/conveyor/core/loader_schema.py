"""The loader state's schema: its format, its version, its fields and the checks that
need no graph or service (exact JSON types first, bounded; nothing from the state is run).

Kept apart from :mod:`conveyor.loader.state`, which checks a state against a loader's
graph and services, so that a service can check loader states itself (merging ranks'
states: :mod:`conveyor.reading_service.elastic`) without importing the loader's side.
"""

from __future__ import annotations

from typing import Any

from conveyor.core.error_budget import check_records
from conveyor.core.validation import (
    check_plain_data,
    describe_state_value,
    require_keys,
    require_non_negative,
    require_position,
)
from conveyor.errors import StateError

STATE_FORMAT = "conveyor.DataLoader2"
#: 2: the pipeline's state nested like the graph, beside the reading service's own part.
#: 3: ``seeded``: whether the seed was the user's (``seed()``) or drawn for the epoch; a
#: version-2 state is read as ``seeded`` (its epochs derived from one seed).
#: 4: ``skipped``: the items the epoch in progress dropped for errors
#: (``on_error="skip"``; :mod:`conveyor.core.error_budget`); a version-3 state has none.
#: 5: ``rng_at_save``: where the global RNG stood when a mid-epoch state was taken, for an
#: epoch whose seed was drawn from it (:func:`conveyor.core.random.global_rng_digest`); a
#: version-4 state has none.
STATE_VERSION = 5

#: torchdata's names for two of a state's keys (``torchdata.dataloader2.dataloader2``), so
#: code that reads a state's parts by them finds conveyor's: the reading service's part,
#: and the pipeline's, its state as plain data (torchdata kept a pickled copy of the graph
#: there; conveyor's state holds no graph, so this part is ``None`` between epochs).
READING_SERVICE_STATE_KEY_NAME = "reading_service"
SERIALIZED_DATAPIPE_KEY_NAME = "pipeline"

STATE_FIELDS: dict[str, Any] = {
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
    "rng_at_save": (str, type(None)),
}


def check_loader_fields(state: Any, where: str) -> dict[str, Any]:
    """``state`` with its loader-level fields checked (a version-2 or version-3 state read
    as the current version); raises :class:`StateError`. Checks neither the fingerprint
    nor the parts that belong to a graph or a service."""
    check_plain_data(state, where)  # first: exact JSON types, bounded size
    if type(state) is dict and state.get("version") == 2 and "seeded" not in state:
        state = {**state, "version": 3, "seeded": True}  # version 2: one seed for every epoch
    if type(state) is dict and state.get("version") == 3 and "skipped" not in state:
        state = {**state, "version": 4, "skipped": []}  # version 3: nothing skipped
    if type(state) is dict and state.get("version") == 4 and "rng_at_save" not in state:
        state = {**state, "version": STATE_VERSION, "rng_at_save": None}  # version 4: not noted
    require_keys(state, STATE_FIELDS, where)
    if state["format"] != STATE_FORMAT:
        raise StateError(f"{where}: format {describe_state_value(state['format'])} is not {STATE_FORMAT!r}")
    if state["version"] != STATE_VERSION:
        raise StateError(
            f"{where}: version {state['version']} is not supported (this conveyor reads version {STATE_VERSION})"
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
    return state
