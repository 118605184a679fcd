"""``zip_with_map``: each item joined with the item a random-access pipe holds under its
key (torchdata's ``MapKeyZipper``).

It is per item: the lookup depends on the item alone, so it keeps its input's order,
positions and state, resumes exactly and gives the same output for any number of
workers. The random-access side is read by key, never iterated; it is part of the graph
(workers get their own copy).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from conveyor.pipes.base import IterDataPipe, MapDataPipe, note_error
from conveyor.pipes.passes import PassContext, State, ThroughPass


class MapKeyZipperPass(ThroughPass):
    def __init__(self, pipe: MapKeyZipper, state: State | None, context: PassContext):
        super().__init__(pipe, state, context)
        self.items = self._join(pipe)

    def _join(self, pipe: MapKeyZipper) -> Iterator[Any]:
        lookup, key_fn, merge_fn, keep_key = pipe.map_datapipe.__getitem__, pipe.key_fn, pipe.merge_fn, pipe.keep_key
        for item in self.source:
            try:
                key = key_fn(item)
                try:
                    found = lookup(key)
                except (KeyError, IndexError):
                    raise KeyError(
                        f"zip_with_map: key_fn maps the item {_short(item)} to {_short(key)}, which is not a key "
                        f"of {type(pipe.map_datapipe).__name__}; check key_fn or the map's keys"
                    ) from None
                joined = merge_fn(item, found) if merge_fn is not None else (item, found)
            except Exception as err:
                note_error(err, pipe)
                raise
            yield (key, joined) if keep_key else joined


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@IterDataPipe.register_functional("zip_with_map")
class MapKeyZipper(IterDataPipe):
    """Yields ``merge_fn(item, map_datapipe[key_fn(item)])`` (the pair ``(item, found)``
    without ``merge_fn``), or ``(key, that)`` with ``keep_key``. A key the map does not
    hold is a ``KeyError`` naming the item and the key."""

    per_item = True
    keeps_order = True
    pass_type = MapKeyZipperPass
    state_fields = {"source": dict}
    _params = ("key_fn", "merge_fn", "keep_key")

    def __init__(
        self,
        source: IterDataPipe,
        map_datapipe: MapDataPipe,
        key_fn: Callable[[Any], Any],
        merge_fn: Callable[[Any, Any], Any] | None = None,
        keep_key: bool = False,
    ):
        if not isinstance(map_datapipe, MapDataPipe):
            raise TypeError(f"zip_with_map() takes a MapDataPipe to look keys up in, got {type(map_datapipe).__name__}")
        if not callable(key_fn):
            raise TypeError(f"zip_with_map() needs a callable key_fn, got {type(key_fn).__name__}")
        if merge_fn is not None and not callable(merge_fn):
            raise TypeError(f"zip_with_map() needs a callable merge_fn or None, got {type(merge_fn).__name__}")
        self.source = source
        self.map_datapipe = map_datapipe
        self.key_fn = key_fn
        self.merge_fn = merge_fn
        self.keep_key = keep_key

    def __len__(self) -> int:
        return len(self.source)
