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

State: the input's state at the start of the window being handed out, the agreed counts
and how far into the window the consumer is. Resuming replays at most one window (for a
rank that is padding, the window it pads with) and needs no collective for the window in
progress. A state whose window has no agreed counts (``"agreed": null``, nothing read) is
a *boundary*: the input's state where the next window starts, which an elastic resume
builds (:mod:`conveyor.reading_service.elastic`); its input state is live, so a
multiprocessing service may re-split the workers' part under it. Memory: up to two
windows of items.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from conveyor.core.base import IterDataPipe
from conveyor.core.op_roles import Pausable
from conveyor.core.passes import Pass, PassContext, Position, State
from conveyor.core.validation import check_int, require_keys, require_non_negative
from conveyor.distributed.collectives import PendingMinMax, RankGroup
from conveyor.errors import DistributedError, ResumeError, StateError

T = TypeVar("T")


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
    read (its last window was full, so it cannot tell).

    Args:
        rank: The rank this summary is of.
        world_size: The number of ranks that agreed.
        epoch_end: How the epoch ended: ``"drop"`` or ``"pad"``.
        yielded: Items this rank handed out (padding included).
        padded: Items repeated to reach the agreed count (``epoch_end="pad"``).
        dropped: Items read and not handed out (``epoch_end="drop"``).
        shard_exhausted: Whether this rank read its shard to the end.
        epoch: The epoch, when the loader said which; None for a pass outside a loader.
    """

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
    """Items read in one window, with their positions, and the input's state before them."""

    before: State
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
        return {"read": len(self.items), "source": self.before}


class FullSyncPass(Pass):
    """One epoch's agreed end (see the module docs). ``current``: the window being handed
    out; ``material``: the window a padding rank repeats, when not the current one."""

    pipe: FullSync

    def __init__(self, pipe: FullSync, state: State | None, context: PassContext):
        super().__init__(pipe, context)
        self._resume = state if state is not None and state["window"] is not None else None
        first = (self._resume["material"] or self._resume["window"]) if self._resume is not None else None
        self.source = context.open(pipe.source, first["source"] if first is not None else None)
        self.current: _Window | None = None
        self.material: _Window | None = None
        self.taken = 0  # items (and pads) of the current window handed out
        self.count = 0  # items handed out (pads included)
        self.padded = 0
        self._position: Position | None = None
        self.items = self._run(pipe)

    def _run(self, pipe: FullSync) -> Iterator[Any]:
        group = pipe._group if pipe._group is not None else RankGroup.for_pass(pipe.timeout, repr(pipe))
        try:
            yield from self._agreed_items(pipe, group)
        finally:
            if group is not pipe._group:
                group.destroy()

    def _agreed_items(self, pipe: FullSync, group: RankGroup) -> Iterator[Any]:
        upstream = self.source.items
        resume = self._resume
        if resume is None or resume["window"]["agreed"] is None:  # a fresh window: from the start, or a boundary
            if resume is not None:
                self.count, self.padded = resume["yielded"], resume["padded"]
            window, material = self._read(upstream, group), None
        else:
            window, material = self._replay(upstream, resume)
        while True:
            lowest, highest = window.settle()
            count = lowest if pipe.epoch_end == "drop" else highest
            last = count < pipe.window
            following = None if last else self._read(upstream, group)
            if window.items:
                material = window
            yield from self._hand_out(window, count, material, group)
            if following is None:
                self._summarize(pipe, group, window, count)
                return
            window, self.taken = following, 0

    def _read(self, upstream: Iterator[Any], group: RankGroup) -> _Window:
        pipe = self.pipe
        window = _Window(self.source.state())
        for item in upstream:
            window.items.append((item, self.source.position()))
            if len(window.items) == pipe.window:
                break
        window.agreement = group.min_max(len(window.items), f"{pipe!r} agreeing on a window's item count")
        return window

    def _hand_out(self, window: _Window, count: int, material: _Window | None, group: RankGroup) -> Iterator[Any]:
        self.current = window
        self.material = material if material is not window else None
        own = len(window.items)
        while self.taken < count:
            if self.taken < own:
                item, position = window.items[self.taken]
            else:
                if material is None:
                    raise DistributedError(
                        f"{self.pipe!r} on rank {group.rank}: this rank read no items this epoch, so it has "
                        "nothing to pad with; give every rank at least one item or use epoch_end='drop'"
                    )
                item, position = material.items[self.padded % len(material.items)]
                self.padded += 1
            self.taken += 1
            self.count += 1
            self._position = position
            yield item

    def _summarize(self, pipe: FullSync, group: RankGroup, window: _Window, count: int) -> None:
        own = len(window.items)
        pipe.last_summary = FullSyncSummary(
            rank=group.rank,
            world_size=group.world_size,
            epoch_end=pipe.epoch_end,
            yielded=self.count,
            padded=self.padded,
            dropped=max(0, own - count),
            shard_exhausted=own < pipe.window,
            epoch=pipe._epoch,
        )
        logger.info(pipe.last_summary.describe())

    def _replay(self, upstream: Iterator[Any], resume: State) -> tuple[_Window, _Window | None]:
        """The saved window, agreed already, re-read from the state before it (for a rank
        that was padding, its material is re-read instead: its input had ended there)."""
        saved, padding = resume["window"], resume["material"]
        self.count, self.padded, self.taken = resume["yielded"], resume["padded"], resume["taken"]
        agreed = (saved["agreed"][0], saved["agreed"][1])
        items = self._read_exactly(upstream, (padding or saved)["read"])
        if padding is None:
            window = _Window(saved["source"], items, agreed=agreed)
            return window, window if items else None
        return _Window(saved["source"], [], agreed=agreed), _Window(padding["source"], items)

    def _read_exactly(self, upstream: Iterator[Any], count: int) -> list[tuple[Any, Position | None]]:
        items: list[tuple[Any, Position | None]] = []
        while len(items) < count:
            item = next(upstream, _END)
            if item is _END:
                raise ResumeError(
                    f"{self.pipe!r}: replaying its window from the saved state gave {len(items)} items, "
                    f"{count} were read before; the input does not replay the same items"
                )
            items.append((item, self.source.position()))
        return items

    def state(self) -> State:
        window = self.current
        if window is None:
            if self._resume is not None:
                return self._resume
            return {"window": None, "material": None, "taken": 0, "yielded": 0, "padded": 0}
        return {
            "window": {**window.saved(), "agreed": list(window.settle())},
            "material": None if self.material is None else self.material.saved(),
            "taken": self.taken,
            "yielded": self.count,
            "padded": self.padded,
        }

    def position(self) -> Position | None:
        return self._position

    def yielded(self) -> int:
        return self.count

    def inputs(self) -> list[Pass]:
        return [self.source]


