"""Stages: the nodes of a loader's graph as statistics rows and skip records name them.

A stage is one pipe of the graph a loader reads. Its *label* is what a person reads in
``stats()`` and in a skipped item's record; its *index* (stamped by
:func:`conveyor.loader.intake.assign_stage_indices`) is its place in the user's whole graph,
the same in every process however a service splits the graph. Kept free of conveyor
imports: the pass layer (skip records) and the observers (statistics) both name stages.
"""

from __future__ import annotations

from typing import Any

#: The attribute a loader stamps on each pipe of its graph: the stage's index.
STAGE_INDEX = "_stage_index"


def stage_label(node: Any) -> str:
    """A short name: the op's class and, for ops that call a function, its name."""
    fn = getattr(node, "fn", None)
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return f"{type(node).__name__}({name})" if name else type(node).__name__


def stage_index(node: Any) -> int:
    """The stage's index in the loader's graph, or -1 for a pipe no loader numbered."""
    return getattr(node, STAGE_INDEX, -1)
