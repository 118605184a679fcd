"""``sharding_filter``: the point where items are split between ranks and workers."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any, TypeVar

from conveyor.core.base import IterDataPipe
from conveyor.core.handed_out import HandedOut
from conveyor.core.op_roles import SHARDING_PRIORITIES, ShardingPoint
from conveyor.core.passes import Pass, PassContext, Position, State
from conveyor.core.torch_support import loaded_torch, torch_worker_info
from conveyor.core.validation import MAX_COUNTER

T = TypeVar("T")


#: Sharding levels by name: conveyor's ``SHARDING_PRIORITIES`` values (torch's enum has
#: the same names with other values).
LEVELS = {level.name: level.value for level in SHARDING_PRIORITIES}


def sharding_level(sharding_group: Any) -> int:
    """Conveyor's level for a ``SHARDING_PRIORITIES`` member, conveyor's or torch's."""
    name = getattr(sharding_group, "name", None)
    if isinstance(name, str) and name in LEVELS:
        return LEVELS[name]
    if isinstance(sharding_group, int) and not isinstance(sharding_group, bool) and sharding_group in LEVELS.values():
        return int(sharding_group)
    raise ValueError(f"sharding_group must be a SHARDING_PRIORITIES member, got {sharding_group!r}")


def check_share(num_of_instances: Any, instance_id: Any) -> None:
    if isinstance(num_of_instances, bool) or not isinstance(num_of_instances, int) or num_of_instances < 1:
        raise ValueError(f"num_of_instances must be a positive int, got {num_of_instances!r}")
    if isinstance(instance_id, bool) or not isinstance(instance_id, int) or not 0 <= instance_id < num_of_instances:
        raise ValueError(f"instance_id must be an int in [0, {num_of_instances}), got {instance_id!r}")


