"""One epoch of a ``DataLoader2``: what the loader opens at ``iter()`` and its iterator reads.

The loader makes an :class:`Epoch` (its items, its pass over the graph, the profiler of its
pulls, its skip ledger, the items handed out) and keeps it to save states from; the
iterator (:mod:`conveyor.loader.epoch_iterator`) holds it and tells it when its items end, fail,
or run out before the first one of a resumed epoch (which then rolls over into the next
epoch). The epoch reaches the loader only through the callbacks the loader gave it, which
hold the loader weakly: the loader holds its epoch, and a loader dropped mid-epoch must
end at once (its finalizer closes the epoch's pass), not wait for the garbage collector.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from conveyor.core.base import IterDataPipe
from conveyor.core.error_budget import ErrorBudget, SkipLedger
from conveyor.core.passes import Pass, PassContext, State, pause_tree
from conveyor.core.read_ahead import close_iterator
from conveyor.observe.pull_profiler import PullProfiler
from conveyor.reading_service.interface import ReadingServiceInterface


class Epoch:
    """One epoch of a loader, from its ``iter()`` to the next one.

    :attr:`live` is False once the loader moved on (a newer ``iter()``, a
    ``load_state_dict()``, ``shutdown()``): an iterator of a dead epoch is invalid.
    """

    def __init__(
        self,
        generation: int,
        service: ReadingServiceInterface,
        *,
        ended: Callable[[Epoch], None],
        failed: Callable[[Epoch], None],
        begin_next: Callable[[], Epoch],
    ) -> None:
        #: The loader's count of epochs opened and states loaded, when this one was opened.
        self.generation = generation
        self.live = True
        #: The epoch's items: its pass's generator, or the iterator a service handed back.
        self.items: Iterator[Any] | None = None
        #: The epoch's pass over the graph, when the service reads a conveyor pipe.
        self.opened: Pass | None = None
        #: ``on_error="skip"``: the epoch's skipped items (kept after the epoch ends).
        self.ledger: SkipLedger | None = None
        #: Times a sample of the pulls (``collect_stats=True`` over a conveyor pipe).
        self.profiler: PullProfiler | None = None
        #: Items handed out: those of a resumed epoch before its state was taken first ...
        self.first_item = 0
        #: ... and all of them so far.
        self.handed_out = 0
        #: Whether this epoch, resumed from a state taken after its last item, goes on into
        #: the next epoch when it ends before its first item (as the uninterrupted loader's
        #: next ``iter()`` would: trainers call ``iter()`` once per epoch).
        self.rolls_over = False
        self._service = service
        self._ended, self._failed, self._begin_next = ended, failed, begin_next
        self._released = False

    def open(
        self,
        datapipe: Any,
        pipeline: State | None,
        context: PassContext,
        budget: ErrorBudget | None,
        skipped: list[Any],
    ) -> None:
        """Open the epoch's items: a pass over ``datapipe`` (from ``pipeline``, checked
        against it) in ``context``, with a skip ledger under a ``budget``; or, for a
        service that hands back another kind of iterable, its iterator."""
        if isinstance(datapipe, IterDataPipe):
            if budget is not None:
                self.ledger = SkipLedger(budget, _handed_out(weakref.ref(self)), skipped)
                context = context.with_skips(self.ledger)
            self.opened = datapipe.open(pipeline, context)
            self.items = self.opened.items
        else:
            self.items = iter(datapipe)

    def check_budget(self) -> None:
        """At the end of its items: raise :class:`~conveyor.errors.SkipBudgetError` if the
        epoch skipped more than its budget (a fraction counts every item it saw)."""
        if self.ledger is not None and self.live:
            self.ledger.check(at_end=True)

    def end(self) -> None:
        """The epoch's items ended (its budget checked): the loader closes it."""
        self._ended(self)

    def fail(self) -> bool:
        """The epoch's items raised: the loader closes its pass (its state stays readable).
        False when the loader had moved on already (shut down while it was read)."""
        if not self.live:
            return False
        self._failed(self)
        return True

    def begin_next(self) -> Epoch:
        """The loader's next epoch, begun in this one's place (a roll-over)."""
        return self._begin_next()

    def set_paused(self, paused: bool) -> None:
        """Tell the reading service (it may stop reading ahead), then the pass's ``prefetch``
        threads, to stop reading ahead (``True``) or to go on."""
        if paused:
            self._service.pause_iteration()
        else:
            self._service.resume_iteration()
        pause_tree(self.opened, paused)

    def release(self) -> Pass | None:
        """The loader lets go of the epoch's items and pass (returned, still open), and
        :meth:`close` has nothing left to do; the ledger stays (``stats()`` reads it). The
        iterator keeps its own reference to the items: the loader must not keep what a
        service handed back (a torch DataLoader's iterator and its workers) past the end."""
        opened, self.items, self.opened = self.opened, None, None
        self._released = True
        return opened

    def close(self) -> None:
        """End the epoch's pass now, stopping any threads it runs (or close the iterator a
        service handed back), unless the loader let go of it already."""
        if self._released:
            return
        items = self.items
        opened = self.release()
        # ValueError: it is running in another thread (shutdown() from a watchdog); that
        # thread's call ends with an error once the service is finalized.
        with contextlib.suppress(ValueError):
            if opened is not None:
                opened.close()
            else:
                close_iterator(items)


def _handed_out(epoch: weakref.ref[Epoch]) -> Callable[[], int]:
    """Items the epoch handed out (read through a weak reference: the epoch's skip ledger
    lives in its pass tree, which the epoch holds)."""

    def items() -> int:
        alive = epoch()
        return alive.handed_out if alive is not None else 0

    return items


def weakly(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` (a bound method) called through a weak reference to its object: an
    epoch's callbacks must not keep its loader alive. Once the loader is gone, a call
    does nothing."""
    ref = weakref.WeakMethod(method)

    def call(*args: Any) -> Any:
        bound = ref()
        return bound(*args) if bound is not None else None

    return call


def close_all(passes: list[Pass]) -> None:
    """Close passes a dropped loader left open (from its finalizer, in whatever thread)."""
    for opened in passes:
        with contextlib.suppress(ValueError):  # running in another thread: it ends on its own
            opened.close()
    passes.clear()
