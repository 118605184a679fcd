"""A chunk's states, pickled once by the worker and unpickled by the main process only
when one of them is needed.

A worker sends, with each item, its state right after that item, so that a checkpoint
taken after any item handed out is exact. The main process needs those states rarely:
the one after the last item handed out from each worker when the user takes a
checkpoint (``state_dict()``), and the one after the last item received from a worker
when that worker is restarted. So a chunk travels as ``(items, positions, states,
last)``: the bytes of its states pickled together, and the index of its last state
that is not None (a skipped item's record has none). Unpickling every state (a dict per
stage of the worker's graph) and freeing it again would be a large share of what the main
process spends on a small item before handing it out, for states it almost never reads.
"""

from __future__ import annotations

import pickle
from typing import Any

#: What a worker encodes for a chunk: ``(items, positions, pickled states, last)``.
PackedChunk = tuple[tuple[Any, ...], tuple[Any, ...], bytes, int]


def pack(chunk: list[tuple[Any, Any, Any]]) -> PackedChunk:
    """``(item, state, position)`` entries as the chunk travels (see the module): the
    items and the positions as two tuples (no pair per item to pickle and unpickle)."""
    if not chunk:
        return (), (), pickle.dumps((), protocol=5), -1
    items, states, positions = zip(*chunk, strict=True)
    last = len(states) - 1
    while last >= 0 and states[last] is None:
        last -= 1
    return items, positions, pickle.dumps(states, protocol=5), last


class ChunkStates:
    """The states of one chunk's entries, by index, unpickled at the first look."""

    __slots__ = ("_pickled", "_states", "last")

    def __init__(self, pickled: bytes, last: int):
        self._pickled = pickled
        self._states: tuple[Any, ...] | None = None
        #: The index of the chunk's last state that is not None (-1: none is).
        self.last = last

    def __getitem__(self, index: int) -> Any:
        states = self._states
        if states is None:  # the bytes stay: a thread that looks at the same time unpickles them too
            states = self._states = pickle.loads(self._pickled)
        return states[index]


class StateRef:
    """The state at ``index`` of a chunk's :class:`ChunkStates`, not unpickled yet."""

    __slots__ = ("index", "states")

    def __init__(self, states: ChunkStates, index: int):
        self.states = states
        self.index = index

    def __repr__(self) -> str:
        return f"StateRef({self.index})"


def resolve(state: Any) -> Any:
    """``state`` itself, or the state a :class:`StateRef` stands for."""
    if type(state) is StateRef:
        return state.states[state.index]
    return state
