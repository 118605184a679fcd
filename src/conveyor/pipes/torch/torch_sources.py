"""Sources from torch: ``torch.utils.data`` datasets and datapipe graphs as conveyor pipes.

:func:`from_torch` picks the wrapper:

* a map-style ``torch.utils.data.Dataset`` (``__getitem__`` and ``__len__``, torch's
  ``MapDataPipe`` too) becomes a :class:`TorchMapDataset`, a random-access conveyor pipe;
* a ``torch.utils.data.datapipes`` ``IterDataPipe`` graph becomes a :class:`TorchDataPipe`,
  which seeds the graph's random pipes from the loader's seeds and honours its own
  ``sharding_filter``;
* any other ``IterableDataset`` becomes a :class:`TorchIterableDataset`.

None of this imports torch: an object can only be a torch dataset once torch is imported,
so the checks look at ``sys.modules``. ``DataLoader2(obj)`` wraps torch objects with
:func:`from_torch` itself.

Sharding a torch graph
----------------------
Conveyor finds sharding points by walking its own graph; a torch graph is one conveyor
node, so a :class:`TorchDataPipe` whose graph contains a torch sharding pipe is itself a
:class:`~conveyor.core.op_roles.ShardingPoint`. When a reading service shards it, the wrapper
forwards each level into the torch graph with ``torch.utils.data.graph_settings.apply_sharding``
under torch's group of the same name (DEFAULT, DISTRIBUTED, MULTIPROCESSING), so the torch
``sharding_filter`` (and its ``sharding_group_filter``) decides, as it would under torch.

Torch nests the groups the other way round from conveyor. With ``W`` ranks and ``n``
workers per rank, torch keeps item ``i`` in worker ``i % n`` of rank ``(i // n) % W``;
conveyor's own ``sharding_filter`` keeps it in rank ``i % W``, worker ``(i // W) % n``.
Both are disjoint and complete; the difference is that with torch's nesting the set of
items a *rank* receives depends on its number of workers (with one rank, ``W == 1``, the
two agree). The wrapper keeps torch's semantics for torch graphs.

Positions: when the torch graph has a single plain ``sharding_filter``, the wrapper puts a
transparent probe in front of it and reports each item's index there as its position
(its pass's ``position()``), with a sub-index for further outputs made from the same item
(``unbatch``). When the torch ops after the filter are per-item (``map``, ``filter``,
``collate``, ``unbatch``), conveyor's in-order multiprocessing merge then yields the
single-process order for every ``num_workers``, and a checkpoint resumes on another worker
count. Otherwise (a custom sharding pipe, several filters, or ops that group items after
the filter) positions are counted per shard, output still is deterministic for a given
configuration, and a checkpoint resumes with the same sharding only.

Resuming: torch pipes keep no conveyor state, so the torch wrappers resume by replaying
their pass (same seed, so the same items) and dropping what was already handed out.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

from conveyor.core.base import DataPipe, IterDataPipe, MapDataPipe
from conveyor.core.op_roles import RandomOp, ShardingPoint
from conveyor.core.passes import Pass, PassContext, Position, State
from conveyor.core.sharding import check_share, sharding_level
from conveyor.core.torch_support import loaded_torch
from conveyor.errors import GraphError, StateError
from conveyor.pipes.torch.torch_iterable import TorchIterableDataset

_SEED_BOUND = 1 << 63


def is_torch_data(obj: Any) -> bool:
    """Whether ``obj`` is a ``torch.utils.data.Dataset`` (map-style, iterable or a datapipe)."""
    torch = loaded_torch()
    return torch is not None and isinstance(obj, torch.utils.data.Dataset)


def from_torch(obj: Any) -> DataPipe:
    """The conveyor pipe for a torch dataset or datapipe graph (a conveyor pipe is returned as is).

    ``IterDataPipe`` graph -> :class:`TorchDataPipe`; other ``IterableDataset`` ->
    :class:`TorchIterableDataset`; map-style ``Dataset`` -> :class:`TorchMapDataset`.

    Args:
        obj: A torch ``Dataset``, ``IterableDataset`` or ``IterDataPipe`` graph, or a conveyor pipe.
    """
    if isinstance(obj, DataPipe):
        return obj
    torch = loaded_torch()
    if torch is not None:
        data = torch.utils.data
        if isinstance(obj, data.IterDataPipe):
            return TorchDataPipe(obj)
        if isinstance(obj, data.IterableDataset):
            return TorchIterableDataset(obj)
        if isinstance(obj, data.Dataset):
            return TorchMapDataset(obj)
    raise TypeError(
        "from_torch takes a torch.utils.data Dataset, IterableDataset or IterDataPipe (or a conveyor "
        f"pipe), got {type(obj).__name__}"
    )


class TorchMapDataset(MapDataPipe):
    """A map-style ``torch.utils.data.Dataset`` as a random-access pipe: ``pipe[i]`` is
    ``dataset[i]`` for ``0 <= i < len(dataset)`` (negative indices count from the end).

    Random access is what conveyor's ``MapDataPipe`` ops need (a keyed global shuffle,
    O(1) resume), so the dataset must have ``__len__``, as torch's samplers require too.

    Args:
        dataset: A map-style torch ``Dataset`` with ``__len__``.
    """

    _params = ("dataset",)

    def __init__(self, dataset: Any):
        torch = loaded_torch()
        data = torch.utils.data if torch is not None else None
        if data is None or not isinstance(dataset, data.Dataset) or isinstance(dataset, data.IterableDataset):
            raise TypeError(f"TorchMapDataset takes a map-style torch Dataset, got {type(dataset).__name__}")
        self.dataset = dataset

    def __getitem__(self, index: int) -> Any:
        if isinstance(index, bool) or not isinstance(index, int):
            raise TypeError(f"{self!r} takes int indices, got {type(index).__name__}")
        length = len(self)
        position = index + length if index < 0 else index
        if not 0 <= position < length:
            raise IndexError(f"index {index} out of range for {self!r} of length {length}")
        return self.dataset[position]

    def __len__(self) -> int:
        try:
            return len(self.dataset)
        except TypeError:
            raise TypeError(
                f"{self!r}: its {type(self.dataset).__name__} has no __len__; a map-style dataset needs one "
                "to be iterated (wrap an iterable dataset instead, or give it __len__)"
            ) from None


class TorchDataPipePass(Pass):
    """Seeds the torch graph from this pass's share of the loader's seeds (keyed by the
    rounds of enclosing cycles), then reads it; ``count``: the torch graph's outputs read.

    Torch graphs are objects torch mutates as they run (seeds, its own iterator checks),
    so they are the one part of a conveyor graph that two passes share: torch invalidates
    the older iterator when a newer one starts."""

    def __init__(self, pipe: TorchDataPipe, state: State | None, context: PassContext):
        super().__init__(pipe, context)
        self.count = 0
        self._skip = state["count"] if state is not None else 0
        self._randomness = pipe.randomness()
        self.items = self._read(pipe)

    def _seed(self, pipe: TorchDataPipe) -> None:
        from conveyor.core._torch_graph import seed_graph

        rounds = self.context.rounds
        seed = int(self._randomness.generator(*rounds, 0).integers(0, _SEED_BOUND))
        seed_graph(pipe.datapipe, seed)

    def _read(self, pipe: TorchDataPipe) -> Iterator[Any]:
        self._seed(pipe)
        skip = self._skip
        self.count = 0
        for item in pipe.datapipe:
            self.count += 1
            if self.count <= skip:
                continue
            yield item

    def state(self) -> State:
        return {"count": max(self.count, self._skip)}

    def yielded(self) -> int:
        return max(0, self.count - self._skip)


class TorchDataPipe(IterDataPipe, RandomOp):
    """A ``torch.utils.data.datapipes`` ``IterDataPipe`` graph as one conveyor source.

    Each pass seeds the torch graph's random pipes (``shuffle``, ...) from this op's share
    of the loader's seeds: identical in every worker and rank (so a torch ``shuffle``
    before the ``sharding_filter`` shuffles alike everywhere, as torch's shared seed does),
    new each epoch, reproducible from the loader's seed.

    If the graph contains a torch sharding pipe, the instance is a
    :class:`ShardedTorchDataPipe` (a sharding point that forwards conveyor's sharding into
    the torch graph: see the module documentation); otherwise every worker reads every
    item, and a conveyor ``.sharding_filter()`` after this pipe splits them.

    Args:
        datapipe: The last pipe of a ``torch.utils.data.datapipes`` ``IterDataPipe`` graph.
    """

    _params = ("datapipe",)
    pass_type: ClassVar[type[TorchDataPipePass]] = TorchDataPipePass
    state_fields = {"count": int}

    def __new__(cls, datapipe: Any = None) -> TorchDataPipe:
        # The class follows the graph: only graphs with a torch sharding pipe may be
        # conveyor sharding points (a conveyor sharding_filter after an unsharded torch
        # graph must remain the graph's only sharding point). Unpickling passes no graph.
        if cls is TorchDataPipe and datapipe is not None and _has_torch_sharding(datapipe):
            cls = ShardedTorchDataPipe
        return super().__new__(cls)

    def __init__(self, datapipe: Any):
        torch = loaded_torch()
        if torch is None or not isinstance(datapipe, torch.utils.data.IterDataPipe) or isinstance(datapipe, DataPipe):
            raise TypeError(f"TorchDataPipe takes a torch.utils.data IterDataPipe graph, got {type(datapipe).__name__}")
        self.datapipe = datapipe

    def __len__(self) -> int:
        try:
            return len(self.datapipe)
        except TypeError:
            raise self._no_length(f"its torch graph ({type(self.datapipe).__name__}) has no len()") from None


class ShardedTorchDataPipePass(TorchDataPipePass):
    """Positions come from a probe before the torch ``sharding_filter`` when the graph has
    one plain filter; otherwise they are counted per shard. A resume skips outputs up to
    the saved position (``last``), which with a probed, per-item graph also works in
    another shard."""

    def __init__(self, pipe: ShardedTorchDataPipe, state: State | None, context: PassContext):
        from conveyor.core._torch_graph import combined_shard

        self._shards = combined_shard(pipe._levels)
        self._after = tuple(state["last"]) if state is not None and state["last"] is not None else None
        if state is not None and state["last"] is not None:
            _, portable = pipe.observe()
            total, index = self._shards
            if not portable and state["shards"] != [total, index]:
                raise StateError(
                    f"{pipe!r}: the state was saved in shard {state['shards'][1]} of {state['shards'][0]}, "
                    f"this is shard {index} of {total}; this torch graph resumes in the same shard only "
                    "(its positions are counted per shard). Resume with the same number of workers and ranks"
                )
        self._last: Position | None = self._after
        super().__init__(pipe, state, context)

    def _read(self, pipe: TorchDataPipe) -> Iterator[Any]:
        assert isinstance(pipe, ShardedTorchDataPipe)
        self._seed(pipe)
        total, index = self._shards
        probe, _ = pipe.observe()
        after = self._after
        self.count = 0
        previous, sub = -1, 0
        for item in pipe.datapipe:
            if probe is not None:
                at = probe.last
                if at != previous:
                    previous, sub = at, 0
                    position: Position = (at,)
                else:
                    sub += 1
                    position = (at, sub)
            else:
                position = (index + self.count * total,)
            self.count += 1
            if after is not None and position <= after:
                continue
            self._last = position
            yield item

    def state(self) -> State:
        total, index = self._shards
        last = list(self._last) if self._last is not None else None
        return {"count": max(self.count, self._skip), "last": last, "shards": [total, index]}

    def position(self) -> Position | None:
        return self._last


class ShardedTorchDataPipe(TorchDataPipe, ShardingPoint):
    """A :class:`TorchDataPipe` whose torch graph has a sharding pipe: conveyor's sharding
    point for that graph. Built by ``TorchDataPipe(graph)`` / :func:`from_torch`."""

    pass_type = ShardedTorchDataPipePass
    adds_sub_positions = True
    state_fields = {"count": int, "last": (list, type(None)), "shards": list}

    def __init__(self, datapipe: Any):
        super().__init__(datapipe)
        self._levels: dict[int, tuple[int, int]] = {}
        self._probe: Any = None  # the PositionProbe in the torch graph, once installed
        self._point: Any = None  # the torch sharding_filter it observes

    def apply_sharding(self, num_of_instances: int, instance_id: int, sharding_group: Any = 0) -> None:
        from conveyor.core._torch_graph import forward_sharding

        check_share(num_of_instances, instance_id)
        levels = {**self._levels, sharding_level(sharding_group): (num_of_instances, instance_id)}
        try:
            forward_sharding(self.datapipe, levels)
        except RuntimeError as err:  # torch refuses, e.g., DEFAULT next to another group
            raise GraphError(f"{self!r}: the torch graph refuses this sharding ({err})") from err
        self._levels = levels

    @property
    def sharding(self) -> list[tuple[int, int]]:
        """``(num_shards, shard_index)`` per level applied, in conveyor's priority order."""
        return [self._levels[p] for p in sorted(self._levels)]

    def observe(self) -> tuple[Any, bool]:
        """``(probe or None, whether positions survive a change of shards)``; the probe is
        installed in the torch graph once (part of setting the graph up, like sharding)."""
        from conveyor.core._torch_graph import install_probe, per_item_after, probe_target

        if self._probe is None:
            point = probe_target(self.datapipe)
            if point is None:
                return None, False
            self._point, self._probe = point, install_probe(point)
        return self._probe, per_item_after(self.datapipe, self._point)

    def check_own_state(self, state: Mapping[str, Any], where: str) -> None:
        last = state["last"]
        if last is not None and (not last or not all(type(v) is int and v >= 0 for v in last)):
            raise StateError(f"{where}: 'last' must be a non-empty list of ints >= 0 or None")
        shards = state["shards"]
        if len(shards) != 2 or not all(type(v) is int for v in shards) or not 0 <= shards[1] < shards[0]:
            raise StateError(f"{where}: 'shards' must be [num_shards, shard_index]")


def _has_torch_sharding(datapipe: Any) -> bool:
    torch = loaded_torch()
    if torch is None or not isinstance(datapipe, torch.utils.data.IterDataPipe) or isinstance(datapipe, DataPipe):
        return False  # __init__ rejects it with a clear error
    from conveyor.core._torch_graph import sharding_pipes

    return bool(sharding_pipes(datapipe))
