"""``sharding_filter``: the point where items are split between ranks and workers."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from conveyor.pipes.base import IterDataPipe, Position, ShardingPoint
from conveyor.state import require_keys, require_non_negative


@IterDataPipe.register_functional("sharding_filter")
class ShardingFilter(IterDataPipe, ShardingPoint):
    """Keeps the items of this shard. Sharding levels nest (see ``SHARDING_PRIORITIES``):
    at each level with ``n`` shards, position ``i`` is kept if ``i % n`` is this shard's
    index, and ``i // n`` is the position seen by the next level. With no sharding
    applied, every item passes. The position of each item here keys the randomness of
    the random ops after it.
    """

    def __init__(self, source: IterDataPipe):
        self.source = source
        self._levels: dict[int, tuple[int, int]] = {}
        self._position = 0  # items read from upstream in this pass
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
        levels = [lv for lv in self.sharding if lv[0] > 1]
        upstream = iter(self.source)
        self._position = position
        for item in upstream:
            index = position
            position += 1
            keep = True
            for num_shards, shard_index in levels:
                if index % num_shards != shard_index:
                    keep = False
                    break
                index //= num_shards
            if keep:
                self._position = position
                self._last_position = (position - 1,)
                yield item
        self._position = position

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
        self._last_position = None

    def _current_state(self) -> dict[str, Any]:
        return {"position": self._position}

    def _check_state(self, state: Mapping[str, Any]) -> None:
        require_keys(state, {"position": int}, repr(self))
        require_non_negative(state, "position", repr(self))
