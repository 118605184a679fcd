"""Arrays a worker makes directly in its ring, so that they travel without a copy.

:func:`conveyor.shared_empty` (and ``batch().collate()``, ``conveyor.DataLoader``'s
default collate) ask the worker's :class:`InPlaceArrays` for memory: it claims pages of
the ring (:meth:`~conveyor.workers.transport.ring.ShmRing.claim`) and gives a writable
array over them. When an item carrying that array is encoded, the encoder finds the
array's pages by its address (:meth:`take`) and sends their place instead of copying
them: the main process leases the very pages the worker wrote, as it leases any buffer
from the ring.

Ownership: the pages are the worker's from the claim until the item that carries them
is encoded, then the main process's (until the user's last reference goes). An array
that is never sent (the item was filtered out, or an error dropped it) gives its pages
back when the worker's last reference to it goes: its weak reference's callback queues
them, and the next claim (always on the worker's thread) frees them, so the ring's
claim bytes keep one writer. A buffer sent once is the main process's: the worker must
not write to it again (it would write to what the user holds), as with torch's
shared-memory tensors.
"""

from __future__ import annotations

import weakref
from typing import NamedTuple

import numpy as np

from conveyor.workers.transport.ring import ShmRing


class _Made(NamedTuple):
    """An array made in the ring and not yet sent (kept by its first page): its size, and
    a weak reference to it."""

    nbytes: int
    reference: weakref.ref[np.ndarray]


class InPlaceArrays:
    """A worker's arrays made in its ring and not sent yet, by the page they start at.

    Args:
        ring: The worker's ring.
        min_bytes: Smaller requests get no pages (an ordinary array serves them: such
            buffers travel inside the pickle stream anyway).
    """

    def __init__(self, ring: ShmRing, min_bytes: int):
        self._ring = ring
        self._min_bytes = min_bytes
        self._made: dict[int, _Made] = {}
        # Arrays whose last reference went, (page, their reference): the next claim frees
        # the pages of those that were never sent.
        self._dropped: list[tuple[int, weakref.ref[np.ndarray]]] = []

    def allocate(self, nbytes: int) -> np.ndarray | None:
        """A writable uint8 array of ``nbytes`` bytes over claimed pages of the ring, or None
        (too small, or no run of free pages long enough: make an ordinary array)."""
        self._free_dropped()
        if nbytes < self._min_bytes:
            return None
        page = self._ring.claim(nbytes)
        if page is None:
            return None
        array = self._ring.claimed_array(page, nbytes)
        dropped = self._dropped  # the callback may run on any thread: it only appends
        self._made[page] = _Made(nbytes, weakref.ref(array, lambda gone: dropped.append((page, gone))))
        return array

    def take(self, address: int, nbytes: int) -> tuple[int, int] | None:
        """The ring place ``(first page, length)`` of a buffer at ``address`` that is an
        array made here, which from now on is the encoder's to send (or to give back);
        None for any other buffer (it is copied as usual)."""
        if not self._made:
            return None
        page = self._ring.page_of(address)
        if page is None:
            return None
        made = self._made.get(page)
        if made is None or made.nbytes != nbytes:  # a part of such an array is copied
            return None
        del self._made[page]
        return page, nbytes

    def pending(self) -> int:
        """Arrays made here and neither sent nor given back yet."""
        return len(self._made)

    def _free_dropped(self) -> None:
        while self._dropped:
            page, reference = self._dropped.pop()
            made = self._made.get(page)
            if made is not None and made.reference is reference:  # never sent: the pages are ours
                del self._made[page]
                self._ring.unclaim(page, made.nbytes)

    def close(self) -> None:
        """Forget every array not sent (the ring is being unmapped)."""
        self._made.clear()
        self._dropped.clear()
