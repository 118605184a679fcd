"""Pipeline states: plain data nested like the graph, walked by following the graph.

A pass's state holds its own fields and its inputs' states (see
:mod:`conveyor.core.base`); a state is validated by the pipes themselves
(:meth:`~conveyor.core.base.IterDataPipe.check_state`). Code that must find one node's
part in a whole state (a reading service re-splitting its workers' states) walks it with
:func:`walk_state`, which follows the pipes, never a name written in the state.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from conveyor.core.base import IterDataPipe
from conveyor.core.foreign import as_pipe
from conveyor.core.passes import State
from conveyor.core.validation import require_keys, require_non_negative

__all__ = ["State", "require_keys", "require_non_negative", "walk_state"]


def walk_state(pipe: IterDataPipe, state: State) -> Iterator[tuple[IterDataPipe, State]]:
    """``(pipe, its part)`` for every part of ``state`` (a valid state of a pass over
    ``pipe``), outermost first, including inputs' states saved from earlier points (a
    shuffle window's start). The parts are the state's own dicts: changing one changes
    ``state``."""
    stack: list[tuple[IterDataPipe, State]] = [(pipe, state)]
    while stack:
        node, part = stack.pop()
        yield node, part
        stack.extend((as_pipe(child), inner) for child, inner, _ in reversed(node.substates(part)))


def parts_of(pipe: IterDataPipe, state: State, node: Any) -> list[State]:
    """Every part of ``state`` that belongs to ``node`` (a pipe of ``pipe``'s graph)."""
    return [part for found, part in walk_state(pipe, state) if found is node]
