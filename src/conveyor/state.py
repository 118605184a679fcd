"""Graph states: every node's own state, in canonical order, as plain data.

A graph state is ``{"nodes": [{"pipe": "<class>", "state": {...}}, ...]}``, aligned with
:func:`conveyor.graph.list_dps`. It is built from ints, strings, bools, lists and dicts
only, so it survives JSON, and loading it never runs code from the state.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from conveyor.errors import StateError
from conveyor.graph import list_dps
from conveyor.pipes.base import DataPipe, IterDataPipe
from conveyor.validation import require_keys, require_non_negative

GraphState = dict[str, Any]

__all__ = [
    "GraphState",
    "StateCapturer",
    "capture_graph_state",
    "load_graph_state",
    "prepare_upstream",
    "require_keys",  # re-exported from conveyor.validation for the ops
    "require_non_negative",
    "reset_graph",
    "validate_graph_state",
]


def reset_graph(pipe: DataPipe) -> None:
    """Reset every node upstream of (and including) ``pipe`` to the start of a pass."""
    for node in list_dps(pipe):
        if isinstance(node, IterDataPipe):
            node.reset()


def abandon_staged_states(pipe: DataPipe) -> None:
    """Before a new pass of the same epoch: the resumed pass ended before reaching some
    nodes upstream of ``pipe``, whose staged states it never used (see
    ``IterDataPipe._abandon_restored``)."""
    for node in list_dps(pipe):
        if isinstance(node, IterDataPipe):
            node._abandon_restored()


def capture_graph_state(pipe: DataPipe) -> GraphState:
    """The state of every node upstream of (and including) ``pipe``."""
    return {"nodes": [_node_entry(node) for node in list_dps(pipe)]}


def prepare_upstream(source: DataPipe, resume: Any, snapshot_key: str, where: str) -> None:
    """Put ``source``'s subgraph where a snapshot node's pass must start reading it.

    A fresh pass (``resume`` is None) resets the subgraph; a resume with a snapshot
    loads it; a resume without one keeps what the graph-level load staged.
    """
    if resume is None:
        reset_graph(source)
    elif resume[snapshot_key] is not None:
        load_graph_state(source, resume[snapshot_key], where)


class StateCapturer:
    """Captures a graph's state repeatedly without walking the graph each time.

    For nodes that snapshot their upstream per item (prefetch, flatmap, shuffle windows)
    and for workers that attach the state to every item they emit.
    """

    def __init__(self, pipe: DataPipe):
        self._nodes = list_dps(pipe)

    def __call__(self) -> GraphState:
        return {"nodes": [_node_entry(node) for node in self._nodes]}


def _node_entry(node: DataPipe) -> dict[str, Any]:
    state = node.state_dict() if isinstance(node, IterDataPipe) else {}
    return {"pipe": type(node).__name__, "state": state}


def validate_graph_state(pipe: DataPipe, state: Any, where: str = "graph state") -> None:
    """Raise :class:`StateError` unless ``state`` is a valid state of this graph. Changes nothing."""
    nodes = list_dps(pipe)
    entries = _entries(state, len(nodes), where)
    for i, (node, entry) in enumerate(zip(nodes, entries, strict=True)):
        node_where = f"{where}, node {i} ({type(node).__name__})"
        require_keys(entry, {"pipe": str, "state": Mapping}, node_where)
        if entry["pipe"] != type(node).__name__:
            raise StateError(
                f"{node_where}: the state is for a {entry['pipe']!r} but the graph has "
                f"{node!r} there; was it saved from another pipeline?"
            )
        if isinstance(node, IterDataPipe):
            _checked(node, entry["state"], node_where)
        elif entry["state"]:
            raise StateError(f"{node_where}: random-access pipes hold no state")


def load_graph_state(pipe: DataPipe, state: Any, where: str = "graph state") -> None:
    """Validate ``state`` as a whole, then stage each node's part for its next ``iter()``."""
    validate_graph_state(pipe, state, where)
    for node, entry in zip(list_dps(pipe), state["nodes"], strict=True):
        if isinstance(node, IterDataPipe):
            node.load_state_dict(entry["state"])


def _entries(state: Any, expected: int, where: str) -> list[Any]:
    require_keys(state, {"nodes": list}, where)
    entries = state["nodes"]
    if len(entries) != expected:
        raise StateError(
            f"{where}: the state has {len(entries)} nodes but the graph has {expected}; "
            "was it saved from another pipeline?"
        )
    return entries


def _checked(node: IterDataPipe, state: Mapping[str, Any], where: str) -> None:
    try:
        node._check_state(state)
    except StateError as err:
        raise StateError(f"{where}: {err}") from None
    except (KeyError, TypeError, IndexError, AttributeError) as err:
        raise StateError(f"{where}: malformed state ({type(err).__name__}: {err})") from None
