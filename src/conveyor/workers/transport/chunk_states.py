"""A chunk's states, pickled once by the worker and unpickled by the main process only
when one of them is needed.

A worker sends, with each item, its state right after that item, so that a checkpoint
taken after any item handed out is exact. The main process needs those states rarely:
the one after the last item handed out from each worker when the user takes a
checkpoint (``state_dict()``), and the one after the last item received from a worker
when that worker is restarted. So a chunk's states travel as a section of its frame of
their own, beside its items (see :mod:`conveyor.workers.transport.frame`), with the
index of its last state that is not None (a skipped item's record has none).
Unpickling every state (a dict per stage of the worker's graph) and freeing it again
would be a large share of what the main process spends on a small item before handing
it out, for states it almost never reads.
"""

from __future__ import annotations

import pickle
from typing import Any


def last_state(states: tuple[Any, ...]) -> int:
    """The index of the last of ``states`` that is not None (-1: none is)."""
    last = len(states) - 1
    while last >= 0 and states[last] is None:
        last -= 1
    return last


class ChunkStates:
    """The states of one chunk's entries, by index: in the worker, the states themselves
    (pickled once, when the chunk is encoded); in the main process, their pickle,
    unpickled at the first look."""

    __slots__ = ("_pickled", "_states", "last")

    def __init__(self, pickled: bytes | None, last: int, states: tuple[Any, ...] | None = None):
        self._pickled = pickled
        self._states = states
        #: The index of the chunk's last state that is not None (-1: none is).
        self.last = last

    @classmethod
    def of(cls, states: tuple[Any, ...]) -> ChunkStates:
        """A worker's states of a chunk it is about to send."""
        return cls(None, last_state(states), states)

    @property
    def pickled(self) -> bytes:
        """The states' pickle (made at the first call)."""
        pickled = self._pickled
        if pickled is None:
            pickled = self._pickled = pickle.dumps(self._states, protocol=5)
        return pickled

    def snapshot(self) -> ChunkStates:
        """These states as the main process receives them: pickled now (a thread worker's
        pass goes on changing what it captured), unpickled at the first look."""
        return ChunkStates(self.pickled, self.last)

    def __getitem__(self, index: int) -> Any:
        states = self._states
        if states is None:  # the bytes stay: a thread that looks at the same time unpickles them too
            states = self._states = pickle.loads(self._pickled)  # type: ignore[arg-type]
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
