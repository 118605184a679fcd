"""Graph tools: walk, find, replace and remove pipes; apply sharding and seeds.

Graphs are walked through the pipes' public attributes (:meth:`DataPipe.inputs`), never
by pickling. The canonical node order is breadth-first from the last pipe, without
duplicates; graph states and fingerprints use it.
"""

from __future__ import annotations

import hashlib
import warnings
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from conveyor.core.base import DataPipe
from conveyor.core.foreign import (
    inputs_of,
    is_pipe,
    shard_torch_point,
    torch_random_nodes,
    torch_sharding_points,
)
from conveyor.core.op_roles import SHARDING_PRIORITIES, RandomOp, ShardingPoint
from conveyor.core.random import SeedGenerator
from conveyor.core.sharding import sharding_level
from conveyor.core.sharding_points import sharded_twice, sharded_twice_error, splitting_points
from conveyor.errors import GraphError

Graph = dict[int, tuple[DataPipe, "Graph"]]


def traverse(pipe: DataPipe) -> Graph:
    """The graph upstream of ``pipe`` as nested ``{id(node): (node, {inputs...})}``.

    Args:
        pipe: The graph's last pipe (the one a loader reads).
    """
    return _traverse(pipe, set())


def _traverse(pipe: DataPipe, on_path: set[int]) -> Graph:
    if not is_pipe(pipe):
        raise TypeError(f"expected a pipe, got {type(pipe).__name__}")
    if id(pipe) in on_path:
        raise GraphError(f"the graph has a cycle through {pipe!r}")
    on_path = on_path | {id(pipe)}
    children: Graph = {}
    for upstream in inputs_of(pipe):
        children.update(_traverse(upstream, on_path))
    return {id(pipe): (pipe, children)}


traverse_dps = traverse  # the torchdata name


GraphOrPipe = DataPipe | Graph


def _end_of(graph: GraphOrPipe) -> DataPipe:
    """The last pipe of ``graph``: a pipe, or the graph dict :func:`traverse_dps` returns
    (one end)."""
    if is_pipe(graph):
        return graph  # type: ignore[return-value]
    if isinstance(graph, dict):
        if len(graph) != 1:
            raise GraphError(f"expected the graph of one pipe (as traverse_dps returns), got {len(graph)} ends")
        ((node, _),) = graph.values()
        if not is_pipe(node):
            raise TypeError(f"expected a graph of pipes, got a {type(node).__name__} at its end")
        return node
    raise TypeError(f"expected a pipe or the graph traverse_dps returns, got {type(graph).__name__}")


def _same_shape(graph: GraphOrPipe, end: DataPipe) -> Any:
    """``end`` as ``graph`` came: a graph dict for a graph dict, the pipe for a pipe."""
    return traverse(end) if isinstance(graph, dict) else end


def list_dps(graph: GraphOrPipe, exclude_dps: DataPipe | Iterable[DataPipe] | None = None) -> list[DataPipe]:
    """The graph's last pipe and everything upstream of it, breadth-first, each node once.

    ``graph`` is a pipe or the graph dict :func:`traverse_dps` returns. ``exclude_dps``
    (a pipe or several) removes those pipes together with everything upstream of them.

    Args:
        graph: The graph: its last pipe, or the graph dict :func:`traverse` returns.
        exclude_dps: A pipe, or several, left out with everything upstream of them; None: none.
    """
    excluded: set[int] = set()
    if exclude_dps is not None:
        for ex in [exclude_dps] if isinstance(exclude_dps, DataPipe) or is_pipe(exclude_dps) else exclude_dps:
            excluded.update(id(node) for node in _bfs(ex))
    return [node for node in _bfs(_end_of(graph)) if id(node) not in excluded]


def _bfs(pipe: Any) -> list[DataPipe]:
    traverse(pipe)  # rejects cycles and non-pipes (a torch datapipe is one) with a clear error
    seen: set[int] = set()
    order: list[DataPipe] = []
    queue = deque([pipe])
    while queue:
        node = queue.popleft()
        if id(node) in seen:
            continue
        seen.add(id(node))
        order.append(node)
        queue.extend(inputs_of(node))
    return order