def _torch_worker_levels() -> list[tuple[int, int]]:
    """For a sharding point nobody sharded, read inside a worker of torch's ``DataLoader``
    (the pipe handed to it as an ``IterableDataset``): the rank's share when
    ``torch.distributed`` is initialized, then the worker's, as torch shards its datapipes.
    Outside torch's workers: none (conveyor's services shard explicitly)."""
    info = torch_worker_info()
    if info is None:
        return []
    levels = []
    dist = getattr(loaded_torch(), "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        levels.append((dist.get_world_size(), dist.get_rank()))
    levels.append((info.num_workers, info.id))  # type: ignore[attr-defined]
    return levels


def _past_handed_out(handed_out: HandedOut | None) -> int:
    """A position past every member of ``handed_out``'s runs (a huge one if a run has no end)."""
    if handed_out is None or any(stop is None for _, stop, _ in handed_out.runs):
        return MAX_COUNTER
    return max((stop for _, stop, _ in handed_out.runs if stop is not None), default=0)


class IndexedPass(Pass):
    """A pass whose items can be read by position without the ones before (random access
    read in index order): a sharding point right after it reads only its own shard's
    items (:meth:`read_at`, in increasing positions) instead of loading every item to
    drop most of them. Its state then is what iterating up to the same item leaves."""

    def read_at(self, position: int) -> Any:
        raise NotImplementedError

    def end(self) -> None:
        """Record the pass as read to its end."""
        raise NotImplementedError

    def length(self) -> int:
        raise NotImplementedError


class ShardingFilterPass(Pass):
    """``read``: items read from the input (the position of the next one); ``skip_below``:
    positions below it are not yielded (a resume on another worker count sets it);
    ``handed_out``: positions above it that an earlier job handed out (an elastic resume
    sets it, see :mod:`conveyor.core.handed_out`), not yielded either. Only the positions left
    are split between shards, by the same arithmetic."""

    def __init__(self, pipe: ShardingFilter, state: State | None, context: PassContext):
        super().__init__(pipe, context)
        self.source = context.open(pipe.source, state["source"] if state is not None else None)
        self.read = state["position"] if state is not None else 0
        self.skip_below = state["skip_below"] if state is not None else 0
        runs = state.get("handed_out") if state is not None else None
        self.handed_out = HandedOut(0, tuple(tuple(run) for run in runs)) if runs else None
        self._last: Position | None = None
        self.count = 0  # items kept
        levels = [level for level in pipe.sharding or _torch_worker_levels() if level[0] > 1]
        if levels and isinstance(self.source, IndexedPass):
            self.items = self._read_own_positions(self.source, levels)
        else:
            self.items = self._filter(levels)

    def _filter(self, levels: list[tuple[int, int]]) -> Iterator[Any]:
        position, skip_below, handed_out = self.read, self.skip_below, self.handed_out
        past = _past_handed_out(handed_out)
        for item in self.source:
            index = position
            position += 1
            if handed_out is not None and index >= past:
                handed_out = None  # no run reaches this far
            keep = index >= skip_below and (handed_out is None or index not in handed_out)
            for num_shards, shard_index in levels if keep else ():
                if index % num_shards != shard_index:
                    keep = False
                    break
                index //= num_shards
            if keep:
                self.read = position
                self._last = (position - 1,)
                self.count += 1
                yield item
        self.read = position

    def _read_own_positions(self, source: IndexedPass, levels: list[tuple[int, int]]) -> Iterator[Any]:
        """The same items and states as reading every item and keeping this shard's, but
        reading only those: nested levels keep the positions ``offset + k * stride``."""
        stride, offset = 1, 0
        for num_shards, shard_index in levels:
            offset += shard_index * stride
            stride *= num_shards
        start = self.read
        first = max(start, self.skip_below)
        first += (offset - first) % stride
        length = source.length()
        positions: Iterator[int] = iter(range(first, length, stride))
        handed_out = self.handed_out
        if handed_out is not None:
            positions = (p for p in positions if p not in handed_out)
        positions, reads = itertools.tee(positions)
        items: Iterator[Any] = map(source.read_at, reads)
        if self.context.meters is not None and id(source.pipe) in self.context.meters:
            items = self.context.meters[id(source.pipe)].count(items)  # the source is charged for its reads
        for kept, item in zip(positions, items, strict=True):
            self.read = kept + 1
            self._last = (kept,)
            self.count += 1
            yield item
        source.end()
        self.read = max(start, length)

    def state(self) -> State:
        state = {"position": self.read, "skip_below": self.skip_below, "source": self.source.state()}
        if self.handed_out is not None:
            state["handed_out"] = [list(run) for run in self.handed_out.runs]
        return state

    def position(self) -> Position | None:
        return self._last

    def yielded(self) -> int:
        return self.count

    def inputs(self) -> list[Pass]:
        return [self.source]


class ShardingFilter(IterDataPipe, ShardingPoint):
    """Keeps the items of this shard. Sharding levels nest (see ``SHARDING_PRIORITIES``):
    at each level with ``n`` shards, position ``i`` is kept if ``i % n`` is this shard's
    index, and ``i // n`` is the position seen by the next level. With no sharding
    applied, every item passes. The position of each item here keys the randomness of
    the random ops after it.

    Args:
        source: The pipe whose items are split among shards.
    """

    per_item = True
    keeps_order = True
    pass_type = ShardingFilterPass
    #: Plus ``"handed_out"`` (runs ``[start, stop or null, step]``) in a state resumed
    #: elastically; states without it (all others) are unchanged.
    state_fields = {"position": int, "skip_below": int, "source": dict}
    #: What added it, when it is a source's own split (:func:`own_split`), not the user's.
    _own_split_of: str | None = None

    def __init__(self, source: IterDataPipe):
        self.source = source
        self._levels: dict[int, tuple[int, int]] = {}

    def apply_sharding(self, num_of_instances: int, instance_id: int, sharding_group: Any = 0) -> None:
        check_share(num_of_instances, instance_id)
        self._levels[sharding_level(sharding_group)] = (num_of_instances, instance_id)

    def check_state(self, state: Any, where: str = "") -> None:
        where = where or repr(self)
        if type(state) is dict and "handed_out" in state:
            runs = state["handed_out"]
            HandedOut.from_state({"below": 0, "runs": runs}, f"{where} handed_out")
            state = {key: value for key, value in state.items() if key != "handed_out"}
        super().check_state(state, where)

    @property
    def sharding(self) -> list[tuple[int, int]]:
        """``(num_shards, shard_index)`` per level, outermost first."""
        return [self._levels[p] for p in sorted(self._levels)]

    def __len__(self) -> int:
        length = len(self.source)
        for num_shards, shard_index in self.sharding:
            length = max(0, -(-(length - shard_index) // num_shards))
        return length


@IterDataPipe.register_functional("sharding_filter", builds=ShardingFilter)
def sharding_filter(self: IterDataPipe[T]) -> IterDataPipe[T]:
    """Keeps this shard's items: where a loader splits the items among ranks and workers.

    With ``n`` shards, the item at position ``i`` here goes to shard ``i % n``. Put it
    after the cheap steps that every shard must see (listing, shuffling file names) and
    before the costly ones. With no sharding applied every item passes.

    Returns:
        A pipe of this shard's items.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> shard = IterableWrapper(range(6)).sharding_filter()
        >>> shard.apply_sharding(2, 1)
        >>> list(shard)
        [1, 3, 5]
    """
    return ShardingFilter(self)


def own_split(source: IterDataPipe, made_by: str) -> ShardingFilter:
    """A ``sharding_filter()`` after ``source`` that a source or a loader adds to split its
    own work (``load_parquet`` its row groups, ``DataLoader2`` a map-style source's
    indices), not one the user wrote: it yields to a sharding point the user puts
    downstream (see :mod:`conveyor.core.sharding_points`). ``made_by`` names it in messages,
    as the user would recognise it (``"load_parquet()'s own split of its row groups"``)."""
    split = ShardingFilter(source)
    # Private, so not part of the pipe's repr or fingerprint: graphs that keep their own
    # split keep the fingerprint (and the states) they had before splits could yield.
    split._own_split_of = made_by
    return split


def own_split_of(node: Any) -> str | None:
    """What made ``node``, if it is a source's own split (:func:`own_split`); else None."""
    return node._own_split_of if isinstance(node, ShardingFilter) else None
