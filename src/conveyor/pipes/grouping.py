"""``groupby``: items gathered into groups by key (torch's and torchdata's ``Grouper``,
same arguments and order of groups).

A group leaves when it reaches ``group_size``; when ``buffer_size`` items are held, the
biggest group leaves (or is dropped, or is an error, below ``guaranteed_group_size``);
at the end, every group left, oldest key first.

Resume without saving items (:mod:`conveyor.pipes.held_items`): the buffer is a function
of the input read so far. It holds, for each key in it, every item of that key read since
the key's group last left. So the state is the input's state from before the oldest item
still held (the *anchor*), the items read since, and the offsets (from the anchor) of each
held key's first item. A resume reads the input again from the anchor and puts back
exactly the items that were held: an item of a key from its first offset on. It re-reads
at most the items since the oldest one held.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import Any, Literal, TypeVar, overload

from conveyor.core.base import IterDataPipe
from conveyor.core.passes import Pass, PassContext, Position, State
from conveyor.core.skips import call_noted
from conveyor.core.validation import check_int
from conveyor.errors import StateError
from conveyor.pipes.held_items import HeldItems

K = TypeVar("K")
T = TypeVar("T")


class GrouperPass(Pass):
    def __init__(self, pipe: Grouper, state: State | None, context: PassContext):
        super().__init__(pipe, context)
        self.source = context.open(pipe.source, state["source"] if state is not None else None)
        self._held = HeldItems(self.source, pipe)  # each key's first item held (a resume finds the rest by key)
        self._groups: dict[Any, list[Any]] = {}  # key -> its items held
        self._firsts: dict[Any, int] = {}  # key -> the index of its first item held
        self._size = 0
        self.count = 0
        self.items = self._group(pipe, state)

    def _replay(self, pipe: Grouper, state: State) -> None:
        """Read the items since the anchor again and hold what was held."""
        held, groups = self._held, self._groups
        for index, item in held.replay(state["read"], state["firsts"]):
            key = call_noted(pipe, pipe.group_key_fn, item)
            if index in held:
                self._firsts[key], groups[key] = index, []
            if key in groups:
                groups[key].append(item)
                self._size += 1

    def _group(self, pipe: Grouper, state: State | None) -> Iterator[Any]:
        if state is not None:
            self._replay(pipe, state)
        source, held, groups = self.source, self._held, self._groups
        befores = held.befores
        while True:
            before = source.state()
            item = next(source.items, _END)
            if item is _END:
                break
            key = call_noted(pipe, pipe.group_key_fn, item)
            if key not in groups:
                groups[key], self._firsts[key] = [], held.count
                befores[held.count] = before
            groups[key].append(item)
            held.count += 1
            self._size += 1
            if pipe.group_size is not None and len(groups[key]) == pipe.group_size:
                yield self._leave(pipe, key)
            if self._size == pipe.buffer_size:
                biggest = max(groups, key=lambda k: len(groups[k]))  # the first of the biggest
                if pipe.guaranteed_group_size is not None and len(groups[biggest]) < pipe.guaranteed_group_size:
                    if not pipe.drop_remaining:
                        raise RuntimeError(
                            f"{pipe!r}: the buffer is full ({pipe.buffer_size} items) and its biggest group has "
                            f"{len(groups[biggest])} items, fewer than guaranteed_group_size="
                            f"{pipe.guaranteed_group_size}; raise buffer_size or set drop_remaining=True"
                        )
                    self._drop(biggest)
                else:
                    yield self._leave(pipe, biggest)
        while groups:
            yield self._leave(pipe, next(iter(groups)))

    def _drop(self, key: Any) -> list[Any]:
        group = self._groups.pop(key)
        del self._held.befores[self._firsts.pop(key)]
        self._size -= len(group)
        return group

    def _leave(self, pipe: Grouper, key: Any) -> Any:
        group = self._drop(key)
        self.count += 1
        return (key, group) if pipe.keep_key else group

    def state(self) -> State:
        held = self._held
        return {"read": held.read(), "firsts": held.offsets(), "source": held.anchor()}

    def position(self) -> Position | None:
        return None  # a group gathers items from many positions

    def yielded(self) -> int:
        return self.count

    def inputs(self) -> list[Pass]:
        return [self.source]


_END = object()


class Grouper(IterDataPipe):
    """Lists of items with the same ``group_key_fn(item)`` (``(key, list)`` with
    ``keep_key``), as torch's ``groupby`` forms them (see the module)."""

    replays_input = True
    pass_type = GrouperPass
    state_fields = {"read": int, "firsts": list, "source": dict}
    _params = ("group_key_fn", "keep_key", "buffer_size", "group_size", "guaranteed_group_size", "drop_remaining")

    def __init__(
        self,
        source: IterDataPipe,
        group_key_fn: Callable[[Any], Any],
        *,
        keep_key: bool = False,
        buffer_size: int = 10000,
        group_size: int | None = None,
        guaranteed_group_size: int | None = None,
        drop_remaining: bool = False,
    ):
        if not callable(group_key_fn):
            raise TypeError(f"groupby() needs a callable group_key_fn, got {type(group_key_fn).__name__}")
        check_int("buffer_size", buffer_size, 1)
        check_int("group_size", group_size, 1, allow_none=True)
        check_int("guaranteed_group_size", guaranteed_group_size, 1, allow_none=True)
        if group_size is not None and group_size > buffer_size:
            raise ValueError(f"groupby: group_size ({group_size}) must be <= buffer_size ({buffer_size})")
        if guaranteed_group_size is not None and (group_size is None or guaranteed_group_size > group_size):
            raise ValueError("groupby: guaranteed_group_size needs group_size, and must be <= it")
        self.source = source
        self.group_key_fn = group_key_fn
        self.keep_key = keep_key
        self.buffer_size = buffer_size
        self.group_size = group_size
        # As torch's: a group_size guarantees whole groups unless told otherwise.
        self.guaranteed_group_size = guaranteed_group_size if guaranteed_group_size is not None else group_size
        self.drop_remaining = drop_remaining

    def check_own_state(self, state: Mapping[str, Any], where: str) -> None:
        firsts = state["firsts"]
        if not all(type(f) is int for f in firsts) or firsts != sorted(set(firsts)):
            raise StateError(f"{where}: 'firsts' must be increasing ints")
        if firsts and (firsts[0] != 0 or firsts[-1] >= state["read"]):
            raise StateError(f"{where}: 'firsts' must start at 0 and stay below 'read'")


