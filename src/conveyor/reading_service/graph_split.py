"""Where each part of a graph runs under worker processes.

A multiprocessing service splits the graph it is given in three: the part every worker
runs (replicated), the main-process *tail* (a non-replicable op, such as ``pin_memory`` or
``fullsync``, and everything after it), and, in dispatch mode, the part upstream of the
``sharding_round_robin_dispatch()`` point, which the main process reads once and feeds
to the workers. It also tells what the merge may rely on: whether the workers' outputs
come in position order, and whether every op after the sharding point is per-item.
"""

from __future__ import annotations

import copy
from typing import Any

from conveyor.core.base import DataPipe, IterDataPipe
from conveyor.core.dispatch import ShardingRoundRobinDispatcher
from conveyor.core.foreign import inputs_of
from conveyor.core.graph import list_dps, replace_dp
from conveyor.core.op_roles import ShardingPoint
from conveyor.errors import GraphError
from conveyor.pipes.prefetch import Prefetcher
from conveyor.workers.child.dispatch import DispatchedSource


def split_replicable(datapipe: IterDataPipe) -> tuple[IterDataPipe, list[IterDataPipe]]:
    """``(graph for the workers, main-process tail from the end down)``.

    Everything downstream of a non-replicable op stays in the main process; that tail
    must be a single chain ending at the graph's end.
    """
    nodes = list_dps(datapipe)
    pinned = [node for node in nodes if isinstance(node, IterDataPipe) and not node.is_replicable()]
    if not pinned:
        return datapipe, []
    tail: list[IterDataPipe] = []
    node: Any = datapipe
    while any(p is node or _is_upstream(p, node) for p in pinned):
        inputs = inputs_of(node)
        if len(inputs) != 1:
            raise GraphError(
                f"{node!r} must run in the main process (it is, or reads from, a non-replicable op) "
                "but has several inputs; put non-replicable ops after the merge of all branches"
            )
        tail.append(node)
        node = inputs[0]
    return node, tail


def check_sharding_point_in_workers(tail: list[IterDataPipe]) -> None:
    """A sharding point after a non-replicable op would stay in the main process with it,
    and every worker would read (and the loader yield) every item once per worker."""
    for index, node in enumerate(tail):
        if isinstance(node, ShardingPoint):
            pinned = next(n for n in reversed(tail[index:]) if not n.is_replicable())
            raise GraphError(
                f"{pinned!r} cannot be replicated into workers, so it and everything after it runs in "
                f"the main process, including the sharding point {node!r}: every worker would read every "
                "item. Move it after sharding_filter() (best at the end of the pipeline), or read the "
                "source once with sharding_round_robin_dispatch()"
            )


def split_dispatch(worker_graph: IterDataPipe) -> tuple[IterDataPipe, list[IterDataPipe]]:
    """``(graph the workers run, graphs the main process reads and dispatches)``.

    Without a ``sharding_round_robin_dispatch`` point the workers run everything. With
    some (one per non-replicable branch), the workers get a copy of the graph in which
    each point reads from the main process's dispatch (channel ``k`` for the ``k``-th point
    in graph order), and the main process keeps what was upstream of each.
    """
    points = [node for node in list_dps(worker_graph) if isinstance(node, ShardingRoundRobinDispatcher)]
    if not points:
        return worker_graph, []
    for point in points:
        nested = [other for other in points if other is not point and _is_upstream(other, point)]
        if nested:
            raise GraphError(
                f"{point!r} has another sharding_round_robin_dispatch() upstream ({nested[0]!r}): "
                "a branch is dispatched once"
            )
    upstreams = [point.source for point in points]
    upstream_ids = {id(node) for upstream in upstreams for node in list_dps(upstream)}
    threaded = [
        node for node in list_dps(worker_graph) if isinstance(node, Prefetcher) and id(node) not in upstream_ids
    ]
    if threaded:
        raise GraphError(
            f"{threaded[0]!r} after sharding_round_robin_dispatch(): its thread would read the dispatched "
            "items ahead of the worker; drop it (the service already prefetches per worker)"
        )
    replicated = copy.deepcopy(worker_graph)
    copies = [node for node in list_dps(replicated) if isinstance(node, ShardingRoundRobinDispatcher)]
    for channel, point in enumerate(copies):
        replicated = replace_dp(replicated, point, DispatchedSource(channel))
    return replicated, upstreams


def reattach(tail: list[IterDataPipe], new_input: IterDataPipe, old_input: IterDataPipe) -> IterDataPipe:
    """Point the tail's lowest op at ``new_input`` instead of ``old_input``; the tail's end."""
    if new_input is not old_input:
        replace_dp(tail[-1], old_input, new_input)
    return tail[0]


def is_per_item(worker_graph: IterDataPipe) -> bool:
    """Whether every op after the sharding point treats items one by one."""
    return _all_after_sharding_point(worker_graph, "per_item")


def keeps_position_order(worker_graph: IterDataPipe) -> bool:
    """Whether the workers' outputs come in increasing sharding-point positions (then the
    merge can restore the single-process order); otherwise it is a round robin."""
    return _all_after_sharding_point(worker_graph, "keeps_order")


def adds_sub_positions(worker_graph: IterDataPipe) -> bool:
    """Whether an op after the sharding point may make several items of one position (or
    the graph has no single sharding point, so positions cannot be told apart)."""
    points = [node for node in list_dps(worker_graph) if isinstance(node, ShardingPoint)]
    if len(points) != 1:
        return True
    after = list_dps(worker_graph, exclude_dps=points[0])
    return any(getattr(node, "adds_sub_positions", True) for node in after) or bool(
        getattr(points[0], "adds_sub_positions", False)
    )


def _all_after_sharding_point(worker_graph: IterDataPipe, flag: str) -> bool:
    """Whether the graph has one sharding point and every op after it sets ``flag``."""
    points = [node for node in list_dps(worker_graph) if isinstance(node, ShardingPoint)]
    if len(points) != 1:
        return False
    after = list_dps(worker_graph, exclude_dps=points[0])
    return all(isinstance(node, IterDataPipe) and getattr(node, flag) for node in after)


def _is_upstream(candidate: DataPipe, of: DataPipe) -> bool:
    return any(n is candidate for n in list_dps(of) if n is not of)
