"""``max_token_bucketize``: batches of items of similar length whose total length (with
``include_padding``, the batch's size times its longest item) stays within
``max_token_count`` (torchdata's op and arguments).

Items wait in a heap of ``buffer_size``; the shortest leaves first into the batch being
filled, which leaves when the next item would overflow it. Ties in length leave in the
order the items came (torchdata's heap left them in an order its history decided).

Resume without saving items (:mod:`conveyor.pipes.held_items`): the items held (in the
heap and in the batch being filled) are named by their offsets from the oldest of them,
and the state is the input's state before that oldest item, the items read since, and
those offsets. A resume re-reads the input from there and holds again the items named.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from conveyor.core.base import IterDataPipe
from conveyor.core.passes import Pass, PassContext, Position, State
from conveyor.core.skips import call_noted
from conveyor.core.validation import check_int
from conveyor.errors import StateError
from conveyor.pipes.held_items import HeldItems

T = TypeVar("T")


class MaxTokenBucketizerPass(Pass):
    def __init__(self, pipe: MaxTokenBucketizer, state: State | None, context: PassContext):
        super().__init__(pipe, context)
        self.source = context.open(pipe.source, state["source"] if state is not None else None)
        self._held = HeldItems(self.source, pipe)  # the items in the heap and in the batch
        self._heap: list[tuple[int, int, Any]] = []  # (length, index, item)
        self._batch: list[tuple[int, int, Any]] = []  # (length, index, item), in the batch's order
        self.count = 0
        self.items = self._bucketize(pipe, state)

    def _replay(self, pipe: MaxTokenBucketizer, state: State) -> None:
        """Read the items since the anchor again and put those named back in the heap and the batch."""
        held, in_batch = self._held, {offset: k for k, offset in enumerate(state["batch"])}
        batch: list[tuple[int, int, Any] | None] = [None] * len(in_batch)
        for index, item in held.replay(state["read"], [*state["heap"], *state["batch"]]):
            if index in held:
                entry = (call_noted(pipe, pipe.len_fn, item), index, item)
                if index in in_batch:
                    batch[in_batch[index]] = entry
                else:
                    heapq.heappush(self._heap, entry)
        self._batch = [entry for entry in batch if entry is not None]

    def _bucketize(self, pipe: MaxTokenBucketizer, state: State | None) -> Iterator[list[Any]]:
        if state is not None:
            self._replay(pipe, state)
        source, held, heap = self.source, self._held, self._heap
        befores = held.befores
        while True:
            before = source.state()
            item = next(source.items, _END)
            if item is _END:
                break
            length = call_noted(pipe, pipe.len_fn, item)
            index = held.count
            held.count = index + 1
            if not pipe.min_len <= length <= pipe.max_len:
                continue
            befores[index] = before
            heapq.heappush(heap, (length, index, item))
            if len(heap) == pipe.buffer_size:
                full = self._take_shortest(pipe)
                if full is not None:
                    yield full
        while heap:
            full = self._take_shortest(pipe)
            if full is not None:
                yield full
        if self._batch:
            yield self._leave(len(self._batch))

    def _take_shortest(self, pipe: MaxTokenBucketizer) -> list[Any] | None:
        """Move the shortest item into the batch; the batch before it, if it would overflow."""
        entry = heapq.heappop(self._heap)
        length = entry[0]
        lengths = [length, *(e[0] for e in self._batch)]
        size = len(lengths) * max(lengths) if pipe.include_padding else sum(lengths)
        overflow, count = size > pipe.max_token_count, len(self._batch)
        self._batch.append(entry)
        return self._leave(count) if overflow else None

    def _leave(self, count: int) -> list[Any]:
        """The batch's first ``count`` items leave."""
        leaving, self._batch = self._batch[:count], self._batch[count:]
        befores = self._held.befores
        for _, index, _ in leaving:
            del befores[index]
        self.count += 1
        return [item for _, _, item in leaving]

    def state(self) -> State:
        held = self._held
        oldest = held.oldest()
        return {
            "read": held.read(),
            "heap": sorted(index - oldest for _, index, _ in self._heap),
            "batch": [index - oldest for _, index, _ in self._batch],
            "source": held.anchor(),
        }

    def position(self) -> Position | None:
        return None  # a batch gathers items from many positions

    def yielded(self) -> int:
        return self.count

    def inputs(self) -> list[Pass]:
        return [self.source]


