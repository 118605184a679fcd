"""One rank's mid-epoch ``DataLoader2`` state, read for a merge
(:mod:`conveyor.reading_service.elastic`): which rank it was, what it handed out, and
where its ``fullsync`` window began.

A rank's state holds the parts its services saved: ``DistributedReadingService``'s
(``rank``, ``world_size``, ``per_item``, and ``resumed`` for an epoch resumed from a
merged state), then, composed, ``MultiProcessingReadingService``'s (``num_workers``,
``per_item``). Its pipeline state ends in the service's ``fullsync`` (the service puts
it last), whose fields say how many of the rank's items were pads and where the window
being handed out began. Nothing here needs the graph; the merged state is checked
against the graph when it is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from conveyor.core.handed_out import HandedOut, Run
from conveyor.core.passes import State
from conveyor.core.validation import describe_state_value, require_keys, require_non_negative
from conveyor.errors import StateError
from conveyor.pipes.fullsync import FullSync

_RANK_FIELDS = {"rank": int, "world_size": int, "per_item": bool}
_WORKERS_FIELDS = {"num_workers": int, "per_item": bool}


@dataclass(frozen=True)
class RankState:
    """What a merge needs of one rank's state (``state``: the whole loader state)."""

    state: dict[str, Any]
    rank: int
    world_size: int
    num_workers: int
    padded: int
    window_start: State | None
    resumed: dict[str, Any] | None = None
    resumed_handed_out: HandedOut = field(default_factory=HandedOut)

    @property
    def items(self) -> int:
        return int(self.state["items"])

    def handed_out_run(self, before: int, where: str) -> list[Run]:
        """The positions this rank handed out since its epoch began (or resumed, after
        ``before`` items): its share up to its last item, or all of it if it padded."""
        own = self.items - before
        if own < 0:
            raise StateError(
                f"{where}: rank {self.rank} counts {self.items} items, fewer than the {before} it resumed after"
            )
        if self.padded:  # it ran out: its whole share was handed out, then repeated
            return [(self.rank, None, self.world_size)]
        if own == 0:
            return []
        position = self.state["position"]
        if position is None:
            raise StateError(f"{where}: rank {self.rank} handed out {own} items but its state names no position")
        if len(position) > 1:
            raise StateError(
                f"{where}: rank {self.rank}'s last item is part {position[1]} of the items made from position "
                f"{position[0]} (an op after the sharding point, such as flatmap, makes several items of one); "
                "where that item's parts stop is known to that rank alone, so these states resume with the "
                "same world size only"
            )
        last = position[0]
        if last % self.world_size != self.rank:
            raise StateError(
                f"{where}: rank {self.rank} of {self.world_size} names position {last}, which is not in its share"
            )
        return [(self.rank, last + 1, self.world_size)]


def read_rank_state(state: dict[str, Any], where: str) -> RankState:
    """The merge's view of one rank's in-progress state (checked: :class:`StateError`)."""
    part = state["reading_service"]
    if part is None:
        raise StateError(
            f"{where}: saved mid-epoch without a reading service's state; save it under DistributedReadingService"
        )
    services = part["services"] if type(part) is dict and set(part) == {"services"} else [part]
    if type(services) is not list or not services:
        raise StateError(f"{where}: expected the reading services' states, got {describe_state_value(services)}")
    rank_part, rest = services[0], services[1:]
    rank = _rank_part(rank_part, where)
    num_workers = 0
    if rest:
        if len(rest) != 1 or type(rest[0]) is not dict or set(rest[0]) != set(_WORKERS_FIELDS):
            raise StateError(
                f"{where}: merging knows DistributedReadingService, alone or followed by "
                "MultiProcessingReadingService; this state was saved through another composition"
            )
        require_keys(rest[0], _WORKERS_FIELDS, f"{where} MultiProcessingReadingService part")
        num_workers = require_non_negative(rest[0], "num_workers", f"{where} MultiProcessingReadingService part")
        if not rest[0]["per_item"]:
            raise StateError(
                f"{where}: rank {rank_part['rank']}'s workers do not hand items out in single-process order (an op "
                "after sharding_filter() groups or reorders items, the pipeline dispatches, or in_order=False), "
                "so what it handed out is not a prefix of its share; resume with the same world size"
            )
    pipeline = state["pipeline"]
    require_keys(pipeline, FullSync.state_fields, f"{where} pipeline (its fullsync)")
    padded = require_non_negative(pipeline, "padded", f"{where} pipeline")
    window = pipeline["window"]
    if window is not None:
        require_keys(window, {"read": int, "source": dict, "agreed": (list, type(None))}, f"{where} pipeline window")
    resumed = rank_part.get("resumed")
    handed_out = HandedOut()
    if resumed is not None:
        require_keys(resumed, {"items": int, "handed_out": dict}, f"{where} resumed")
        require_non_negative(resumed, "items", f"{where} resumed")
        handed_out = HandedOut.from_state(resumed["handed_out"], f"{where} resumed handed_out")
    return RankState(
        state=state,
        rank=rank[0],
        world_size=rank[1],
        num_workers=num_workers,
        padded=padded,
        window_start=window["source"] if window is not None else None,
        resumed=resumed,
        resumed_handed_out=handed_out,
    )


def _rank_part(part: Any, where: str) -> tuple[int, int]:
    where = f"{where} DistributedReadingService part"
    if type(part) is not dict or "rank" not in part:
        raise StateError(f"{where}: not a DistributedReadingService state ({describe_state_value(part)})")
    if "per_item" not in part:
        raise StateError(f"{where}: saved by a conveyor without elastic resume; resume it with the same world size")
    require_keys(part, {**_RANK_FIELDS, **({"resumed": dict} if "resumed" in part else {})}, where)
    rank, world_size = part["rank"], part["world_size"]
    if not 0 <= rank < world_size:
        raise StateError(f"{where}: rank {rank} is not in [0, {world_size})")
    if not part["per_item"]:
        raise StateError(
            f"{where}: rank {rank}'s pipeline cannot resume on another world size: an op after its "
            "sharding_filter() groups or reorders items (batch, shuffle, header, ...), it has no single "
            "sharding_filter(), or it dispatches; resume it with the same world size"
        )
    return rank, world_size
