"""``sharding_filter``: the point where items are split between ranks and workers."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from conveyor.pipes.base import IndexedStream, IterDataPipe, Position, ShardingPoint, close_iterator
from conveyor.state import require_keys, require_non_negative


@IterDataPipe.register_functional("sharding_filter")
class ShardingFilter(IterDataPipe, ShardingPoint):
    """Keeps the items of this shard. Sharding levels nest (see ``SHARDING_PRIORITIES``):
    at each level with ``n`` shards, position ``i`` is kept if ``i % n`` is this shard's
    index, and ``i // n`` is the position seen by the next level. With no sharding
    applied, every item passes. The position of each item here keys the randomness of
    the random ops after it.
    """

    per_item = True
    keeps_order = True

    def __init__(self, source: IterDataPipe):
        self.source = source
        self._levels: dict[int, tuple[int, int]] = {}
        self._position = 0  # items read from upstream in this pass
        self._skip_below = 0  # positions below this are not yielded (see rebase_positions)
        self._last_position: Position | None = None

    def apply_sharding(self, num_shards: int, shard_index: int, priority: Any) -> None:
        self._levels[int(priority)] = (num_shards, shard_index)

    @property
    def sharding(self) -> list[tuple[int, int]]:
        """``(num_shards, shard_index)`` per level, outermost first."""
        return [self._levels[p] for p in sorted(self._levels)]

    def __iter__(self) -> Iterator[Any]:
        resume = self._take_restored()
        position = resume["position"] if resume else 0
        self._skip_below = skip_below = resume["skip_below"] if resume else 0
        levels = [lv for lv in self.sharding if lv[0] > 1]
        if levels and isinstance(self.source, IndexedStream):
            yield from self._read_own_positions(self.source, position, skip_below, levels)
            return
        upstream = iter(self.source)
        self._position = position
        for item in upstream:
            index = position
            position += 1
            keep = index >= skip_below
            for num_shards, shard_index in levels if keep else ():
                if index % num_shards != shard_index:
                    keep = False
                    break
                index //= num_shards
            if keep:
                self._position = position
                self._last_position = (position - 1,)
                yield item
        self._position = position

    def _read_own_positions(
        self, source: IndexedStream, position: int, skip_below: int, levels: list[tuple[int, int]]
    ) -> Iterator[Any]:
        """The same items and states as reading every item and keeping this shard's, but
        reading only those: nested levels keep the positions ``offset + k * stride``."""
        source.start_indexed_pass()
        stride, offset = 1, 0
        for num_shards, shard_index in levels:
            offset += shard_index * stride
            stride *= num_shards
        first = max(position, skip_below)
        first += (offset - first) % stride
        length = len(source)  # type: ignore[arg-type]
        positions = range(first, length, stride)
        items = _read_at(source, positions)
        meter = source.__dict__.get("_meter")
        if meter is not None:
            items = meter.count(items)  # the source's stage counts its reads and is charged for them
        self._position = position
        try:
            for kept, item in zip(positions, items, strict=True):
                self._position = kept + 1
                self._last_position = (kept,)
                yield item
        finally:
            close_iterator(items)
        source.end_indexed_pass()
        self._position = max(position, length)

    def item_position(self) -> Position | None:
        return self._last_position

    def __len__(self) -> int:
        length = len(self.source)
        for num_shards, shard_index in self.sharding:
            length = max(0, -(-(length - shard_index) // num_shards))
        return length

    def reset(self) -> None:
        super().reset()
        self._position = 0
        self._skip_below = 0
        self._last_position = None

    def _current_state(self) -> dict[str, Any]:
        return {"position": self._position, "skip_below": self._skip_below}

    def _check_state(self, state: Mapping[str, Any]) -> None:
        require_keys(state, {"position": int, "skip_below": int}, repr(self))
        require_non_negative(state, "position", repr(self))
        require_non_negative(state, "skip_below", repr(self))


def _read_at(source: IndexedStream, positions: range) -> Iterator[Any]:
    for position in positions:
        yield source.read_at(position)


def skip_handed_out(graph_state: Any, first_unseen: int) -> Any:
    """A copy of a graph state whose sharding points skip every position below
    ``first_unseen``, in upstream snapshots too.

    Resuming with another number of workers loads one worker's state everywhere; its
    snapshots were taken where *that* worker stood, possibly before items that others
    already handed out. Skipping them at the sharding point replays nothing twice.
    """
    if isinstance(graph_state, dict):
        if graph_state.get("pipe") == ShardingFilter.__name__ and isinstance(graph_state.get("state"), dict):
            state = dict(graph_state["state"])
            state["skip_below"] = max(state.get("skip_below", 0), first_unseen)
            return {**graph_state, "state": state}
        return {key: skip_handed_out(value, first_unseen) for key, value in graph_state.items()}
    if isinstance(graph_state, list):
        return [skip_handed_out(value, first_unseen) for value in graph_state]
    return graph_state
