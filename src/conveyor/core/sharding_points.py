"""Which sharding points of a graph split its items, level by level.

A sharding point is where items are split between ranks and workers: ``sharding_filter()``,
``sharding_round_robin_dispatch()``, a torch graph with a ``sharding_filter`` of its own.
Some sources also split their work by themselves: ``load_parquet()`` puts a
``sharding_filter()`` of its own after the row groups it lists (each worker then reads only
its own row groups), and ``DataLoader2`` puts one after a map-style source's index-order
reader (each worker loads only its own items). These are *sources' own splits*
(:func:`conveyor.core.sharding.own_split`); the user never wrote them.

The rule, in one place: :func:`conveyor.core.graph.apply_sharding`, which every reading service
calls in every process (ranks, workers), and ``DataLoader2``, when it takes the graph, both
ask this module.

- At each level, a source's own split yields to a sharding point downstream of it that
  splits at that level: the user's point wins and splits the items there, the source's
  own split keeps them all, so the output is every item once, as the graph the user wrote
  says, for any number of ranks and workers. ``DataLoader2`` removes a split that yields at
  every level from its copy of the graph (:func:`yielding_splits`), so the user's point is
  the graph's only one: the in-order merge, elastic resumes and the randomness keyed by
  position all follow it.
- Two sharding points the user wrote on one branch that split at the same level would each
  keep a share of the other's share, and most items would be lost. ``DataLoader2`` refuses
  such a graph when it is built, in the main process, naming both
  (:func:`check_sharded_once`); ``apply_sharding`` refuses it too (a graph sharded by hand).

A point after a dispatch point (``sharding_round_robin_dispatch()``, or its stand-in in a
worker) keeps every item: the dispatch split them. What is upstream of a dispatch point is
read in the main process, which the workers' level never reaches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from conveyor.core.base import IterDataPipe
from conveyor.core.dispatch import ShardingRoundRobinDispatcher
from conveyor.core.foreign import inputs_of
from conveyor.core.op_roles import ShardingPoint
from conveyor.core.sharding import LEVELS, own_split_of, sharding_level
from conveyor.errors import GraphError

#: What is split at each level, for messages.
_SPLIT_BETWEEN = {LEVELS["DEFAULT"]: "shards", LEVELS["DISTRIBUTED"]: "ranks", LEVELS["MULTIPROCESSING"]: "workers"}
_LEVEL_NAMES = {value: name for name, value in LEVELS.items()}


def upstream_of(node: Any) -> list[Any]:
    """Every pipe ``node`` reads from, directly or not (``node`` itself excluded)."""
    seen = {id(node)}
    found: list[Any] = []
    stack = list(inputs_of(node))
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        found.append(current)
        stack.extend(inputs_of(current))
    return found


def _is_upstream(candidate: Any, of: Any) -> bool:
    return any(node is candidate for node in upstream_of(of))


def after_dispatch(point: Any) -> bool:
    """Whether a dispatch point (``sharding_round_robin_dispatch()``, or what stands for it
    in a worker) is upstream of ``point``: then ``point`` keeps every item."""
    return any(getattr(node, "dispatches", False) for node in upstream_of(point))


def _candidates(nodes: Sequence[Any], level: int) -> list[Any]:
    """The sharding points among ``nodes`` that take ``level`` and are not after a dispatch."""
    return [
        node for node in nodes if isinstance(node, ShardingPoint) and node.takes(level) and not after_dispatch(node)
    ]


def _yields(split: Any, candidates: list[Any]) -> bool:
    """Whether ``split`` is a source's own split with one of ``candidates`` downstream of it."""
    if own_split_of(split) is None:
        return False
    return any(other is not split and _is_upstream(split, other) for other in candidates)


def splitting_points(nodes: Sequence[Any], level: Any) -> list[Any]:
    """The sharding points among ``nodes`` that split items at ``level`` (a
    ``SHARDING_PRIORITIES`` member or its value): those that take it, are not after a
    dispatch point, and are not a source's own split with such a point downstream."""
    candidates = _candidates(nodes, level)
    return [point for point in candidates if not _yields(point, candidates)]


