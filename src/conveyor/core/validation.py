"""Checks for plain-data states (exact keys, JSON types, ranges) and for int arguments
(:func:`check_int`). No other conveyor imports, so every layer can use them.

A state comes from JSON (or from Python code pretending it did), so it is checked in two
steps. :func:`check_plain_data` walks the whole value once, iteratively, and refuses
anything that is not made of the exact JSON types or that exceeds the size limits below;
after it, every other check can index, compare and format the state without running code
from it. The ``require_*`` helpers check one level of a state; they are safe on their own
too: they test exact types (``type(v) is int``, never ``isinstance``) before touching a
value, and every message shows values through :func:`describe_state_value`, which is
bounded, so a bad value never makes a message (or the time to build it) as big as itself.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any, NoReturn

from conveyor.errors import StateError

#: Containers nested deeper than this are refused. A pipeline state nests one level per op
#: (each pass holds its input's state) plus a few for the loader and the workers' part, so
#: 250 admits graphs of a couple of hundred ops in a chain, and keeps the recursive code that
#: runs after this check (``copy.deepcopy``, the pipes' own checks: two or three frames a
#: level) below Python's default recursion limit of 1000.
MAX_DEPTH = 250

#: At most this many values (containers and scalars, keys not counted). 5 million values is
#: about 60 MB of JSON and 0.5 GB of Python objects, and takes about a second to walk;
#: the largest state measured (24 chained snapshotting stages) had 2.4 million.
MAX_ITEMS = 5_000_000

#: The characters of all strings (keys included) together. Real states hold short strings
#: (format, fingerprint, class names and keys, ~12 characters a value); 2**26 (64 Mi) is
#: several times what a MAX_ITEMS state holds, and refuses a 100 MB string at once.
MAX_CHARS = 1 << 26

#: Ints must be in ``[MIN_INT, INT_BOUND)``: every int a state holds is a counter (below
#: 2**63) or a 64-bit seed (below 2**64). The bound is checked by comparison, which costs
#: the same for any int; formatting a 10**6-digit int would take seconds.
MIN_INT = -(1 << 63)
INT_BOUND = 1 << 64

#: Counters and offsets in a state are below this: a larger one is corrupt (no pass reaches
#: it, and Python's own indexing would refuse it later instead of now).
MAX_COUNTER = 2**63

#: The default length of :func:`describe_state_value`'s text (a few more characters for the
#: length of what was cut).
DESCRIBE_LIMIT = 80

#: A path to a bad node shows at most this many steps (the first and the last ones).
_PATH_STEPS = 10
_PATH_KEY_LIMIT = 24

_JSON_TYPES = "dict, list, str, int, float, bool and None"

_PLAIN_TYPES: dict[Any, str] = {
    int: "an int",
    bool: "a bool",
    str: "a string",
    list: "a list",
    dict: "a dict",
    Mapping: "a dict",
}


def check_plain_data(
    value: Any,
    where: str,
    *,
    max_depth: int = MAX_DEPTH,
    max_items: int = MAX_ITEMS,
    max_chars: int = MAX_CHARS,
) -> None:
    """Raise :class:`StateError` unless ``value`` is plain JSON data within the limits.

    Every node must be of an exact JSON type: ``dict`` with ``str`` keys, ``list``,
    ``str``, ``int`` in ``[-2**63, 2**64)``, finite ``float``, ``bool`` or ``None``.
    Subclasses (``IntEnum``, ``OrderedDict``, numpy floats, ``str`` subclasses...) and
    tuples are refused, and none of their methods is called. The walk is iterative, visits
    each node once and stops at the first problem, so it costs time linear in the size of
    ``value`` and no more than the limits allow; cycles and shared subtrees are caught by
    ``max_depth`` and ``max_items``. The message names the path to the bad node, e.g.
    ``DataLoader2 state['reading_service']['main'][3]``.
    """
    frames: list[tuple[Iterator[tuple[Any, Any]], bool]] = []  # (entries, is a dict) per open container
    path: list[str | int] = []  # the current key or index in each open container
    items = chars = 0
    node = value
    while True:
        items += 1
        kind = type(node)
        if items > max_items:
            _fail(where, path, f"more than {max_items} values in all")
        if kind is str:
            chars += len(node)
            if chars > max_chars:
                _fail(
                    where,
                    path,
                    f"strings of more than {max_chars} characters in all, here {describe_state_value(node)}",
                )
        elif kind is int:
            if not MIN_INT <= node < INT_BOUND:
                _fail(where, path, f"{describe_state_value(node)} is outside [-2**63, 2**64)")
        elif kind is float:
            if not math.isfinite(node):
                _fail(where, path, f"{node!r} is not a finite number (JSON has no NaN or infinity)")
        elif kind is dict or kind is list:
            if len(frames) >= max_depth:
                _fail(where, path, f"containers nested more than {max_depth} deep")
            frames.append((iter(node.items()), True) if kind is dict else (enumerate(node), False))
            path.append(0)
        elif node is not None and kind is not bool:
            _fail(where, path, f"{describe_state_value(node)} is not plain data (only exact {_JSON_TYPES} are)")
        while frames:  # on to the next node: the next entry of the innermost unfinished container
            entries, is_dict = frames[-1]
            entry = next(entries, None)
            if entry is None:
                frames.pop()
                path.pop()
                continue
            key, node = entry
            if is_dict:
                if type(key) is not str:
                    _fail(where, path[:-1], f"dict keys must be exact str, got {describe_state_value(key)}")
                chars += len(key)
                if chars > max_chars:
                    _fail(
                        where,
                        path[:-1],
                        f"strings of more than {max_chars} characters in all, here key {describe_state_value(key)}",
                    )
            path[-1] = key
            break
        else:
            return


def describe_state_value(value: Any, limit: int = DESCRIBE_LIMIT) -> str:
    """A short text for any value, for messages: about ``limit`` characters at most.

    Runs no code of the value: exact JSON types are shown (a long string by its start and
    length, a big int by its bit length, a container by its first entries and length);
    anything else by its class name alone. Costs time bounded by ``limit``, not by the value.
    """
    kind = type(value)
    if value is None or kind is bool or kind is float:
        return repr(value)
    if kind is int:
        bits = value.bit_length()
        return repr(value) if bits <= 128 else f"an int of {bits} bits"
    if kind is str:
        return _describe_str(value, limit)
    if kind is list or kind is dict:
        return _describe_container(value, limit)
    return _describe_foreign(value)


# --- one level of a state ---------------------------------------------------------------


def require_keys(state: Any, fields: Mapping[str, Any], where: str) -> None:
    """Check that ``state`` is a dict with exactly ``fields``, each of the given type.

    Types are exact (a subclass of ``dict``, ``int``... is refused without running any of
    its methods); ``Mapping`` means ``dict``. ``int`` fields reject bools (JSON keeps them
    apart, so must we); a tuple of types allows any of them (``(int, type(None))`` for
    optional ints).
    """
    if type(state) is not dict:
        raise StateError(f"{where}: expected a dict, got {describe_state_value(state)}")
    for key in state:  # before any hashing or comparing, which would run a str subclass's code
        if type(key) is not str:
            raise StateError(f"{where}: keys must be exact str, got {describe_state_value(key)}")
    missing = [key for key in fields if key not in state]
    extra = [key for key in state if key not in fields]
    if missing or extra:
        raise StateError(f"{where}: missing keys {_some_keys(missing)}, unexpected keys {_some_keys(extra)}")
    for key, expected in fields.items():
        if not _is_instance(state[key], expected):
            raise StateError(f"{where}: {key!r} must be {_type_name(expected)}, got {describe_state_value(state[key])}")


def require_non_negative(state: Mapping[str, Any], key: str, where: str) -> int:
    """``state[key]``, checked to be an int in ``[0, 2**63)`` (``state`` must be a dict)."""
    if type(state) is not dict:
        raise StateError(f"{where}: expected a dict, got {describe_state_value(state)}")
    value = state[key]
    if type(value) is not int or not 0 <= value < MAX_COUNTER:
        raise StateError(f"{where}: {key!r} must be an int in [0, 2**63), got {describe_state_value(value)}")
    return value


def require_position(value: Any, where: str) -> None:
    """An item's position at the sharding point, as a state stores it: a non-empty list of
    counters, each in ``[0, 2**63)``."""
    if not (type(value) is list and value and all(type(i) is int and 0 <= i < MAX_COUNTER for i in value)):
        raise StateError(
            f"{where}: a position must be a non-empty list of ints in [0, 2**63), got {describe_state_value(value)}"
        )


def _is_instance(value: Any, expected: Any) -> bool:
    """Whether ``type(value)`` is exactly one of ``expected`` (``Mapping`` meaning ``dict``;
    ``object`` meaning any plain data, which :func:`check_plain_data` vouches for)."""
    kind = type(value)
    options = expected if type(expected) is tuple else (expected,)
    return any(kind is option or option is object or (option is Mapping and kind is dict) for option in options)


def _type_name(expected: Any) -> str:
    options = expected if isinstance(expected, tuple) else (expected,)
    return " or ".join(_PLAIN_TYPES.get(o, "None" if o is type(None) else o.__name__) for o in options)


# --- bounded texts ----------------------------------------------------------------------


def _fail(where: str, path: list[str | int], problem: str) -> NoReturn:
    raise StateError(f"{where}{_format_path(path)}: {problem}")


def _format_path(path: list[str | int]) -> str:
    """``['a'][3]['b']``, each key cut to a few characters and long paths cut in the middle."""
    steps = [f"[{_short_key(step)}]" if type(step) is str else f"[{step}]" for step in path]
    if len(steps) > _PATH_STEPS:
        head, tail = _PATH_STEPS // 2 - 1, _PATH_STEPS // 2
        steps = [*steps[:head], f"[... {len(steps) - head - tail} levels ...]", *steps[-tail:]]
    return "".join(steps)


def _short_key(key: str) -> str:
    """A key's repr, cut to a few characters (a key's length adds nothing to a message)."""
    return _cut(repr(key[:_PATH_KEY_LIMIT]), _PATH_KEY_LIMIT)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(limit - 3, 0)] + "..."


def _describe_str(text: str, limit: int) -> str:
    shown = repr(text[:limit])  # an escaped character takes up to 10: cut the repr too
    if len(text) <= limit and len(shown) <= limit:
        return shown
    return f"{_cut(shown, limit)} (a str of {len(text)} characters)"


def _describe_container(container: list[Any] | dict[str, Any], limit: int) -> str:
    """The first entries (nested containers as ``[...]``/``{...}``) within ``limit``, and the length."""
    is_dict = type(container) is dict
    entries: Any = container.items() if isinstance(container, dict) and is_dict else container
    parts: list[str] = []
    used = 0
    for entry in entries:  # each entry costs a bounded text and at least 3 characters of ``limit``
        if is_dict:
            key, item = entry
            key_text = _describe_str(key, 20) if type(key) is str else _describe_foreign(key)
            part = f"{key_text}: {_describe_leaf(item)}"
        else:
            part = _describe_leaf(entry)
        used += len(part) + 2
        if used > limit:
            break
        parts.append(part)
    opening, closing = ("{", "}") if is_dict else ("[", "]")
    if len(parts) == len(container):
        return f"{opening}{', '.join(parts)}{closing}"
    noun = "a dict of" if is_dict else "a list of"
    return f"{opening}{', '.join([*parts, '...'])}{closing} ({noun} {len(container)} entries)"


def _describe_leaf(value: Any) -> str:
    kind = type(value)
    if kind is list:
        return "[...]" if value else "[]"
    if kind is dict:
        return "{...}" if value else "{}"
    return describe_state_value(value, 20)


def _describe_foreign(value: Any) -> str:
    """``a value of type Color (a subclass of int)``: the class's name, read without
    running any code (not even a metaclass's ``__name__``); ``issubclass`` between classes
    reads the MRO and runs none either."""
    kind = type(value)
    if kind is tuple:
        return f"a tuple of {len(value)} items"
    name = _cut(_TYPE_NAME.__get__(kind), 40)
    base = next((b for b in (bool, int, float, str, dict, list, tuple) if issubclass(kind, b)), None)
    return f"a value of type {name}" + (f" (a subclass of {base.__name__})" if base is not None else "")


_TYPE_NAME = type.__dict__["__name__"]


def _some_keys(keys: list[str]) -> str:
    """At most 10 keys, each cut short: ``['a', 'b', ... (+5 more)]``."""
    shown = [_short_key(key) for key in keys[:10]]
    more = f", ... (+{len(keys) - 10} more)" if len(keys) > 10 else ""
    return f"[{', '.join(shown)}{more}]"


def check_int(name: str, value: Any, minimum: int = 0, allow_none: bool = False) -> None:
    """Reject anything but an int >= ``minimum`` (bools too), naming the argument."""
    if allow_none and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = "a positive int" if minimum == 1 else f"an int >= {minimum}"
        raise ValueError(f"{name} must be {kind}{' or None' if allow_none else ''}, got {value!r}")
