"""How ``DataLoader2`` takes the user's graph: torch objects wrapped, a map-style graph
read by index, the loader's own copy, adapters applied, sharding points settled (a
source's own split that yields to the user's removed, a branch sharded twice refused),
pipes with several consumers refused, random ops numbered for their seeds, stages
numbered for skip records."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from conveyor.core.base import DataPipe, IterDataPipe, MapDataPipe
from conveyor.core.foreign import inputs_of
from conveyor.core.graph import assign_seed_ordinals, list_dps, remove_dp
from conveyor.core.sharding import own_split
from conveyor.core.sharding_points import check_sharded_once, yielding_splits
from conveyor.core.stages import STAGE_INDEX
from conveyor.errors import GraphError
from conveyor.loader.adapters import Adapter
from conveyor.pipes.branching import Hub
from conveyor.pipes.io.hf_datasets import HuggingFaceDataset, is_hf_dataset
from conveyor.pipes.torch.torch_sources import from_torch, is_torch_data


def loaders_graph(datapipe: Any, adapter_fn: Adapter | Iterable[Adapter] | None) -> IterDataPipe:
    """The graph a ``DataLoader2`` reads, made from what the user gave it."""
    if is_hf_dataset(datapipe):
        datapipe = HuggingFaceDataset(datapipe)
    elif not isinstance(datapipe, DataPipe) and is_torch_data(datapipe):
        datapipe = from_torch(datapipe)  # a torch Dataset, IterableDataset or datapipe graph
    if isinstance(datapipe, MapDataPipe):
        # As torch's samplers split a map-style Dataset: by index, each worker and rank
        # loading only its own items (unless an adapter adds a sharding point after it).
        datapipe = own_split(datapipe.to_iter_datapipe(), "DataLoader2's split of a map-style source by index")
    if not isinstance(datapipe, IterDataPipe):
        raise TypeError(
            "DataLoader2 takes an IterDataPipe or MapDataPipe (or a torch Dataset, IterableDataset or "
            f"IterDataPipe, or a Hugging Face datasets.Dataset), got {type(datapipe).__name__}"
        )
    graph = own_copy(datapipe, "the datapipe graph")
    for adapter in _adapters(adapter_fn):
        graph = adapter(graph)
    graph = settle_sharding(graph)
    _reject_shared_nodes(graph)
    assign_seed_ordinals(graph)
    assign_stage_indices(graph)
    return graph


def settle_sharding(graph: IterDataPipe) -> IterDataPipe:
    """The loader's graph with each source's own split that yields to a sharding point
    downstream removed (the user's point is then the only one: the merge, resumes and
    randomness follow it), checked for a branch sharded twice: refused here, in the main
    process, before any service or worker sees the graph (see
    :mod:`conveyor.core.sharding_points`)."""
    for split in yielding_splits(list_dps(graph)):
        graph = remove_dp(graph, split)
    check_sharded_once(list_dps(graph))
    return graph


def assign_stage_indices(graph: DataPipe) -> None:
    """Stamp each conveyor pipe with its index in the user's whole graph: the stage a
    skipped item's record names (:mod:`conveyor.core.stages`), the same in every
    process, however a service splits the graph."""
    for index, node in enumerate(list_dps(graph)):
        if isinstance(node, DataPipe):
            setattr(node, STAGE_INDEX, index)


def _adapters(adapter_fn: Adapter | Iterable[Adapter] | None) -> list[Adapter]:
    if adapter_fn is None:
        return []
    adapters = [adapter_fn] if callable(adapter_fn) else list(adapter_fn)
    for adapter in adapters:
        if not callable(adapter):
            raise TypeError(f"datapipe_adapter_fn takes Adapters, got {type(adapter).__name__}")
    return adapters


def replays(graph: Any) -> bool:
    """Whether every source of ``graph`` that iterates itself yields the same items again."""
    return all(getattr(node, "replayable", True) for node in list_dps(graph) if not inputs_of(node))


def own_copy(obj: Any, what: str) -> Any:
    try:
        return copy.deepcopy(obj)
    except Exception as err:
        raise TypeError(
            f"DataLoader2 needs its own copy of {what}, but it cannot be deep-copied "
            f"({type(err).__name__}: {err}). Keep open files, locks and sockets out of "
            "the graph; open them inside the pipes instead."
        ) from err


def _reject_shared_nodes(graph: DataPipe) -> None:
    """A pipe has one consumer, except a splitting op's hub (``fork``, ``demux``, ...),
    which its branches share."""
    consumers: dict[int, int] = {}
    for node in list_dps(graph):
        for upstream in {id(u): u for u in inputs_of(node)}.values():
            consumers[id(upstream)] = consumers.get(id(upstream), 0) + 1
            if consumers[id(upstream)] > 1 and not isinstance(upstream, Hub):
                raise GraphError(
                    f"{upstream!r} feeds several pipes; a pipe is read by one consumer. "
                    "Split it with .fork(n) (or demux, round_robin_demux, unzip) to read it from several branches."
                )