def yielding_splits(nodes: Sequence[Any]) -> list[IterDataPipe]:
    """The sources' own splits among ``nodes`` that yield at every level they take: they
    keep every item whatever the reading services do, so ``DataLoader2`` removes them."""
    found = []
    for node in nodes:
        if own_split_of(node) is None:
            continue
        levels = [level for level in LEVELS.values() if node.takes(level)]
        if all(_yields(node, _candidates(nodes, level)) for level in levels):
            found.append(node)
    return found


def sharded_twice(points: Sequence[Any]) -> tuple[Any, Any] | None:
    """``(upstream, downstream)``: two of ``points`` on one branch, the first upstream of
    the second; None if each branch has at most one."""
    for point in points:
        for other in points:
            if other is not point and _is_upstream(other, point):
                return other, point
    return None


def _worker_part(nodes: Sequence[Any]) -> list[Any]:
    """``nodes`` less the dispatch points and what is upstream of them: the main process
    reads those, and the workers' level is applied in the workers only."""
    main: set[int] = set()
    for node in nodes:
        if getattr(node, "dispatches", False):
            main.add(id(node))
            main.update(id(upstream) for upstream in upstream_of(node))
    return [node for node in nodes if id(node) not in main]


def check_sharded_once(nodes: Sequence[Any]) -> None:
    """Refuse a graph (``nodes``: all of its pipes) with a branch that two sharding points
    would split between workers, naming both. ``DataLoader2`` calls it when it takes the
    graph, so the refusal comes at once, from the main process, whatever the reading
    service (from a worker starting up it would come late, and out of context).

    The workers' level is the one to check: a branch split twice there is split twice
    between ranks too. The one pair split twice between ranks only, a ``sharding_filter()``
    before a ``sharding_round_robin_dispatch()`` that names no level, reads every item
    once without ranks (the main process reads what is upstream of a dispatch point), so
    it is left to ``apply_sharding`` under a distributed service, which refuses it."""
    workers = LEVELS["MULTIPROCESSING"]
    pair = sharded_twice(splitting_points(_worker_part(nodes), workers))
    if pair is None:
        return
    ranks = LEVELS["DISTRIBUTED"]
    between_ranks = [point for point in splitting_points(nodes, ranks) if point is pair[0] or point is pair[1]]
    raise sharded_twice_error(*pair, *([ranks] if len(between_ranks) == 2 else []), workers)


def sharded_twice_error(upstream: Any, downstream: Any, *levels: int) -> GraphError:
    """The error for a branch that ``upstream`` and then ``downstream`` both split at
    ``levels`` (``SHARDING_PRIORITIES`` values)."""
    advice = "remove one of them"
    if isinstance(downstream, ShardingRoundRobinDispatcher) and downstream.sharding_group_filter is None:
        advice += (
            ", or name the dispatch's level, sharding_round_robin_dispatch(SHARDING_PRIORITIES.MULTIPROCESSING), "
            "so that the one before it splits between ranks and the dispatch between each rank's workers"
        )
    between = " and ".join(_SPLIT_BETWEEN[level] for level in levels)
    return GraphError(
        f"one branch of the graph is sharded twice: {written(upstream)} and then {written(downstream)} both split "
        f"its items between {between}, so the later one would split again what the earlier one kept and most "
        f"items would be lost. A branch of the graph is sharded once: {advice}"
    )


def written(point: Any) -> str:
    """``point`` as the user wrote it, and what it reads: ``sharding_filter() after
    Mapper(fn=parse)``; a source's own split by what made it."""
    made_by = own_split_of(point)
    if made_by is not None:
        return made_by
    call = _call(point)
    if call is None:
        return repr(point)
    inputs = inputs_of(point)
    if len(inputs) != 1:
        return call
    before = inputs[0]
    # A sharding point before it reads as the user wrote it too, not as its class.
    before_call = _call(before) if isinstance(before, ShardingPoint) else None
    return f"{call} after {before_call or repr(before)}"


def _call(point: Any) -> str | None:
    """The functional call that makes a sharding point (``sharding_filter()``), if any."""
    name = next((name for name, op in IterDataPipe._registry().items() if op is type(point)), None)
    if name is None:
        return None
    group = getattr(point, "sharding_group_filter", None)
    args = f"SHARDING_PRIORITIES.{_LEVEL_NAMES[sharding_level(group)]}" if group is not None else ""
    return f"{name}({args})"