def find_dps(graph: GraphOrPipe, dp_type: type | tuple[type, ...]) -> list[DataPipe]:
    """Every pipe of ``graph`` (a pipe or a graph dict) that is an instance of ``dp_type``.

    Args:
        graph: The graph: its last pipe, or the graph dict :func:`traverse` returns.
        dp_type: A class, or a tuple of classes, as for ``isinstance``.
    """
    return [node for node in list_dps(graph) if isinstance(node, dp_type)]


def replace_dp(graph: GraphOrPipe, old_datapipe: DataPipe, new_datapipe: DataPipe) -> Any:
    """Put ``new_datapipe`` where ``old_datapipe`` was, in place. Returns the graph's
    (possibly new) end, as a graph dict when ``graph`` was one.

    Args:
        graph: The graph: its last pipe, or the graph dict :func:`traverse` returns.
        old_datapipe: The pipe to take out; it must be in the graph.
        new_datapipe: The pipe its consumers read from instead.
    """
    end = _end_of(graph)
    if end is old_datapipe:
        return _same_shape(graph, new_datapipe)
    nodes = list_dps(end)
    if not any(node is old_datapipe for node in nodes):
        raise GraphError(f"{old_datapipe!r} is not in the graph ending at {end!r}")
    for node in nodes:
        _substitute_input(node, old_datapipe, new_datapipe)
    return _same_shape(graph, end)


def remove_dp(graph: GraphOrPipe, datapipe: DataPipe) -> Any:
    """Connect ``datapipe``'s only input to its consumers. Returns the graph's (possibly
    new) end, as a graph dict when ``graph`` was one.

    Args:
        graph: The graph: its last pipe, or the graph dict :func:`traverse` returns.
        datapipe: The pipe to take out; it must have exactly one input.
    """
    inputs = inputs_of(datapipe)
    if not inputs:
        raise GraphError(f"Cannot remove the source DataPipe {datapipe!r}: it has no input to connect its consumers to")
    if len(inputs) > 1:
        raise GraphError(
            f"Cannot remove the receiving DataPipe {datapipe!r}: it has {len(inputs)} inputs; use replace_dp"
        )
    return replace_dp(graph, datapipe, inputs[0])


def _substitute_input(node: DataPipe, old: DataPipe, new: DataPipe) -> None:
    for name, value in list(vars(node).items()):
        if name.startswith("_"):
            continue
        if value is old:
            setattr(node, name, new)
        elif isinstance(value, (list, tuple)) and any(v is old for v in value):
            replaced = [new if v is old else v for v in value]
            setattr(node, name, type(value)(replaced) if isinstance(value, tuple) else replaced)


def apply_sharding(
    pipe: DataPipe,
    num_shards: int,
    shard_index: int,
    priority: SHARDING_PRIORITIES = SHARDING_PRIORITIES.DEFAULT,
) -> DataPipe:
    """Tell every sharding point upstream of ``pipe`` to keep shard ``shard_index`` of
    ``num_shards`` at ``priority``; returns ``pipe``.

    A point after a dispatch point keeps every item (the dispatch split them), and a
    source's own split (``load_parquet``'s) yields to a sharding point downstream of it
    (see :mod:`conveyor.core.sharding_points`). A branch that two sharding points would split
    is a :class:`~conveyor.errors.GraphError` naming both.

    Args:
        pipe: The graph's last pipe (the one a loader reads).
        num_shards: How many shards the items are split into at this level.
        shard_index: Which shard to keep, from 0 to ``num_shards - 1``.
        priority: The level split at: ``SHARDING_PRIORITIES.DISTRIBUTED`` (between
            ranks), ``MULTIPROCESSING`` (between workers) or ``DEFAULT`` (the outermost
            level, before the other two).
    """
    if not isinstance(num_shards, int) or num_shards < 1:
        raise ValueError(f"num_shards must be a positive int, got {num_shards!r}")
    if not isinstance(shard_index, int) or not 0 <= shard_index < num_shards:
        raise ValueError(f"shard_index must be in [0, {num_shards}), got {shard_index!r}")
    # Which points split at this level, and whether a branch is split twice, is decided in
    # conveyor.core.sharding_points, which DataLoader2 asks too when it takes the graph.
    nodes = list_dps(pipe)
    points = splitting_points(nodes, priority)
    twice = sharded_twice(points)
    if twice is not None:
        raise sharded_twice_error(*twice, sharding_level(priority))
    foreign = torch_sharding_points(nodes)
    splits_itself = any(getattr(node, "_splits_itself", False) for node in nodes)
    if not points and not foreign and not splits_itself and num_shards > 1:
        warnings.warn(
            f"the graph ending at {pipe!r} has no sharding_filter(): every one of the "
            f"{num_shards} {SHARDING_PRIORITIES(priority).name.lower()} shards will see all items",
            stacklevel=2,
        )
    for point in points:
        point.apply_sharding(num_shards, shard_index, SHARDING_PRIORITIES(priority))
    for node in foreign:  # a torch sharding_filter inside the graph, split alike
        shard_torch_point(node, num_shards, shard_index, priority)
    return pipe


