"""Elastic resume: an epoch checkpointed on W ranks goes on on W' ranks.

Each rank of a :class:`~conveyor.reading_service.distributed.DistributedReadingService`
job saves its own ``DataLoader2.state_dict()``. :func:`merge_rank_states` (the service's
``merge_rank_states``) combines them into one state that names no rank, worker count or
world size, and every rank of the new job loads that same state.

Why it works: for a *per-item* pipeline (every op after the sharding point treats items
one by one and keeps their order), what a rank handed out is every position of its share
up to the position of its last item, and items do not depend on who makes them (random
ops after the sharding point draw by position, and every rank shares rank 0's seed). So
the merged state says:

- which positions at the sharding point the job handed out (:mod:`conveyor.core.handed_out`:
  a frontier and one arithmetic run per old rank; a rank that ran out and padded handed
  out its whole share), and how many items (``items``, pads included);
- where to read the part upstream of the sharding point from: the state below the
  ``fullsync`` of the rank whose share holds the first position not handed out, at the
  start of its window (the ``fullsync`` holds its input's state from there, before the
  items it handed out, so that state is never past a position still to hand out).

Loading it (:func:`resumed_pipeline`, called by each service's ``adapt_pipeline_state``)
picks, among that rank's worker states, the latest one not past that first position,
marks its sharding point to skip everything handed out, and starts a ``fullsync`` window
there (a *boundary*: no window read yet); a multiprocessing service then gives every new
worker that state. The new ranks share the remaining positions by the usual arithmetic
(``p % W'``), skipping what was handed out: each remaining item once, in an order that is
a function of the merged state and the new topology alone. Each rank's ``fullsync``
applies ``epoch_end`` anew to the remaining items.

Refused (:class:`~conveyor.errors.StateError`): states of different epochs, graphs or
world sizes; duplicate or missing ranks; ops after the sharding point that group or
reorder items (``batch``, ``shuffle``, ...: their state is the rank's own), checked when
the ranks' states say so and again when a merged state is loaded; a rank whose last item
was one of several made from one position (``flatmap``; where its parts stop only that
rank knows); a dispatching pipeline (``sharding_round_robin_dispatch``).
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from conveyor.core.base import IterDataPipe
from conveyor.core.graph import list_dps
from conveyor.core.handed_out import HandedOut, Run
from conveyor.core.loader_schema import STATE_FORMAT, STATE_VERSION, check_loader_fields
from conveyor.core.op_roles import ShardingPoint
from conveyor.core.passes import State
from conveyor.core.sharding import ShardingFilter
from conveyor.core.state import walk_state
from conveyor.core.validation import describe_state_value, require_keys, require_non_negative
from conveyor.errors import StateError
from conveyor.pipes.fullsync import FullSync
from conveyor.reading_service.graph_split import is_per_item, keeps_position_order, split_replicable
from conveyor.reading_service.rank_states import RankState, read_rank_state
from conveyor.workers.child.dispatch import DispatchedSource
from conveyor.workers.parent.merged_output import MergedWorkerOutput

#: The one key of a merged state's ``reading_service`` part, which every conveyor service
#: that can resume it accepts in place of its own part.
ELASTIC = "elastic"


@dataclass(frozen=True)
class ElasticPart:
    """A merged state's ``reading_service`` part, checked.

    ``world_size``: the job that was merged; ``items``: items handed out in the epoch by
    every job so far (pads included); ``handed_out``: their positions at the sharding
    point; ``origin``: the state below the ``fullsync`` where the upstream part is read
    from, laid out for ``origin_workers`` workers (None: from the epoch's start)."""

    world_size: int
    items: int
    handed_out: HandedOut
    origin_workers: int
    origin: State | None

    def as_state(self) -> dict[str, Any]:
        return {
            ELASTIC: {
                "world_size": self.world_size,
                "items": self.items,
                "handed_out": self.handed_out.as_state(),
                "origin": {"num_workers": self.origin_workers, "state": self.origin},
            }
        }


def is_elastic(part: Any) -> bool:
    """Whether a ``reading_service`` part is a merged state's (:func:`merge_rank_states`)."""
    return type(part) is dict and len(part) == 1 and ELASTIC in part


def check_elastic_part(part: Any, where: str) -> ElasticPart:
    """The merged part, checked (:class:`StateError`)."""
    where = f"{where} (merged from several ranks)"
    require_keys(part, {ELASTIC: dict}, where)
    inner = part[ELASTIC]
    require_keys(inner, {"world_size": int, "items": int, "handed_out": dict, "origin": dict}, where)
    require_non_negative(inner, "items", where)
    if inner["world_size"] < 1:
        raise StateError(f"{where}: 'world_size' must be >= 1, got {inner['world_size']}")
    origin = inner["origin"]
    require_keys(origin, {"num_workers": int, "state": (dict, type(None))}, f"{where} origin")
    require_non_negative(origin, "num_workers", f"{where} origin")
    handed_out = HandedOut.from_state(inner["handed_out"], f"{where} handed_out")
    return ElasticPart(inner["world_size"], inner["items"], handed_out, origin["num_workers"], origin["state"])


def elastic_refusal(worker_graph: IterDataPipe, main_ops: list[IterDataPipe]) -> str | None:
    """Why a graph cannot resume elastically (None: it can). ``worker_graph`` holds the
    sharding point; ``main_ops`` are the ops between it and the ``fullsync``, run in the
    main process."""
    nodes = list_dps(worker_graph)
    if any(isinstance(node, DispatchedSource) for node in nodes):
        return "it dispatches items to workers (sharding_round_robin_dispatch), so its positions are the dispatcher's"
    points = [node for node in nodes if isinstance(node, ShardingPoint)]
    if len(points) != 1 or not isinstance(points[0], ShardingFilter):
        found = len(points)
        return f"it needs exactly one sharding_filter() to split positions between ranks, found {found} sharding points"
    bad = [node for node in main_ops if not (getattr(node, "per_item", False) and getattr(node, "keeps_order", False))]
    if not (is_per_item(worker_graph) and keeps_position_order(worker_graph)) or bad:
        return (
            f"an op after {points[0]!r} groups or reorders items (batch, shuffle, header, ...), so what a rank "
            "handed out depends on that rank; move grouping before sharding_filter(), or resume with the same "
            "world size"
        )
    return None


def merge_rank_states(states: list[Any]) -> dict[str, Any]:
    """One topology-free state from every rank's ``DataLoader2.state_dict()`` (any order).

    The states must be of one epoch of one job (same graph, world size and epoch), saved
    at the same step, one per rank. See the module docs for what the result holds."""
    where = "merge_rank_states"
    if not isinstance(states, (list, tuple)) or not states:
        raise StateError(f"{where}: give a non-empty list of the ranks' DataLoader2 states")
    checked = [check_loader_fields(state, f"{where}: state {index}") for index, state in enumerate(states)]
    _check_same(checked, "fingerprint", "come from different pipelines (graph fingerprints)")
    moments = {(state["epoch"], state["in_progress"]) for state in checked}
    if len(moments) > 1:
        raise StateError(
            f"{where}: the states come from different epochs ({_moments(checked)}); save every rank at the same step"
        )
    if not checked[0]["in_progress"]:
        return _between_epochs(checked, where)
    ranks = [read_rank_state(state, f"{where}: state {index}") for index, state in enumerate(checked)]
    by_rank = _check_ranks(ranks, where)
    first = by_rank[0]
    if any(rank.resumed != first.resumed for rank in ranks):
        raise StateError(f"{where}: the ranks resumed from different merged states; save every rank at the same step")
    before, earlier = (first.resumed["items"], first.resumed_handed_out) if first.resumed else (0, HandedOut())
    runs: list[Run] = []
    for rank in ranks:
        runs.extend(rank.handed_out_run(before, where))
    handed_out = earlier.union(runs)
    owner = by_rank[handed_out.below % len(by_rank)]
    merged = ElasticPart(
        world_size=len(by_rank),
        items=before + sum(rank.items - before for rank in ranks),
        handed_out=handed_out,
        origin_workers=owner.num_workers,
        origin=owner.window_start,
    )
    return {
        "format": STATE_FORMAT,
        "version": STATE_VERSION,
        "fingerprint": first.state["fingerprint"],
        "seed": first.state["seed"],  # every rank used rank 0's
        "seeded": first.state["seeded"],
        "epoch": first.state["epoch"],
        "in_progress": True,
        "items": merged.items,
        "pipeline": None,
        "position": None,
        "reading_service": merged.as_state(),
        "skipped": _skipped_by_any(checked),
        "rng_at_save": first.state["rng_at_save"],  # every rank drew alike (rank 0's seed)
    }


def _skipped_by_any(states: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every rank's records of items skipped for errors (``on_error="skip"``), once each:
    a stage before the sharding point runs on every rank."""
    seen: set[tuple[int, str]] = set()
    records = []
    for state in states:
        for record in state["skipped"]:
            if (record["stage_index"], record["key"]) not in seen:
                seen.add((record["stage_index"], record["key"]))
                records.append(copy.deepcopy(record))
    return records


def _check_same(states: list[dict[str, Any]], key: str, what: str) -> None:
    values = sorted({describe_state_value(state[key]) for state in states})
    if len(values) > 1:
        raise StateError(f"merge_rank_states: the states {what}: {', '.join(values[:4])}")


def _moments(states: list[dict[str, Any]]) -> str:
    return ", ".join(
        f"state {index}: epoch {s['epoch']}{' in progress' if s['in_progress'] else ' not begun'}"
        for index, s in enumerate(states[:8])
    )


def _between_epochs(states: list[dict[str, Any]], where: str) -> dict[str, Any]:
    """States saved between epochs name no rank: the next epoch's start, with the seed a
    seeded rank set (rank 0's is the one the job used; seeded ranks must agree)."""
    seeded = {state["seed"] for state in states if state["seeded"]}
    if len(seeded) > 1:
        raise StateError(f"{where}: the ranks were seeded differently ({len(seeded)} seeds); seed every rank alike")
    chosen = next((state for state in states if state["seeded"]), states[0])
    return {**copy.deepcopy(chosen), "items": 0, "pipeline": None, "position": None, "reading_service": None}


def _check_ranks(ranks: list[RankState], where: str) -> list[RankState]:
    """The states by rank: one per rank of one world size."""
    sizes = sorted({rank.world_size for rank in ranks})
    if len(sizes) > 1:
        raise StateError(f"{where}: the states come from jobs of different world sizes {sizes[:8]}")
    world_size = sizes[0]
    counts = Counter(rank.rank for rank in ranks)
    duplicates = sorted(rank for rank, count in counts.items() if count > 1)
    missing = sorted(set(range(world_size)) - {rank.rank for rank in ranks})
    if duplicates or missing:
        problems = []
        if duplicates:
            problems.append(f"rank(s) {_some(duplicates)} given more than once")
        if missing:
            problems.append(f"rank(s) {_some(missing)} missing")
        raise StateError(f"{where}: a job of {world_size} ranks needs one state per rank: {'; '.join(problems)}")
    return sorted(ranks, key=lambda rank: rank.rank)


def _some(numbers: list[int]) -> str:
    shown = ", ".join(str(n) for n in numbers[:8])
    return shown + (f" and {len(numbers) - 8} more" if len(numbers) > 8 else "")


# --- loading a merged state ----------------------------------------------------------------


def resumed_pipeline(final: IterDataPipe, part: ElasticPart, where: str) -> State | None:
    """The pipeline state from which a pass over ``final`` (a service's graph: ending in a
    ``fullsync`` or not, with its workers' part for no workers) resumes a merged state;
    None when nothing was handed out (the epoch from its start)."""
    bottom, tail = split_replicable(final)
    fullsync = tail[0] if tail and isinstance(tail[0], FullSync) else None
    main_ops = tail[1:] if fullsync is not None else tail
    worker_graph = bottom._worker_graph if isinstance(bottom, MergedWorkerOutput) else bottom
    refusal = elastic_refusal(worker_graph, main_ops)
    if refusal is not None:
        raise StateError(f"{where}: this pipeline cannot resume a state merged from several ranks: {refusal}")
    handed_out = part.handed_out
    if not handed_out and part.origin is None:
        return None
    replace: Callable[[State], None] | None = None
    layout: State | None = None
    candidates: list[State] = []
    if part.origin is not None:
        layout = copy.deepcopy(part.origin)
        replace, below = _descend(main_ops, layout, f"{where} origin")
        candidates = _worker_states(below, part.origin_workers, f"{where} origin")
    elif main_ops:
        raise StateError(f"{where}: the merged state names no state for {main_ops[0]!r} to resume from")
    template = _latest_not_past(worker_graph, candidates, handed_out.below, where)
    if template is None:
        template = _fresh_state(worker_graph)
    for node, state in walk_state(worker_graph, template):
        if isinstance(node, ShardingFilter):
            state["skip_below"] = handed_out.below
            state.pop("handed_out", None)
            if handed_out.runs:
                state["handed_out"] = [list(run) for run in handed_out.runs]
    if replace is not None:
        replace(template)
        template = layout
    if fullsync is None:
        return template
    return {
        "window": {"read": 0, "source": template, "agreed": None},
        "material": None,
        "taken": 0,
        "yielded": 0,
        "padded": 0,
    }


def _descend(main_ops: list[IterDataPipe], state: State, where: str) -> tuple[Callable[[State], None] | None, Any]:
    """Down through the main-process ops' states to the workers' part: ``(a function that
    puts a new part in its place, the part)``."""
    replace: Callable[[State], None] | None = None
    for node in main_ops:
        require_keys(state, node.fields(), f"{where} at {node!r}")
        inner = node.substates(state)
        if len(inner) != 1 or not node.holds_live_input(state):
            raise StateError(f"{where}: {node!r} holds its input's state from an earlier point")
        _, child, key = inner[0]
        replace = _replacer(state, key)
        state = child
    return replace, state


def _replacer(state: State, key: str) -> Callable[[State], None]:
    def replace(value: State) -> None:
        state[key] = value

    if key != "source":
        raise StateError(f"the merged state's origin holds an input at {key!r}, expected 'source'")
    return replace


def _worker_states(below: Any, num_workers: int, where: str) -> list[State]:
    """The worker-graph states in the origin's workers' part (one, without workers)."""
    if num_workers == 0:
        return [below]
    require_keys(below, {"workers": list, "merge": dict}, where)
    if len(below["workers"]) != num_workers:
        raise StateError(f"{where}: expected {num_workers} worker states, got {len(below['workers'])}")
    return [state for state in below["workers"] if state is not None]


def _latest_not_past(worker_graph: IterDataPipe, candidates: list[State], first_left: int, where: str) -> State | None:
    """A copy of the candidate whose sharding point has read the most positions without
    passing ``first_left`` (the first position still to hand out); None if none."""
    best: tuple[int, State] | None = None
    for index, candidate in enumerate(candidates):
        worker_graph.check_state(candidate, f"{where} origin worker state {index}")
        reads = [
            state["position"] for node, state in walk_state(worker_graph, candidate) if isinstance(node, ShardingFilter)
        ]
        if reads and min(reads) <= first_left and (best is None or min(reads) > best[0]):
            best = (min(reads), candidate)
    return copy.deepcopy(best[1]) if best is not None else None


def _fresh_state(worker_graph: IterDataPipe) -> State:
    """The state a pass over ``worker_graph`` starts from (a pass opened and closed: it
    reads nothing)."""
    opened = worker_graph.open(None)
    try:
        return opened.state()
    finally:
        opened.close()