@overload
def groupby(
    self: IterDataPipe[T],
    group_key_fn: Callable[[T], Hashable],
    *,
    keep_key: Literal[False] = False,
    buffer_size: int = 10000,
    group_size: int | None = None,
    guaranteed_group_size: int | None = None,
    drop_remaining: bool = False,
) -> IterDataPipe[list[T]]: ...
@overload
def groupby(
    self: IterDataPipe[T],
    group_key_fn: Callable[[T], K],
    *,
    keep_key: Literal[True],
    buffer_size: int = 10000,
    group_size: int | None = None,
    guaranteed_group_size: int | None = None,
    drop_remaining: bool = False,
) -> IterDataPipe[tuple[K, list[T]]]: ...
@IterDataPipe.register_functional("groupby", builds=Grouper)
def groupby(
    self: IterDataPipe[Any],
    group_key_fn: Callable[[Any], Any],
    *,
    keep_key: bool = False,
    buffer_size: int = 10000,
    group_size: int | None = None,
    guaranteed_group_size: int | None = None,
    drop_remaining: bool = False,
) -> IterDataPipe[Any]:
    """Gathers the items into lists by key, as torch's ``groupby`` does.

    A group leaves when it has ``group_size`` items; when ``buffer_size`` items are held,
    the biggest group leaves; at the end, every group left, oldest key first. A resume
    re-reads the input from the oldest item still held instead of saving items.

    Args:
        group_key_fn: Called with each item; returns its group's key.
        keep_key: Yield ``(key, group)`` instead of the group.
        buffer_size: How many items may be held in all.
        group_size: A group leaves when it has this many items; None: when the buffer is
            full or the input ends.
        guaranteed_group_size: A smaller group leaving (buffer full, or at the end) is
            dropped, or an error unless ``drop_remaining``; defaults to ``group_size``.
        drop_remaining: Drop such smaller groups instead of raising.

    Returns:
        A pipe of groups (lists of items), or of ``(key, group)`` with ``keep_key``.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> list(IterableWrapper(range(6)).groupby(lambda x: x % 2, group_size=3))
        [[0, 2, 4], [1, 3, 5]]
        >>> list(IterableWrapper("abA").groupby(str.lower, keep_key=True))
        [('a', ['a', 'A']), ('b', ['b'])]
    """
    return Grouper(
        self,
        group_key_fn,
        keep_key=keep_key,
        buffer_size=buffer_size,
        group_size=group_size,
        guaranteed_group_size=guaranteed_group_size,
        drop_remaining=drop_remaining,
    )


