"""Plain ``pickle`` for graphs whose ops hold lambdas or local functions.

A pipe's ``__getstate__`` wraps each function that pickle could not find again by module
and qualified name (a lambda, a local function, a partial of one) in :class:`ByValue`,
which pickles it by value (:mod:`conveyor.core.serialization`); a copy gets the function itself.
"""

from __future__ import annotations

import copy
import functools
import sys
import types
from collections.abc import Callable
from typing import Any


def found_by_name_only(value: Any) -> bool | None:
    """For a function (or a partial of one): whether plain pickle finds every function in it
    again by module and qualified name; None for anything else."""
    if isinstance(value, functools.partial):
        parts = [value.func, *value.args, *value.keywords.values()]
        verdicts = [found_by_name_only(part) for part in parts]
        return None if all(v is None for v in verdicts) else all(v is not False for v in verdicts)
    if not isinstance(value, types.FunctionType):
        return None
    target: Any = sys.modules.get(value.__module__)
    for part in value.__qualname__.split("."):
        target = getattr(target, part, None)
    return target is value


class ByValue:
    """A function pickled by value; a copy is the function itself, as for any function."""

    __slots__ = ("function",)

    def __init__(self, function: Callable[..., Any]):
        self.function = function

    def __reduce__(self) -> tuple[Any, ...]:
        from conveyor.core.serialization import dumps, loads

        return loads, (dumps(self.function),)

    def __deepcopy__(self, memo: dict[int, Any]) -> Callable[..., Any]:
        return self.function


def picklable_attributes(attributes: dict[str, Any], runtime: frozenset[str]) -> dict[str, Any]:
    """A pipe's attributes for pickling and copying: without ``runtime`` ones (a pass kept
    for ``state_dict()``), functions that pickle cannot find by name wrapped by value."""
    state = {name: value for name, value in attributes.items() if name not in runtime}
    for name, value in state.items():
        if found_by_name_only(value) is False:
            state[name] = ByValue(value)
    return state


def restored_attributes(state: dict[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`picklable_attributes` (a shallow copy gets the wrappers back)."""
    return {k: v.function if type(v) is ByValue else v for k, v in state.items()}


def copy_sharing(obj: Any, memo: dict[int, Any], shared: set[str]) -> Any:
    """A deep copy of a pipe (``copy.deepcopy``'s ``__deepcopy__``) whose attributes named in
    ``shared`` are the original's objects, not copies (what the main process must read
    itself: a user's sampler, a dataset read in place). What belongs to a run stays
    behind, as for any pipe's copy."""
    clone = object.__new__(type(obj))
    memo[id(obj)] = clone
    for name, value in obj.__dict__.items():
        if name not in obj._runtime:
            clone.__dict__[name] = value if name in shared else copy.deepcopy(value, memo)
    return clone
