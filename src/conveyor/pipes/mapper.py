"""``map``: apply a function to every item (or to some of its columns)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from conveyor.core.base import IterDataPipe, drop_or_raise
from conveyor.core.passes import PassContext, State, ThroughPass
from conveyor.pipes import columns


class MapperPass(ThroughPass):
    def __init__(self, pipe: Mapper, state: State | None, context: PassContext):
        super().__init__(pipe, state, context)
        self.items = self._map(pipe)

    def _map(self, pipe: Mapper) -> Iterator[Any]:
        fn, input_col, output_col = pipe.fn, pipe.input_col, pipe.output_col
        source, skips = self.source, self.context.skips
        for item in skips.unseen(pipe, source) if skips else source:
            try:
                result = fn(item) if input_col is None else columns.apply(fn, item, input_col, output_col)
            except Exception as err:
                drop_or_raise(err, pipe, skips, source)
                self.skipped += 1
                continue
            yield result
            # Let go of both before the next item is made: a generator's locals live on, and
            # the next call would otherwise build its result while holding this one (two
            # large items alive at a time in the worker, where one would do).
            del result, item


@IterDataPipe.register_functional("map")
class Mapper(IterDataPipe):
    """Yields ``fn(item)``. With ``input_col``, ``fn`` gets those columns of a tuple,
    list or dict item, and the result replaces the column (or goes to ``output_col``;
    ``-1`` appends). Errors from ``fn`` carry a note naming this pipe.
    """

    per_item = True
    keeps_order = True
    pass_type = MapperPass
    state_fields = {"source": dict}

    _params = ("fn", "input_col", "output_col")

    def __init__(
        self,
        source: IterDataPipe,
        fn: Callable[..., Any],
        input_col: columns.Column = None,
        output_col: columns.Column = None,
    ):
        if not callable(fn):
            raise TypeError(f"map() needs a callable, got {type(fn).__name__}")
        self.source = source
        self.fn = fn
        self.input_col = input_col
        self.output_col = columns.check_columns(input_col, output_col)

    def __len__(self) -> int:
        return len(self.source)
