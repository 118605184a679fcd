"""``fullsync``: every rank yields the same number of items per epoch, so none hangs.

Ranks rarely hold equal shares (23 items on 2 ranks), and a training step that runs a
collective on one rank but not on another hangs both. This op agrees on the epoch's end
without a collective per item: it reads a *window* of ``window`` items ahead, and all
ranks agree on the smallest and largest count read (one all-reduce per window, started
while the previous window is handed out, so its latency hides behind the consumer).

- ``epoch_end="drop"`` (the reference's FullSync): stop when the first rank runs out.
  Every rank yields ``min`` over ranks of its items; the rest is dropped.
- ``epoch_end="pad"``: go on until the last rank runs out; a rank that ran out repeats
  its last window's items. Every rank yields ``max`` over ranks of its items.

Either way the count does not depend on the window size. What was dropped or padded is
logged per rank at the end of each epoch (logger ``conveyor.distributed``, INFO) and
kept in :attr:`FullSync.last_summary`.

State: the upstream's snapshot at the start of the window being handed out, the agreed
counts and how far into the window the consumer is. Resuming replays at most one window
(two for a rank that is padding) and needs no collective for the window in progress.
Memory: up to two windows of items.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from conveyor.collectives import PendingMinMax, RankGroup
from conveyor.errors import DistributedError, ResumeError, StateError
from conveyor.pipes.base import IterDataPipe, Position, check_int, close_iterator
from conveyor.state import (
    GraphState,
    StateCapturer,
    load_graph_state,
    require_keys,
    require_non_negative,
    reset_graph,
    validate_graph_state,
)

logger = logging.getLogger("conveyor.distributed")

EPOCH_END_POLICIES = ("drop", "pad")

_END = object()
#: The longest deadline a wait may have (a year): ``timedelta`` and gloo need finite ones.
MAX_TIMEOUT_S = 365 * 24 * 3600


def check_fullsync_args(timeout: Any, epoch_end: Any, window: Any) -> None:
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not 0 < timeout <= MAX_TIMEOUT_S  # also rejects nan and inf: collectives need a deadline
    ):
        raise ValueError(f"fullsync timeout must be a number of seconds in (0, {MAX_TIMEOUT_S:g}], got {timeout!r}")
    if epoch_end not in EPOCH_END_POLICIES:
        raise ValueError(f"fullsync epoch_end must be one of {EPOCH_END_POLICIES}, got {epoch_end!r}")
    check_int("window", window, 1)


@dataclass(frozen=True)
class FullSyncSummary:
    """How one rank's epoch ended. ``dropped`` counts items read and not handed out;
    with ``shard_exhausted`` false the rank's shard may have held more that was never
    read (its last window was full, so it cannot tell)."""

    rank: int
    world_size: int
    epoch_end: str
    yielded: int
    padded: int
    dropped: int
    shard_exhausted: bool
    epoch: int | None = None

    def describe(self) -> str:
        where = f"epoch {self.epoch}" if self.epoch is not None else "a pass"
        text = f"fullsync: {where} ended on rank {self.rank}/{self.world_size} after {_items(self.yielded)}"
        if self.padded:
            text += f", {self.padded} of them repeated to pad (epoch_end='pad')"
        if self.dropped or not self.shard_exhausted:
            more = "" if self.shard_exhausted else ", and whatever of its shard was left unread"
            text += f"; dropped {_items(self.dropped)} read ahead{more} (epoch_end='drop')"
        return text


def _items(count: int) -> str:
    return f"{count} item" if count == 1 else f"{count} items"


@dataclass
class _Window:
    """Items read in one window, with their positions, and the upstream state before them."""

    snapshot: GraphState
    items: list[tuple[Any, Position | None]] = field(default_factory=list)
    agreement: PendingMinMax | None = None
    agreed: tuple[int, int] | None = None  # (min, max) items read in this window, over ranks

    def settle(self) -> tuple[int, int]:
        if self.agreed is None:
            assert self.agreement is not None
            self.agreed = self.agreement.result()
            self.agreement = None
        return self.agreed

    def saved(self) -> dict[str, Any]:
        return {"snapshot": self.snapshot, "read": len(self.items)}


@IterDataPipe.register_functional("fullsync")
class FullSync(IterDataPipe):
    """Ends each epoch at the same item count on every rank (see the module docs).

    Args:
        timeout: seconds any rank may wait for the others at one agreement; then it
            raises :class:`~conveyor.errors.DistributedError` naming itself.
        epoch_end: ``"drop"`` or ``"pad"``.
        window: items read ahead per agreement (one all-reduce per window).

    Needs an initialised ``torch.distributed`` default group. Standing alone it agrees
    over the default group when that is gloo, or a gloo group made for each pass; a
    ``DistributedReadingService`` gives it the group it owns. It is not replicable: a
    multiprocessing service keeps it, and what follows it, in the main process.
    """

    replicable = False
    keeps_order = True

    _params = ("timeout", "epoch_end", "window")

    def __init__(self, source: IterDataPipe, timeout: float = 1800, epoch_end: str = "drop", window: int = 32):
        check_fullsync_args(timeout, epoch_end, window)
        self.source = source
        self.timeout = timeout
        self.epoch_end = epoch_end
        self.window = window
        self._group: RankGroup | None = None  # given by a DistributedReadingService
        self._epoch: int | None = None  # for the summary, when a service knows it
        self.last_summary: FullSyncSummary | None = None
        self._reset_pass()

    def _reset_pass(self) -> None:
        self._current: _Window | None = None  # the window being handed out
        self._material: _Window | None = None  # the window pads repeat, when not the current one
        self._taken = 0  # items (and pads) of the current window handed out
        self._yielded = 0
        self._padded = 0
        self._position: Position | None = None

    def use_group(self, group: RankGroup | None, epoch: int | None = None) -> None:
        """Agree over ``group`` (owned by the caller) and label summaries with ``epoch``."""
        self._group, self._epoch = group, epoch

    # --- iteration -----------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        resume = self._take_restored()
        self._reset_pass()
        group = self._group if self._group is not None else RankGroup.for_pass(self.timeout, repr(self))
        try:
            yield from self._agreed_items(group, resume)
        finally:
            if group is not self._group:
                group.destroy()

    def _agreed_items(self, group: RankGroup, resume: dict[str, Any] | None) -> Iterator[Any]:
        capture = StateCapturer(self.source)
        saved = resume["window"] if resume is not None else None
        if saved is None:
            reset_graph(self.source)
        else:  # start where the window in progress (or a padding rank's material) started
            first = resume["material"] or saved  # type: ignore[index]
            load_graph_state(self.source, first["snapshot"], f"{self!r} window snapshot")
        upstream = iter(self.source)
        try:
            if saved is None:
                window, material = self._read(upstream, capture, group), None
            else:
                window, material = self._replay(upstream, resume)  # type: ignore[arg-type]
            while True:
                lowest, highest = window.settle()
                count = lowest if self.epoch_end == "drop" else highest
                last = count < self.window
                following = None if last else self._read(upstream, capture, group)
                if window.items:
                    material = window
                yield from self._hand_out(window, count, material, group)
                if following is None:
                    self._summarize(group, window, count)
                    return
                window, self._taken = following, 0
        finally:
            close_iterator(upstream)

    def _read(self, upstream: Iterator[Any], capture: StateCapturer, group: RankGroup) -> _Window:
        window = _Window(capture())
        source = self.source
        for item in upstream:
            window.items.append((item, source.item_position()))
            if len(window.items) == self.window:
                break
        window.agreement = group.min_max(len(window.items), f"{self!r} agreeing on a window's item count")
        return window

    def _hand_out(self, window: _Window, count: int, material: _Window | None, group: RankGroup) -> Iterator[Any]:
        self._current = window
        self._material = material if material is not window else None
        own = len(window.items)
        while self._taken < count:
            if self._taken < own:
                item, position = window.items[self._taken]
            else:
                if material is None:
                    raise DistributedError(
                        f"{self!r} on rank {group.rank}: this rank read no items this epoch, so it has "
                        "nothing to pad with; give every rank at least one item or use epoch_end='drop'"
                    )
                item, position = material.items[self._padded % len(material.items)]
                self._padded += 1
            self._taken += 1
            self._yielded += 1
            self._position = position
            yield item

    def _summarize(self, group: RankGroup, window: _Window, count: int) -> None:
        own = len(window.items)
        self.last_summary = FullSyncSummary(
            rank=group.rank,
            world_size=group.world_size,
            epoch_end=self.epoch_end,
            yielded=self._yielded,
            padded=self._padded,
            dropped=max(0, own - count),
            shard_exhausted=own < self.window,
            epoch=self._epoch,
        )
        logger.info(self.last_summary.describe())

    # --- resuming ------------------------------------------------------------------------

    def _replay(self, upstream: Iterator[Any], resume: dict[str, Any]) -> tuple[_Window, _Window | None]:
        """The saved window, agreed already, re-read from its snapshot (for a rank that was
        padding, its material is re-read instead: its upstream had ended there)."""
        saved, padding = resume["window"], resume["material"]
        self._yielded, self._padded, self._taken = resume["yielded"], resume["padded"], resume["taken"]
        agreed = (saved["agreed"][0], saved["agreed"][1])
        items = self._read_exactly(upstream, (padding or saved)["read"])
        if padding is None:
            window = _Window(saved["snapshot"], items, agreed=agreed)
            return window, window if items else None
        return _Window(saved["snapshot"], [], agreed=agreed), _Window(padding["snapshot"], items)

    def _read_exactly(self, upstream: Iterator[Any], count: int) -> list[tuple[Any, Position | None]]:
        items: list[tuple[Any, Position | None]] = []
        while len(items) < count:
            item = next(upstream, _END)
            if item is _END:
                raise ResumeError(
                    f"{self!r}: replaying its window from the saved snapshot gave {len(items)} items, "
                    f"{count} were read before; the upstream does not replay the same items"
                )
            items.append((item, self.source.item_position()))
        return items

    # --- state ---------------------------------------------------------------------------

    def item_position(self) -> Position | None:
        return self._position

    def reset(self) -> None:
        super().reset()
        self._reset_pass()

    def _current_state(self) -> dict[str, Any]:
        window = self._current
        return {
            "window": None if window is None else {**window.saved(), "agreed": list(window.settle())},
            "material": None if self._material is None else self._material.saved(),
            "taken": self._taken,
            "yielded": self._yielded,
            "padded": self._padded,
        }

    def _check_state(self, state: Mapping[str, Any]) -> None:
        where = repr(self)
        require_keys(
            state,
            {
                "window": (Mapping, type(None)),
                "material": (Mapping, type(None)),
                "taken": int,
                "yielded": int,
                "padded": int,
            },
            where,
        )
        for key in ("taken", "yielded", "padded"):
            require_non_negative(state, key, where)
        window = state["window"]
        if window is None:
            if state["material"] is not None or state["taken"]:
                raise StateError(f"{where}: a state before the first window has no material or items taken")
            return
        self._check_window(window, f"{where} window", agreed=True)
        lowest, highest = window["agreed"]
        if state["taken"] > (lowest if self.epoch_end == "drop" else highest):
            raise StateError(f"{where}: more items taken than the window's agreed count")
        if state["material"] is not None:
            self._check_window(state["material"], f"{where} padding material", agreed=False)
            if window["read"] or not state["material"]["read"]:
                raise StateError(f"{where}: padding material goes with an empty window and holds items")

    def _check_window(self, window: Mapping[str, Any], where: str, agreed: bool) -> None:
        require_keys(window, {"snapshot": Mapping, "read": int, **({"agreed": list} if agreed else {})}, where)
        require_non_negative(window, "read", where)
        if window["read"] > self.window:
            raise StateError(f"{where}: read {window['read']} items, more than the window of {self.window}")
        if agreed:
            bounds = window["agreed"]
            if len(bounds) != 2 or not all(isinstance(b, int) and not isinstance(b, bool) for b in bounds):
                raise StateError(f"{where}: 'agreed' must be [min, max] item counts")
            if not 0 <= bounds[0] <= window["read"] <= bounds[1] <= self.window:
                raise StateError(f"{where}: agreed counts {bounds} do not bracket the {window['read']} items read")
        validate_graph_state(self.source, window["snapshot"], f"{where} snapshot")
