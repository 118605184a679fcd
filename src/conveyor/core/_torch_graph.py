"""Helpers that work inside a ``torch.utils.data.datapipes`` graph (imports torch).

Imported only by :mod:`conveyor.pipes.torch.torch_sources` once it holds a torch object, so
``import conveyor`` stays free of torch. The classes here are module-level, so torch's
own pickler (used by ``torch.utils.data.DataLoader`` under ``spawn``) finds them by name.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import IterDataPipe as TorchIterDataPipe
from torch.utils.data import MapDataPipe as TorchMapDataPipe
from torch.utils.data.datapipes.iter import Collator, Filter, Mapper, ShardingFilter, UnBatcher
from torch.utils.data.datapipes.iter.sharding import SHARDING_PRIORITIES as TORCH_PRIORITIES
from torch.utils.data.graph import traverse_dps
from torch.utils.data.graph_settings import apply_random_seed, apply_sharding, get_all_graph_pipes

from conveyor.core.op_roles import SHARDING_PRIORITIES

#: torch ops that treat each item on its own and keep the order of the items they read:
#: after a ``sharding_filter`` they leave every item's position meaningful, so the wrapper's
#: positions (and a resume on another worker count) are exact through them.
PER_ITEM_TORCH_OPS: tuple[type, ...] = (Mapper, Collator, Filter, UnBatcher)


class PositionProbe(TorchIterDataPipe):
    """A transparent torch pipe put in front of a ``sharding_filter``: it remembers the index
    (in its own pass) of the last item it handed on, which is the item's position at the
    sharding point. Torch's filter enumerates exactly these items, so the index is the
    same ``i`` its ``i % num_of_instances`` test uses.
    """

    def __init__(self, source_datapipe: TorchIterDataPipe) -> None:
        super().__init__()
        self.source_datapipe = source_datapipe
        self.last = -1

    def __iter__(self) -> Iterator[Any]:
        self.last = -1
        for index, item in enumerate(self.source_datapipe):
            self.last = index
            yield item

    def __len__(self) -> int:
        return len(self.source_datapipe)


def all_pipes(datapipe: TorchIterDataPipe) -> list[TorchIterDataPipe | TorchMapDataPipe]:
    """Every node of the torch graph ending at ``datapipe`` (torch's own traversal)."""
    return get_all_graph_pipes(traverse_dps(datapipe))


def is_sharding_pipe(node: Any) -> bool:
    """Torch's own test (``graph_settings._is_sharding_datapipe``), restated: a node that
    ``graph_settings.apply_sharding`` will configure."""
    if isinstance(node, ShardingFilter):
        return True
    return hasattr(node, "apply_sharding") and inspect.ismethod(node.apply_sharding)


def sharding_pipes(datapipe: TorchIterDataPipe) -> list[TorchIterDataPipe | TorchMapDataPipe]:
    return [node for node in all_pipes(datapipe) if is_sharding_pipe(node)]


def probe_target(datapipe: TorchIterDataPipe) -> Any:
    """The graph's only sharding pipe when it is torch's plain ``sharding_filter`` (whose
    position the probe can observe), else None."""
    points = sharding_pipes(datapipe)
    if len(points) == 1 and type(points[0]) is ShardingFilter:
        return points[0]
    return None


def install_probe(point: Any) -> PositionProbe:
    """Put a :class:`PositionProbe` in front of ``point`` (once) and return it."""
    source = point.source_datapipe
    if isinstance(source, PositionProbe):
        return source
    probe = PositionProbe(source)
    point.source_datapipe = probe
    return probe


def per_item_after(datapipe: TorchIterDataPipe, point: Any) -> bool:
    """Whether the chain from ``point`` down to ``datapipe`` has one input per node and only
    :data:`PER_ITEM_TORCH_OPS` (so outputs follow the sharding point's order, item by item)."""
    graph = traverse_dps(datapipe)
    while True:
        if len(graph) != 1:
            return False
        node, upstream = next(iter(graph.values()))
        if node is point:
            return True
        if not isinstance(node, (*PER_ITEM_TORCH_OPS, PositionProbe)):
            return False
        graph = upstream


def forward_sharding(datapipe: TorchIterDataPipe, levels: dict[int, tuple[int, int]]) -> None:
    """Apply conveyor's sharding levels (``{priority: (num_shards, shard_index)}``, conveyor's
    priority numbers) to the torch graph, each under torch's group of the same name."""
    for priority in sorted(levels):
        num_shards, shard_index = levels[priority]
        group = torch_priority(priority)
        if group == TORCH_PRIORITIES.DEFAULT and num_shards == 1:
            continue  # nothing to split, and torch refuses DEFAULT next to other groups
        apply_sharding(datapipe, num_shards, shard_index, group)


def torch_priority(priority: int) -> TORCH_PRIORITIES:
    return TORCH_PRIORITIES[SHARDING_PRIORITIES(priority).name]


def combined_shard(levels: dict[int, tuple[int, int]]) -> tuple[int, int]:
    """``(num_shards, shard_index)`` of all levels together, nested as torch nests them: the
    highest priority (MULTIPROCESSING) varies fastest, so item ``i`` is kept when
    ``i % num_shards == shard_index``."""
    total, index = 1, 0
    for priority in sorted(levels, reverse=True):
        num_shards, shard_index = levels[priority]
        index += total * shard_index
        total *= num_shards
    return total, index


def seed_graph(datapipe: TorchIterDataPipe, seed: int) -> None:
    """Seed every random torch pipe (``shuffle``, ...) of the graph from ``seed``, as torch's
    DataLoader does with its shared seed: identical in every worker and rank."""
    generator = torch.Generator()
    generator.manual_seed(seed)
    apply_random_seed(datapipe, generator)