class FullSync(IterDataPipe, Pausable):
    """Ends each epoch at the same item count on every rank (see the module docs).

    Args:
        source: The pipe whose items each rank hands out.
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
    pass_type = FullSyncPass
    replays_input = True
    state_fields = {
        "window": (dict, type(None)),
        "material": (dict, type(None)),
        "taken": int,
        "yielded": int,
        "padded": int,
    }

    _params = ("timeout", "epoch_end", "window")
    _runtime = IterDataPipe._runtime | {"_group", "last_summary"}
    _group: RankGroup | None = None
    last_summary: FullSyncSummary | None = None

    def __init__(self, source: IterDataPipe, timeout: float = 1800, epoch_end: str = "drop", window: int = 32):
        check_fullsync_args(timeout, epoch_end, window)
        self.source = source
        self.timeout = timeout
        self.epoch_end = epoch_end
        self.window = window
        self._group: RankGroup | None = None  # given by a DistributedReadingService
        self._epoch: int | None = None  # for the summary, when a service knows it
        self.last_summary: FullSyncSummary | None = None

    def use_group(self, group: RankGroup | None, epoch: int | None = None) -> None:
        """Agree over ``group`` (owned by the caller) and label summaries with ``epoch``."""
        self._group, self._epoch = group, epoch

    def holds_live_input(self, state: Mapping[str, Any]) -> bool:
        """Only a boundary state (see the module docs) holds its input's live state."""
        window = state["window"]
        return window is not None and window["agreed"] is None

    def check_own_state(self, state: Mapping[str, Any], where: str) -> None:
        window = state["window"]
        if window is None:
            if state["material"] is not None or state["taken"] or state["yielded"] or state["padded"]:
                raise StateError(f"{where}: a state before the first window has no material or items taken")
            return
        self._check_window(window, f"{where} window", agreed=True)
        if window["agreed"] is None:
            if window["read"] or state["taken"] or state["material"] is not None:
                raise StateError(f"{where}: a window not agreed yet (a boundary) has read and taken nothing")
            if state["padded"] > state["yielded"]:
                raise StateError(f"{where}: more items padded than handed out")
            return
        lowest, highest = window["agreed"]
        if state["taken"] > (lowest if self.epoch_end == "drop" else highest):
            raise StateError(f"{where}: more items taken than the window's agreed count")
        if state["material"] is not None:
            self._check_window(state["material"], f"{where} padding material", agreed=False)
            if window["read"] or not state["material"]["read"]:
                raise StateError(f"{where}: padding material goes with an empty window and holds items")

    def _check_window(self, window: Mapping[str, Any], where: str, agreed: bool) -> None:
        require_keys(window, {"read": int, "source": dict, **({"agreed": (list, type(None))} if agreed else {})}, where)
        require_non_negative(window, "read", where)
        if window["read"] > self.window:
            raise StateError(f"{where}: read {window['read']} items, more than the window of {self.window}")
        if agreed and window["agreed"] is not None:
            bounds = window["agreed"]
            if len(bounds) != 2 or not all(type(b) is int for b in bounds):
                raise StateError(f"{where}: 'agreed' must be [min, max] item counts")
            if not 0 <= bounds[0] <= window["read"] <= bounds[1] <= self.window:
                raise StateError(f"{where}: agreed counts {bounds} do not bracket the {window['read']} items read")

    def substates(self, state: Mapping[str, Any]) -> list[tuple[IterDataPipe, Any, str]]:
        found = []
        for key in ("window", "material"):
            if state[key] is not None:
                found.append((self.source, state[key]["source"], f"{key}.source"))
        return found


@IterDataPipe.register_functional("fullsync", builds=FullSync)
def fullsync(
    self: IterDataPipe[T], timeout: float = 1800, epoch_end: Literal["drop", "pad"] = "drop", window: int = 32
) -> IterDataPipe[T]:
    """Ends each epoch at the same number of items on every rank, for distributed training.

    Needs an initialised ``torch.distributed`` default group. It runs in the main process
    (a multiprocessing service keeps it, and what follows it, there).

    Args:
        timeout: Seconds a rank may wait for the others at one agreement; then it raises
            :class:`~conveyor.errors.DistributedError` naming itself.
        epoch_end: ``"drop"`` ends every rank when the first runs out; ``"pad"`` goes on
            to the longest, the ranks that ran out repeating items.
        window: Items read ahead per agreement (one all-reduce per window).

    Returns:
        A pipe of this rank's items, as many as every other rank's.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> pipe = IterableWrapper(range(8)).sharding_filter().fullsync(timeout=60)
    """
    return FullSync(self, timeout, epoch_end, window)