def bucketbatch(
    source: IterDataPipe[T],
    batch_size: int,
    drop_last: bool = False,
    batch_num: int = 100,
    bucket_num: int = 1,
    sort_key: Callable[[list[T]], list[T]] | None = None,
    use_in_batch_shuffle: bool = True,
) -> IterDataPipe[list[T]]:
    """Batches similar items together: shuffles, sorts in buckets by ``sort_key``, batches.

    torchdata's ``bucketbatch``, the same composition of ops: items are shuffled in
    pools of ``batch_size * batch_num * bucket_num``, sorted by ``sort_key`` in buckets
    of ``batch_size * batch_num``, batched, and the batches shuffled again among
    ``bucket_num``. Built of ops that each resume exactly, it resumes exactly.

    Args:
        source: The pipe of items (``pipe.bucketbatch(...)`` passes the pipe itself).
        batch_size: Items per batch.
        drop_last: Drop the last batch when it is shorter.
        batch_num: Batches per bucket.
        bucket_num: Buckets per pool shuffled together.
        sort_key: Called with a bucket (a list of items); returns it sorted. None: no
            sorting.
        use_in_batch_shuffle: Shuffle by ``in_batch_shuffle`` over whole pools (exact
            and random-access); else by ``shuffle`` windows.

    Returns:
        A pipe of batches (lists of items).

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> batches = IterableWrapper(range(8)).bucketbatch(2, batch_num=2, sort_key=sorted)
        >>> sorted(len(b) for b in batches)
        [2, 2, 2, 2]
    """
    for name, value in (("batch_size", batch_size), ("batch_num", batch_num), ("bucket_num", bucket_num)):
        check_int(name, value, 1)
    if sort_key is not None and not callable(sort_key):
        raise TypeError(f"bucketbatch: sort_key must be callable, got {type(sort_key).__name__}")
    bucket_size = batch_size * batch_num
    pool_size = bucket_size * bucket_num
    pipe = source
    if bucket_num > 1 or sort_key is None:
        if use_in_batch_shuffle:
            pipe = pipe.batch(pool_size).in_batch_shuffle().unbatch()
        else:
            pipe = pipe.shuffle(buffer_size=pool_size)
    if sort_key is not None:
        pipe = pipe.batch(bucket_size).map(sort_key).unbatch()
    batches = pipe.batch(batch_size, drop_last=drop_last)
    if sort_key is not None:
        if use_in_batch_shuffle:
            batches = batches.batch(bucket_num).in_batch_shuffle().unbatch()
        else:
            batches = batches.shuffle(buffer_size=bucket_size)
    return batches


IterDataPipe.register_functional("bucketbatch")(bucketbatch)  # a function: it composes ops