_END = object()


def _default_len(item: Any) -> int:
    return len(item)


class MaxTokenBucketizer(IterDataPipe):
    """Batches of items of similar ``len_fn(item)`` within ``max_token_count`` in all (see
    the module); items outside ``[min_len, max_len]`` are left out."""

    replays_input = True
    pass_type = MaxTokenBucketizerPass
    state_fields = {"read": int, "heap": list, "batch": list, "source": dict}
    _params = ("max_token_count", "len_fn", "min_len", "max_len", "buffer_size", "include_padding")

    def __init__(
        self,
        source: IterDataPipe,
        max_token_count: int,
        len_fn: Callable[[Any], int] = _default_len,
        min_len: int = 0,
        max_len: int | None = None,
        buffer_size: int = 1000,
        include_padding: bool = False,
    ):
        check_int("max_token_count", max_token_count, 1)
        check_int("buffer_size", buffer_size, 1)
        if not callable(len_fn):
            raise TypeError(f"max_token_bucketize: len_fn must be callable, got {type(len_fn).__name__}")
        max_len = max_token_count if max_len is None else max_len
        check_int("min_len", min_len, 0)
        check_int("max_len", max_len, 0)
        if min_len > max_len:
            raise ValueError(f"max_token_bucketize: min_len ({min_len}) must be <= max_len ({max_len})")
        if max_len > max_token_count:
            raise ValueError(f"max_token_bucketize: max_len ({max_len}) must be <= max_token_count ({max_token_count})")
        self.source = source
        self.max_token_count = max_token_count
        self.len_fn = len_fn
        self.min_len = min_len
        self.max_len = max_len
        self.buffer_size = buffer_size
        self.include_padding = include_padding

    def check_own_state(self, state: Mapping[str, Any], where: str) -> None:
        offsets = [*state["heap"], *state["batch"]]
        if not all(type(o) is int and 0 <= o < max(state["read"], 1) for o in offsets) or len(set(offsets)) != len(
            offsets
        ):
            raise StateError(f"{where}: 'heap' and 'batch' must be distinct offsets below 'read'")


@IterDataPipe.register_functional("max_token_bucketize", builds=MaxTokenBucketizer)
def max_token_bucketize(
    self: IterDataPipe[T],
    max_token_count: int,
    len_fn: Callable[[T], int] = _default_len,
    min_len: int = 0,
    max_len: int | None = None,
    buffer_size: int = 1000,
    include_padding: bool = False,
) -> IterDataPipe[list[T]]:
    """Batches items of similar length so that each batch holds at most ``max_token_count``.

    Items wait in a pool of ``buffer_size``; the shortest leave first, into a batch that
    leaves when the next would overflow it (torchdata's op and arguments).

    Args:
        max_token_count: The most tokens a batch may hold.
        len_fn: Called with each item; returns its length in tokens (default: ``len``).
        min_len: Shorter items are left out.
        max_len: Longer items are left out; None: no bound but ``max_token_count``.
        buffer_size: How many items wait to be sorted into batches.
        include_padding: Count a batch as its size times its longest item.

    Returns:
        A pipe of batches (lists of items). It has no ``len()``.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> list(IterableWrapper(["aaa", "b", "cc", "dddd"]).max_token_bucketize(5))
        [['b', 'cc'], ['aaa'], ['dddd']]
    """
    return MaxTokenBucketizer(self, max_token_count, len_fn, min_len, max_len, buffer_size, include_padding)