def random_ops(pipe: DataPipe) -> list[DataPipe]:
    """The random ops of the graph in canonical order; an op's index is its seed ordinal."""
    return [node for node in list_dps(pipe) if isinstance(node, RandomOp)]


def assign_seed_ordinals(pipe: DataPipe) -> DataPipe:
    """Stamp each random op with its ordinal in this (whole) graph; returns ``pipe``.

    A random op's stream is keyed by its ordinal. ``DataLoader2`` stamps the user's graph
    once, so that a service that splits the graph (workers and main process) keys every
    op exactly as a single process would.
    """
    for ordinal, op in enumerate(random_ops(pipe)):
        op._seed_ordinal = ordinal  # type: ignore[attr-defined]
    return pipe


def apply_random_seed(pipe: DataPipe, seeds: SeedGenerator) -> DataPipe:
    """Give every random op its randomness for the epoch of ``seeds``; returns ``pipe``.

    Ops with a sharding point upstream draw per item (keyed by the item's position
    there); the others draw from the shared stream, identical on every rank and worker.
    An op's key is its stamped ordinal (:func:`assign_seed_ordinals`) or, unstamped, its
    index among the graph's random ops.

    Args:
        pipe: The graph's last pipe (the one a loader reads).
        seeds: The loader's seeds for this epoch.
    """
    ops = random_ops(pipe)
    for index, op in enumerate(ops):
        ordinal = getattr(op, "_seed_ordinal", index)
        after_sharding = any(isinstance(node, ShardingPoint) for node in list_dps(op) if node is not op)
        op.set_randomness(seeds.pipe_randomness(ordinal, keyed_by_position=after_sharding))  # type: ignore[attr-defined]
    # torch datapipes inside the graph draw from the shared stream too, keyed after conveyor's ops.
    for index, node in enumerate(torch_random_nodes(list_dps(pipe)), start=len(ops)):
        node.set_seed(seeds.pipe_randomness(index, keyed_by_position=False).key0 >> 1)
    return pipe


def set_datapipes_seed(datapipes: Iterable[DataPipe], seed_generator: SeedGenerator, distributed_shared: bool) -> None:
    """torchdata's: seed each random op among ``datapipes`` with the next seed of
    ``seed_generator``'s shared stream (``distributed_shared=True``: the same on every rank
    and worker) or of its own stream.

    Args:
        datapipes: The pipes to seed; those that are not random ops are left as they are.
        seed_generator: Where the seeds come from.
        distributed_shared: Use the stream shared by every rank and worker; False: this worker's
            own.
    """
    for node in datapipes:
        if isinstance(node, RandomOp):
            shared = distributed_shared
            node.set_seed(seed_generator.generate_shared_seed() if shared else seed_generator.generate_seed())


def set_graph_random_seed(datapipe: DataPipe, seed_generator: SeedGenerator) -> DataPipe:
    """torchdata's name for :func:`apply_random_seed`.

    Args:
        datapipe: The graph's last pipe.
        seed_generator: The loader's seeds for this epoch.
    """
    return apply_random_seed(datapipe, seed_generator)


def fingerprint(pipe: DataPipe) -> str:
    """A stable hash of the graph's structure and op parameters (not its runtime state).
    conveyor's own ops are named by their class alone: the module an op is kept in is not
    part of a pipeline's identity, so moving it keeps every saved state loadable.

    Args:
        pipe: The graph's last pipe (the one a loader reads).
    """
    return fingerprint_naming(pipe, _op_namespace)


