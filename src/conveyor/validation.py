"""Checks for plain-data states: exact keys, JSON types, ranges. No other conveyor imports,
so every layer can use them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from conveyor.errors import StateError

_PLAIN_TYPES: dict[Any, str] = {
    int: "an int",
    bool: "a bool",
    str: "a string",
    list: "a list",
    Mapping: "a mapping",
}


def require_keys(state: Any, fields: Mapping[str, Any], where: str) -> None:
    """Check that ``state`` is a mapping with exactly ``fields``, each of the given type.

    ``int`` fields reject bools (JSON keeps them apart, so must we); a tuple of types
    allows any of them (``(int, type(None))`` for optional ints).
    """
    if not isinstance(state, Mapping):
        raise StateError(f"{where}: expected a mapping, got {type(state).__name__}")
    missing = sorted(set(fields) - set(state))
    extra = sorted(str(k) for k in set(state) - set(fields))
    if missing or extra:
        raise StateError(f"{where}: missing keys {missing}, unexpected keys {extra}")
    for key, expected in fields.items():
        if not _is_instance(state[key], expected):
            raise StateError(f"{where}: {key!r} must be {_type_name(expected)}, got {type(state[key]).__name__}")


#: Counters and offsets in a state are below this: a larger one is corrupt (no pass reaches
#: it, and Python's own indexing would refuse it later instead of now).
MAX_COUNTER = 2**63


def require_non_negative(state: Mapping[str, Any], key: str, where: str) -> int:
    value = state[key]
    if not 0 <= value < MAX_COUNTER:
        raise StateError(f"{where}: {key!r} must be in [0, 2**63), got {value}")
    return value


def _is_instance(value: Any, expected: Any) -> bool:
    options = expected if isinstance(expected, tuple) else (expected,)
    for option in options:
        if option is int and isinstance(value, int) and not isinstance(value, bool):
            return True
        if option is not int and isinstance(value, option):
            return True
    return False


def _type_name(expected: Any) -> str:
    options = expected if isinstance(expected, tuple) else (expected,)
    return " or ".join(_PLAIN_TYPES.get(o, "None" if o is type(None) else o.__name__) for o in options)


def require_position(value: Any, where: str) -> None:
    """An item's position at the sharding point, as a state stores it: a non-empty list of
    counters, each in ``[0, 2**63)``."""
    if not (
        isinstance(value, list)
        and value
        and all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < MAX_COUNTER for i in value)
    ):
        raise StateError(f"{where}: a position must be a non-empty list of ints in [0, 2**63), got {value!r}")
