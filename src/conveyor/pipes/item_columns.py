"""``drop``, ``slice`` and ``flatten``: reshape each item's columns (positions of a tuple
or list, keys of a dict), under torchdata's names and with its arguments and warnings.

Each is per item: it keeps its input's order, positions and state, so it resumes
exactly and gives the same output for any number of workers.
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Iterator
from typing import Any

from conveyor.core.base import IterDataPipe
from conveyor.core.passes import PassContext, State, ThroughPass
from conveyor.core.skips import drop_or_raise

_NOT_A_CONTAINER = (
    "{op}: an item is not a tuple, list or dict ({kind}), so it is yielded unchanged; "
    "apply {op} only to items with columns"
)
_MISSING = "{op}: the item has no column {index!r}; it is yielded without it"


class ColumnsPass(ThroughPass):
    def __init__(self, pipe: _ColumnOp, state: State | None, context: PassContext):
        super().__init__(pipe, state, context)
        self.items = self._reshape(pipe)

    def _reshape(self, pipe: _ColumnOp) -> Iterator[Any]:
        source, skips = self.source, self.context.skips
        for item in skips.unseen(pipe, source) if skips else source:
            try:
                result = pipe.reshape(item)
            except Exception as err:
                drop_or_raise(err, pipe, skips, source)
                self.skipped += 1
                continue
            yield result
            del result, item  # not held while the next item is made (see mapper.MapperPass)


class _ColumnOp(IterDataPipe):
    per_item = True
    keeps_order = True
    pass_type = ColumnsPass
    state_fields = {"source": dict}
    source: IterDataPipe  # each op's input

    def reshape(self, item: Any) -> Any:
        raise NotImplementedError  # each op below defines it

    def __len__(self) -> int:
        return len(self.source)

    def _warn_missing(self, item: Any, indices: Any) -> None:
        for index in indices:
            try:
                item[index]
            except (IndexError, KeyError, TypeError):
                warnings.warn(_MISSING.format(op=self._op, index=index), UserWarning, stacklevel=4)
                return

    _op = ""


def _columns(indices: Hashable | list[Hashable]) -> tuple[Hashable, ...]:
    """The columns, once each, in the order given (a set's order would vary between
    processes, and with it the graph's fingerprint that a state is checked against)."""
    return tuple(dict.fromkeys(indices if isinstance(indices, list) else [indices]))


class Dropper(_ColumnOp):
    """Each item without the columns ``indices`` (one index or key, or a list of them):
    ``(0, 10).drop(1)`` gives ``(0,)``. An item that is not a tuple, list or dict, or that
    lacks one of them, is a ``UserWarning``, as in torchdata."""

    _params = ("indices",)
    _op = "drop"

    def __init__(self, source: IterDataPipe, indices: Hashable | list[Hashable]):
        self.source = source
        self.indices = _columns(indices)

    def reshape(self, item: Any) -> Any:
        indices = self.indices
        if isinstance(item, tuple):
            result: Any = tuple(x for i, x in enumerate(item) if i not in indices)
        elif isinstance(item, list):
            result = [x for i, x in enumerate(item) if i not in indices]
        elif isinstance(item, dict):
            result = {k: v for k, v in item.items() if k not in indices}
        else:
            warnings.warn(_NOT_A_CONTAINER.format(op="drop", kind=type(item).__name__), UserWarning, stacklevel=3)
            return item
        self._warn_missing(item, indices)
        return result


@IterDataPipe.register_functional("drop", builds=Dropper)
def drop(self: IterDataPipe[Any], indices: Hashable | list[Hashable]) -> IterDataPipe[Any]:
    """Removes columns from each item (positions of a tuple or list, keys of a dict).

    An item that is not a tuple, list or dict, or lacks a column, passes with a
    ``UserWarning``, as in torchdata.

    Args:
        indices: The column to remove, or a list of them.

    Returns:
        A pipe of the items without those columns.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> list(IterableWrapper([(0, 10, 100)]).drop(1))
        [(0, 100)]
        >>> list(IterableWrapper([{"a": 1, "b": 2}]).drop("a"))
        [{'b': 2}]
    """
    return Dropper(self, indices)


class Slicer(_ColumnOp):
    """Each item's columns ``index:stop:step`` of a tuple or list, or the columns listed
    in ``index`` (a list: positions, or keys of a dict; a dict item keeps the key
    ``index`` when given one). ``(0, 10, 100).slice(0, 2)`` gives ``(0, 10)``."""

    _params = ("index", "stop", "step")
    _op = "slice"

    def __init__(
        self, source: IterDataPipe, index: int | list[Hashable], stop: int | None = None, step: int | None = None
    ):
        if isinstance(index, list) and (stop or step):
            warnings.warn(
                "slice: a list of indices was given with stop or step; only the list is used",
                UserWarning,
                stacklevel=2,
            )
        self.source = source
        self.index = index
        self.stop = stop
        self.step = step

    def reshape(self, item: Any) -> Any:
        index = self.index
        if isinstance(item, (tuple, list)):
            if isinstance(index, list):
                kept = [x for i, x in enumerate(item) if i in index]
                result: Any = tuple(kept) if isinstance(item, tuple) else kept
            else:
                result = item[index : self.stop : self.step]
        elif isinstance(item, dict):
            if isinstance(index, list):
                result = {k: v for k, v in item.items() if k in index}
            elif index in item:
                result = {index: item[index]}
            else:
                warnings.warn(
                    f"slice: a dict item has no key {index!r} and dicts are not sliced by position; "
                    "it is yielded unchanged",
                    UserWarning,
                    stacklevel=3,
                )
                return item
        else:
            warnings.warn(_NOT_A_CONTAINER.format(op="slice", kind=type(item).__name__), UserWarning, stacklevel=3)
            return item
        if isinstance(index, list):
            self._warn_missing(item, index)
        return result


@IterDataPipe.register_functional("slice", builds=Slicer)
def slice_(
    self: IterDataPipe[Any], index: int | list[Hashable], stop: int | None = None, step: int | None = None
) -> IterDataPipe[Any]:
    """Keeps some columns of each item: ``item[index:stop:step]``, or the columns listed.

    Args:
        index: Where the slice starts; or a list of positions (keys of a dict item) to
            keep, in the item's order.
        stop: Where the slice stops (exclusive); None: one past ``index``.
        step: The slice's step.

    Returns:
        A pipe of the items' slices.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> list(IterableWrapper([(0, 10, 100, 1000)]).slice(1, 3))
        [(10, 100)]
        >>> list(IterableWrapper([(0, 10, 100)]).slice([2, 0]))
        [(0, 100)]
    """
    return Slicer(self, index, stop, step)


class Flattener(_ColumnOp):
    """Each item with its nested columns spliced in, one level: ``(0, (1, 2))`` gives
    ``(0, 1, 2)``; a dict column's keys join the item's (an existing key wins, with a
    warning). ``indices`` (one or a list) flattens only those columns; none: all."""

    _params = ("indices",)
    _op = "flatten"

    def __init__(self, source: IterDataPipe, indices: Hashable | list[Hashable] | None = None):
        self.source = source
        self.indices = _columns(indices) if indices is not None and indices != [] else ()

    def reshape(self, item: Any) -> Any:
        indices = self.indices
        if isinstance(item, dict):
            result: Any = {}
            for key, value in item.items():
                if (not indices or key in indices) and isinstance(value, dict):
                    for sub_key, sub_value in value.items():
                        if sub_key in item or sub_key in result:  # the item's own key wins, then the first
                            warnings.warn(
                                f"flatten: the key {sub_key!r} is in the item already; the nested value is dropped",
                                UserWarning,
                                stacklevel=3,
                            )
                        else:
                            result[sub_key] = sub_value
                else:
                    result[key] = value
        elif isinstance(item, (tuple, list)):
            flat: list[Any] = []
            for i, value in enumerate(item):
                if (not indices or i in indices) and isinstance(value, (tuple, list)):
                    flat.extend(value)
                else:
                    flat.append(value)
            result = tuple(flat) if isinstance(item, tuple) else flat
        else:
            warnings.warn(_NOT_A_CONTAINER.format(op="flatten", kind=type(item).__name__), UserWarning, stacklevel=3)
            return item
        if indices:
            self._warn_missing(item, indices)
        return result


@IterDataPipe.register_functional("flatten", builds=Flattener)
def flatten(self: IterDataPipe[Any], indices: Hashable | list[Hashable] | None = None) -> IterDataPipe[Any]:
    """Splices each item's nested columns into it, one level deep.

    A dict column's keys join the item's (a key the item has already wins, with a
    warning).

    Args:
        indices: Flatten only this column, or these (a list); None: every column.

    Returns:
        A pipe of the flattened items.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> list(IterableWrapper([(0, (1, 2), 3)]).flatten())
        [(0, 1, 2, 3)]
    """
    return Flattener(self, indices)
