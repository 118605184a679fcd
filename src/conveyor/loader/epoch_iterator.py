"""``DataLoader2Iterator``: one epoch of a ``DataLoader2``, as the user iterates it.

The iterator holds the :class:`~conveyor.loader.epoch.Epoch` the loader made (its items,
pass, profiler, counts and ledger) and tells it when its items end or fail; a resumed
epoch that ends before its first item rolls over into the next epoch, which the epoch
asks its loader for. Of the loader itself, the iterator reads only its public
``datapipe`` (attribute look-ups fall through to it, as in torchdata).

Per item it does as little as it can: the items come straight from the epoch pass's
generator, and every check that is not needed per item (the ``limit()`` pause, a sampled
pull for the statistics, the iterator's own end or failure) waits for a countdown of
"fast" pulls to run out.
"""

from __future__ import annotations

import time
import types
from collections.abc import Iterator
from typing import Any, Protocol

from conveyor.core.validation import check_int
from conveyor.errors import PauseIteration, SkipBudgetError
from conveyor.loader.epoch import Epoch


class Reads(Protocol):
    """What the iterator reads of its loader: the graph as the reading service built it."""

    datapipe: Any


_UNLIMITED = 1 << 62


class DataLoader2Iterator(Iterator[Any]):
    """One epoch of a ``DataLoader2``. A newer ``iter()`` invalidates it.

    ``limit(n)`` pauses it after ``n`` more items (``next`` raises ``StopIteration``
    without ending the epoch); ``resume()`` continues and the limit applies again from
    there, until ``limit(None)`` clears it.

    Args:
        loader: The loader whose epoch this is (``DataLoader2`` makes its iterators itself).
        epoch: The epoch it hands out the items of.
    """

    def __init__(self, loader: Reads, epoch: Epoch):
        # Kept alive by its iterator: the epoch reaches its loader only weakly.
        self._loader = loader
        self._epoch = epoch
        # The iterator's own reference: the loader lets go of the items when the epoch ends.
        assert epoch.items is not None  # an epoch is handed over open
        self._items: Iterator[Any] = epoch.items
        self._limit: int | None = None
        self._since_resume = 0  # items handed out since the last limit()/resume(), as of _account()
        self._paused = False  # pause() was called, or a limit reached: no item until resume()
        self._done = False
        self._failure: BaseException | None = None
        self._fast_left = 0  # pulls that need no check before the next slow one ...
        self._allotted = 0  # ... out of this many

    def __iter__(self) -> DataLoader2Iterator:
        return self

    def __getattr__(self, name: str) -> Any:
        """Attributes this iterator does not have are looked up, as torchdata does, on
        what it reads: the iterator a reading service handed back (when it is not a plain
        generator), else the graph's last pipe as the service built it."""
        if name.startswith("__") or "_loader" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        items = self.__dict__.get("_items")
        if items is not None and not isinstance(items, types.GeneratorType) and hasattr(items, name):
            return getattr(items, name)
        datapipe = self._loader.datapipe
        if datapipe is not None and hasattr(datapipe, name):
            return getattr(datapipe, name)
        raise AttributeError(
            f"{type(self).__name__!r} object has no attribute {name!r}, nor has the pipe it reads "
            f"({type(datapipe).__name__})"
        )

    def __next__(self) -> Any:
        epoch = self._epoch
        if not epoch.live:
            raise RuntimeError(
                "this iterator has been invalidated: a newer iter() on its DataLoader2, a "
                "load_state_dict() or shutdown() replaced it"
            )
        if self._fast_left:
            self._fast_left -= 1
            try:
                item = next(self._items)
            except BaseException as error:
                if self._rolled_over(error):
                    return self._next_slowly()
                self._ended(error)
                raise
            epoch.handed_out += 1
            return item
        return self._next_slowly()

    def _next_slowly(self) -> Any:
        """A pull after the countdown ran out: the checks, the pause, a sampled pull."""
        epoch = self._epoch
        self._account()
        if self._failure is not None:
            raise RuntimeError(
                "this epoch failed (see the error raised before); call iter() for a new epoch, or "
                "load_state_dict() a saved state (state_dict() still holds the last good position)"
            ) from self._failure
        if self._done:
            raise StopIteration
        if self._paused:  # paused stays paused until resume(), whatever limit() says
            raise PauseIteration("this epoch is paused; call resume() to continue it")
        if self._limit is not None and self._since_resume >= self._limit:
            self._pause_service()
            raise PauseIteration(f"this epoch paused after its limit of {self._limit} items; resume() continues it")
        profiler = epoch.profiler
        if profiler is not None and profiler.wants_back:
            profiler.back(time.perf_counter())
        sampled = profiler is not None and profiler.countdown <= 1
        try:
            item = profiler.pull(self._items, epoch.opened) if sampled else next(self._items)  # type: ignore[union-attr]
        except BaseException as error:
            if self._rolled_over(error):
                return self._next_slowly()
            self._ended(error)
            raise
        if profiler is not None and not sampled:
            profiler.countdown -= 1
        epoch.handed_out += 1
        self._since_resume += 1
        left = _UNLIMITED if self._limit is None else self._limit - self._since_resume
        if profiler is not None:
            # Right after a sample, the next pull tells when the consumer came back.
            left = min(left, 0 if profiler.wants_back else profiler.countdown - 1)
        self._fast_left = self._allotted = max(0, left)
        return item

    def _account(self) -> None:
        """Count the fast pulls made since the last slow one."""
        fast = self._allotted - self._fast_left
        self._allotted = self._fast_left = 0
        self._since_resume += fast
        if self._epoch.profiler is not None:
            self._epoch.profiler.countdown -= fast

    def _rolled_over(self, error: BaseException) -> bool:
        """Whether a resumed epoch that ended before its first item (its state was taken
        after its last one) was finished and the next epoch begun in its place."""
        epoch = self._epoch
        if not (
            epoch.rolls_over
            and isinstance(error, StopIteration)
            and epoch.live
            and epoch.handed_out == epoch.first_item
        ):
            return False
        epoch.rolls_over = False
        self._fast_left = self._allotted = 0
        self._finish_epoch()
        self._epoch = epoch.begin_next()
        assert self._epoch.items is not None  # begin_next() opens it
        self._items = self._epoch.items
        self._done = False
        return True

    def _finish_epoch(self) -> None:
        """The epoch's items ended: check its skip budget, then end it."""
        try:
            self._epoch.check_budget()
        except SkipBudgetError as over:
            self._ended(over)
            raise over from None
        self._done = True
        self._epoch.end()

    def _ended(self, error: BaseException) -> None:
        """The epoch's items ended (``StopIteration``) or failed; the caller re-raises."""
        self._fast_left = self._allotted = 0
        if isinstance(error, StopIteration):
            self._finish_epoch()
            return
        self._failure = error
        if not self._epoch.fail():
            raise RuntimeError("the DataLoader2 was shut down while this iterator was reading") from error

    def limit(self, num_items: int | None) -> DataLoader2Iterator:
        """Pause after ``num_items`` more items (``None``: no limit)."""
        check_int("num_items", num_items, 0, allow_none=True)
        self._account()
        self._limit = num_items
        self._since_resume = 0
        return self

    def pause(self) -> DataLoader2Iterator:
        """Stop handing out items: ``next()`` raises :class:`~conveyor.errors.PauseIteration`
        (a ``StopIteration``: a ``for`` loop ends) without ending the epoch, until
        :meth:`resume`. The reading service is told (it may stop reading ahead), and the
        graph's ``prefetch`` threads stop reading ahead."""
        self._account()
        self._pause_service()
        return self

    def resume(self) -> DataLoader2Iterator:
        """Continue after a pause; the limit (if any) counts again from here."""
        self._account()
        self._since_resume = 0
        if self._paused:
            self._paused = False
            self._epoch.set_paused(False)
        return self

    def _pause_service(self) -> None:
        if not self._paused:
            self._paused = True
            self._epoch.set_paused(True)  # prefetch threads in the graph stop reading ahead

    @property
    def paused(self) -> bool:
        """Whether ``next()`` would raise ``PauseIteration`` now (paused, or at the limit)."""
        self._account()
        return self._paused or (self._limit is not None and self._since_resume >= self._limit)
