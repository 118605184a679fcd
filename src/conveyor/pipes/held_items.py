"""Items of an input held by a pass, named by their offset from the oldest one.

``groupby``, ``max_token_bucketize``, ``zip_with_iter`` (its reference input) and
``shuffled_flatmap`` hold some of their input's items for a while, and resume *by
replay*, saving no item: the state names the input's state before the oldest item still
held (the *anchor*), the items read since, and the offsets from the anchor of the items
held. A resume opens the input at the anchor, reads those items again and holds again the
ones named.

:class:`HeldItems` keeps that bookkeeping; each op keeps only its own logic (which items
it holds, and when they leave). Items are named by their index in the pass, which never
changes, so an item leaving costs a ``del`` and nothing is shifted; the anchor and the
offsets are derived only when a state is asked for.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from conveyor.core.passes import Pass, State
from conveyor.errors import StateError

if TYPE_CHECKING:
    from conveyor.core.base import IterDataPipe


class HeldItems:
    """The items of ``source`` that a pass over ``owner`` holds (``what`` names ``source``
    in errors).

    The op updates the two fields itself, inline where it reads, so that holding costs no
    call per item:

    - :attr:`count`: the items read from ``source`` in this pass, so the index of the next
      one (counted from where the pass opened its input: the anchor, on a resume);
    - :attr:`befores`: each held item's index -> ``source``'s state before that item, in the
      order read (an item is held as it is read, ``befores[count] = before``, and leaves
      with ``del befores[index]``; the dict is changed in place, never replaced).
    """

    __slots__ = ("_owner", "_source", "_what", "befores", "count")

    def __init__(self, source: Pass, owner: IterDataPipe, what: str = "input") -> None:
        self._source = source
        self._owner = owner
        self._what = what
        self.count = 0
        self.befores: dict[int, State] = {}

    def __contains__(self, index: int) -> bool:
        return index in self.befores

    def anchor(self) -> State:
        """The input's state before the oldest item held; its current state when none is."""
        befores = self.befores
        return befores[next(iter(befores))] if befores else self._source.state()

    def read(self) -> int:
        """The items read since the anchor (0 when none is held)."""
        befores = self.befores
        return self.count - next(iter(befores)) if befores else 0

    def oldest(self) -> int:
        """The index offsets count from: the oldest held item's (the next item's when none is
        held). The first index in :attr:`befores` is the oldest, as items are held as read."""
        befores = self.befores
        return next(iter(befores)) if befores else self.count

    def offsets(self) -> list[int]:
        """The offsets of every item held, oldest first."""
        oldest = self.oldest()
        return [index - oldest for index in self.befores]

    def replay(self, read: int, offsets: Iterable[int]) -> Iterator[tuple[int, Any]]:
        """On a resume, with the input opened at the anchor: read the ``read`` items since
        it again, hold again those at ``offsets``, and yield each item read with its index
        (its offset). With nothing to hold, nothing is read. A :class:`StateError` if the
        input ends first."""
        wanted = set(offsets)
        if not wanted:
            return
        source, befores = self._source, self.befores
        for index in range(read):
            before = source.state()
            item = next(source.items, _END)
            if item is _END:
                raise StateError(
                    f"{self._owner!r}: the {self._what} ended {read - index} items before the resumed position"
                )
            if index in wanted:
                befores[index] = before
            self.count = index + 1
            yield index, item


_END = object()
