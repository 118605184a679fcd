"""Column selection shared by ``map`` and ``filter``: apply a function to part of an item."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

Column = Hashable | Sequence[Hashable] | None


def check_columns(input_col: Column, output_col: Column) -> Column:
    """Validate the torchdata-style column arguments; returns the normalised ``output_col``."""
    if input_col is None and output_col is not None:
        raise ValueError("output_col must be None when input_col is None")
    if isinstance(output_col, (list, tuple)):
        if len(output_col) != 1:
            raise ValueError("output_col must be a single column (or a one-element list)")
        output_col = output_col[0]
    if isinstance(input_col, (list, tuple)) and len(input_col) > 1 and output_col is None:
        raise ValueError("several input columns need an output_col to store the result")
    return output_col


def select(item: Any, input_col: Column) -> tuple[Any, ...]:
    """The arguments ``fn`` receives for ``item``."""
    if input_col is None:
        return (item,)
    if isinstance(input_col, (list, tuple)):
        return tuple(item[col] for col in input_col)
    return (item[input_col],)


def store(item: Any, input_col: Column, output_col: Column, result: Any) -> Any:
    """``item`` with ``result`` put in its column: a copy, the user's item is not changed.

    ``output_col=None`` replaces the input column; ``-1`` appends to a tuple or list.
    """
    if input_col is None:
        return result
    target = output_col
    if target is None:
        target = input_col[0] if isinstance(input_col, (list, tuple)) else input_col
    was_tuple = isinstance(item, tuple)
    copied: Any = list(item) if was_tuple else (dict(item) if isinstance(item, dict) else list(item))
    if target == -1 and isinstance(copied, list):
        copied.append(result)
    else:
        copied[target] = result
    return tuple(copied) if was_tuple else copied


def apply(fn: Callable[..., Any], item: Any, input_col: Column, output_col: Column) -> Any:
    return store(item, input_col, output_col, fn(*select(item, input_col)))