def fingerprint_naming(pipe: DataPipe, namespace: Callable[[type], str]) -> str:
    """:func:`fingerprint`, each op's class placed in ``namespace(its class)``."""
    nodes = list_dps(pipe)
    index = {id(node): i for i, node in enumerate(nodes)}
    digest = hashlib.sha256()
    for node in nodes:
        edges = ",".join(str(index[id(up)]) for up in inputs_of(node))
        digest.update(f"{namespace(type(node))}.{node!r}<-[{edges}];".encode())
    return digest.hexdigest()[:32]


def _op_namespace(cls: type) -> str:
    module = cls.__module__
    return "conveyor" if module == "conveyor" or module.startswith("conveyor.") else module


def describe(pipe: DataPipe) -> list[dict[str, Any]]:
    """The graph as plain rows ``{"index", "pipe", "inputs"}`` in canonical order.

    Args:
        pipe: The graph's last pipe (the one a loader reads).
    """
    nodes = list_dps(pipe)
    index = {id(node): i for i, node in enumerate(nodes)}
    return [
        {"index": i, "pipe": repr(node), "inputs": [index[id(up)] for up in inputs_of(node)]}
        for i, node in enumerate(nodes)
    ]


def to_dot(pipe: DataPipe, name: str = "pipeline") -> str:
    """The graph in Graphviz DOT, data flowing left to right (``dot -Tsvg`` draws it).

    Sharding points are drawn bold; ops that run in the main process under worker
    processes (a non-replicable op and everything after it) dashed.

    Args:
        pipe: The graph's last pipe (the one a loader reads).
        name: The name of the DOT ``digraph``.
    """
    rows = _drawing_rows(pipe)
    lines = [f"digraph {_dot_id(name)} {{", "  rankdir=LR;", '  node [shape=box, fontname="monospace"];']
    for key, label, kind in rows["nodes"]:
        style = {"sharding": ", style=bold", "main": ", style=dashed"}.get(kind, "")
        lines.append(f'  {key} [label="{_dot_escape(label)}"{style}];')
    lines.extend(f"  {source} -> {target};" for source, target in rows["edges"])
    lines.append("}")
    return "\n".join(lines) + "\n"


def to_mermaid(pipe: DataPipe) -> str:
    """The graph as a Mermaid flowchart (renders in GitHub Markdown inside a fenced ``mermaid`` block).

    Sharding points get a double border, main-process ops rounded corners.

    Args:
        pipe: The graph's last pipe (the one a loader reads).
    """
    rows = _drawing_rows(pipe)
    lines = ["flowchart LR"]
    for key, label, kind in rows["nodes"]:
        text = _mermaid_escape(label)
        shape = {"sharding": f'[["{text}"]]', "main": f'("{text}")'}.get(kind, f'["{text}"]')
        lines.append(f"  {key}{shape}")
    lines.extend(f"  {source} --> {target}" for source, target in rows["edges"])
    return "\n".join(lines) + "\n"


def _drawing_rows(pipe: DataPipe) -> dict[str, list[Any]]:
    """Nodes ``(key, label, kind)`` sources first, and edges ``(upstream, downstream)``."""
    rows = describe(pipe)
    nodes = list_dps(pipe)
    drawn: list[tuple[str, str, str]] = []
    edges: list[tuple[str, str]] = []
    for row, node in reversed(list(zip(rows, nodes, strict=True))):
        kind = "sharding" if isinstance(node, ShardingPoint) else ""
        if not kind and any(not getattr(up, "replicable", True) for up in list_dps(node)):
            kind = "main"
        drawn.append((f"n{row['index']}", row["pipe"], kind))
        edges.extend((f"n{up}", f"n{row['index']}") for up in row["inputs"])
    return {"nodes": drawn, "edges": edges}


def _dot_id(name: str) -> str:
    return '"' + _dot_escape(name) + '"'


def _dot_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _mermaid_escape(text: str) -> str:
    return text.replace('"', "#quot;").replace("<", "#lt;").replace(">", "#gt;").replace("\n", " ")
