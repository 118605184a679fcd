"""``DistributedReadingService``: one loader per rank of a ``torch.distributed`` job.

Each rank keeps its ``DISTRIBUTED`` shard of the graph; each epoch every rank adopts rank
0's base seed (broadcast), so random ops before the sharding point draw alike on every
rank and those after it draw by item position; and a :class:`~conveyor.pipes.FullSync` at
the end makes every rank yield the same number of items (``epoch_end``), so uneven shards
never hang a training step's collective. All of it runs over a gloo group of its own,
created in ``initialize`` and destroyed in ``finalize``, so it works beside an NCCL group.

Checkpoints: ``DataLoader2.state_dict()``, called on every rank at the same step, holds
every rank's part (:mod:`conveyor.distributed.rank_parts`), and each rank loads its own part; a part
loaded on another rank is refused. On another world size the loader merges the parts
(:meth:`DistributedReadingService.merge_rank_states`, which also takes the ranks' states
one by one) into one that each rank of the new job loads (see
:mod:`conveyor.reading_service.elastic`).

Alone it reads the graph in the calling process. Placed before a multiprocessing service
in a :class:`SequentialReadingService`, it shards and seeds the graph for that service,
whose workers then split the rank's shard; seeds derive by rank, then by worker.
"""

from __future__ import annotations

import copy
from typing import Any

from conveyor.core.base import DataPipe, IterDataPipe
from conveyor.core.graph import SHARDING_PRIORITIES, apply_random_seed, apply_sharding
from conveyor.core.passes import State
from conveyor.core.random import SeedGenerator
from conveyor.core.validation import require_keys
from conveyor.distributed import rank_parts
from conveyor.distributed.collectives import RankGroup, require_process_group
from conveyor.errors import GraphError, StateError
from conveyor.pipes.fullsync import FullSync, FullSyncSummary, check_fullsync_args
from conveyor.reading_service import elastic
from conveyor.reading_service.interface import CheckpointableReadingServiceInterface, IterResetFn

_MASK32 = (1 << 32) - 1


class DistributedReadingService(CheckpointableReadingServiceInterface):
    """Shards the graph by rank, shares rank 0's seed, and agrees on each epoch's end.

    Args:
        timeout: seconds any collective may wait for the other ranks; a rank that died
            or stalled becomes a :class:`~conveyor.errors.DistributedError` after it.
        epoch_end: ``"drop"`` (stop when the first rank runs out, as torchdata's
            FullSync) or ``"pad"`` (repeat items until the last rank runs out).
        window: items each rank reads ahead per agreement on the epoch's end.

    Needs ``torch.distributed.init_process_group`` to have run (any backend).
    """

    def __init__(self, timeout: float = 1800, epoch_end: str = "drop", window: int = 32):
        check_fullsync_args(timeout, epoch_end, window)
        self.timeout = timeout
        self.epoch_end = epoch_end
        self.window = window
        self._group: RankGroup | None = None
        self._end: FullSync | None = None
        self._elastic = False  # whether the graph can resume on another world size
        self._resuming: dict[str, Any] | None = None  # a merged state restore() took, for the next epoch ...
        self._resumed: dict[str, Any] | None = None  # ... and for the epoch in progress (its checkpoints say so)

    @property
    def rank(self) -> int:
        return self._require_group().rank

    @property
    def world_size(self) -> int:
        return self._require_group().world_size

    @property
    def last_epoch_summary(self) -> FullSyncSummary | None:
        """How the last finished epoch ended on this rank (items, dropped, padded)."""
        return self._end.last_summary if self._end is not None else None

    # --- lifecycle -----------------------------------------------------------------------

    def initialize(self, datapipe: DataPipe) -> DataPipe:
        if not isinstance(datapipe, IterDataPipe):
            raise TypeError(f"DistributedReadingService takes an IterDataPipe, got {type(datapipe).__name__}")
        self.finalize()  # initialized again (after a failed set-up, say): release the old group first
        end = self._with_fullsync(datapipe)
        self._group = group = RankGroup.create(self.timeout, "DistributedReadingService")
        try:
            apply_sharding(datapipe, group.world_size, group.rank, SHARDING_PRIORITIES.DISTRIBUTED)
        except BaseException:
            self.finalize()
            raise
        end.use_group(group)
        self._end = end
        self._elastic = elastic.elastic_refusal(end.source, []) is None
        return end

    def initialize_iteration(
        self, seed_generator: SeedGenerator, iter_reset_fn: IterResetFn | None = None
    ) -> IterResetFn | None:
        group, end = self._require_group(), self._require_end()
        base = seed_generator.base_seed
        high, low, epoch = group.broadcast_from_rank0(
            [base >> 32, base & _MASK32, seed_generator.epoch], "DistributedReadingService sharing rank 0's seed"
        )
        if epoch != seed_generator.epoch:
            raise StateError(
                f"rank {group.rank} starts epoch {seed_generator.epoch} but rank 0 starts epoch {epoch}: the ranks' "
                "loaders are out of step (each rank must load the state saved on that rank, at the same step)"
            )
        seed_generator.adopt_base_seed(high << 32 | low)
        seed_generator.spawn(group.rank, inplace=True)
        apply_random_seed(end, seed_generator)
        end.use_group(group, epoch)
        self._resumed, self._resuming = self._resuming, None
        return iter_reset_fn

    def epoch_length(self, datapipe: DataPipe) -> int:
        """This rank's items per epoch: its shard's length, the shortest rank's with
        ``epoch_end="drop"`` and the longest's with ``"pad"`` (every rank yields as many)."""
        dist = require_process_group("DistributedReadingService's epoch_length")
        world_size = dist.get_world_size()
        graph = datapipe.source if isinstance(datapipe, FullSync) else datapipe
        lengths = []
        for rank in range(world_size):
            shard = copy.deepcopy(graph)
            apply_sharding(shard, world_size, rank, SHARDING_PRIORITIES.DISTRIBUTED)
            lengths.append(len(shard))
        return min(lengths) if self.epoch_end == "drop" else max(lengths)

    def resumed_epoch_length(self, datapipe: DataPipe, state: Any) -> int | None:
        """For a state merged on another world size: the items each old rank handed out
        before the checkpoint (trainers restore that count as the epoch's steps done), and
        this job's share of the positions left, the shortest rank's with ``"drop"``, the
        longest's with ``"pad"``. None for a rank's own state."""
        if not elastic.is_elastic(state):
            return None
        merged = elastic.check_elastic_part(state, "DistributedReadingService state")
        dist = require_process_group("DistributedReadingService's resumed_epoch_length")
        world_size = dist.get_world_size()
        graph = datapipe.source if isinstance(datapipe, FullSync) else datapipe
        shares = []
        for rank in range(world_size):
            shard = copy.deepcopy(graph)
            apply_sharding(shard, world_size, rank, SHARDING_PRIORITIES.DISTRIBUTED)
            shares.append(len(shard))
        positions = sum(shares)
        left = [
            share - merged.handed_out.count_in_share(rank, world_size, positions) for rank, share in enumerate(shares)
        ]
        return merged.items // merged.world_size + (min(left) if self.epoch_end == "drop" else max(left))

    def finalize(self) -> None:
        group, self._group = self._group, None
        if self._end is not None:
            self._end.use_group(None)
        self._end = None
        if group is not None:
            group.destroy()

    # --- checkpoints ---------------------------------------------------------------------

    def checkpoint(self) -> dict[str, Any]:
        """This rank, the world size, whether the graph can resume on another world size
        (``per_item``) and, in an epoch resumed from a merged state, what it resumed after."""
        group = self._require_group()
        self._require_end()
        state: dict[str, Any] = {"rank": group.rank, "world_size": group.world_size, "per_item": self._elastic}
        if self._resumed is not None:
            state["resumed"] = copy.deepcopy(self._resumed)
        return state

    @staticmethod
    def merge_rank_states(states: list[Any]) -> dict[str, Any]:
        """Combine the ``DataLoader2.state_dict()`` of every rank (in any order), saved at
        the same step, into one topology-free, JSON-safe state: every rank of a job of any
        world size (with any worker counts) loads it with ``load_state_dict`` and the job
        hands out every remaining item of the epoch once. Pipelines whose ops after the
        sharding point are per-item only; others raise :class:`~conveyor.errors.StateError`
        (see :mod:`conveyor.reading_service.elastic`). A state that holds every rank's
        part (``state_dict()`` under ``torch.distributed``: :mod:`conveyor.distributed.rank_parts`)
        counts as the parts it holds."""
        return elastic.merge_rank_states(rank_parts.each_part(states))

    def preview(self, datapipe: DataPipe) -> DataPipe | None:
        """A copy of the graph ending in this service's fullsync."""
        if not isinstance(datapipe, IterDataPipe):
            raise TypeError(f"DistributedReadingService takes an IterDataPipe, got {type(datapipe).__name__}")
        return self._with_fullsync(copy.deepcopy(datapipe))

    def validate_checkpoint(self, datapipe: DataPipe, state: Any) -> None:
        where = "DistributedReadingService state"
        if elastic.is_elastic(state):
            elastic.check_elastic_part(state, where)
            require_process_group("DistributedReadingService")
            return
        optional = {
            key: kind for key, kind in (("per_item", bool), ("resumed", dict)) if type(state) is dict and key in state
        }
        require_keys(
            state, {"rank": int, "world_size": int, **optional}, where
        )  # 'per_item' is absent from older states
        dist = require_process_group("DistributedReadingService")
        rank, world_size = dist.get_rank(), dist.get_world_size()
        if (state["rank"], state["world_size"]) != (rank, world_size):
            raise StateError(
                f"{where}: saved on rank {state['rank']} of {state['world_size']}, loaded on rank {rank} of "
                f"{world_size}; each rank must load the state it saved, with the same world size"
            )

    def restore(self, datapipe: DataPipe, state: Any) -> DataPipe:
        self.validate_checkpoint(datapipe, state)
        end = self.initialize(datapipe)
        if elastic.is_elastic(state):
            merged = elastic.check_elastic_part(state, "DistributedReadingService state")
            self._resuming = {"items": merged.items, "handed_out": merged.handed_out.as_state()}
        elif "resumed" in state:  # this rank's own state, saved in an epoch resumed from a merged one
            self._resuming = copy.deepcopy(state["resumed"])
        return end

    def adapt_pipeline_state(
        self, datapipe: DataPipe, pipeline: State | None, position: list[int] | None, state: Any
    ) -> State | None:
        """A merged state (:meth:`merge_rank_states`) becomes this graph's: the first of
        the remaining positions' upstream state, at a window boundary of the fullsync."""
        if not elastic.is_elastic(state):
            return pipeline
        if not isinstance(datapipe, IterDataPipe):
            raise TypeError(f"DistributedReadingService takes an IterDataPipe, got {type(datapipe).__name__}")
        where = "DistributedReadingService state"
        return elastic.resumed_pipeline(datapipe, elastic.check_elastic_part(state, where), where)

    def _with_fullsync(self, datapipe: IterDataPipe) -> FullSync:
        """The graph ending in a FullSync: the user's own (whose settings must then be the
        service's: one of them would be ignored), or one with this service's settings."""
        if not isinstance(datapipe, FullSync):
            return FullSync(datapipe, self.timeout, self.epoch_end, self.window)
        if (self.timeout, self.epoch_end, self.window) != (datapipe.timeout, datapipe.epoch_end, datapipe.window):
            raise GraphError(
                f"the graph ends with {datapipe!r} but DistributedReadingService has timeout={self.timeout}, "
                f"epoch_end={self.epoch_end!r}, window={self.window}; set them in one place (drop the "
                ".fullsync() and pass them to the service, or give the service the same ones)"
            )
        return datapipe

    def _require_group(self) -> RankGroup:
        if self._group is None:
            raise RuntimeError("DistributedReadingService is not initialized; iterate the loader first")
        return self._group

    def _require_end(self) -> FullSync:
        if self._end is None:
            raise RuntimeError("DistributedReadingService is not initialized; iterate the loader first")
        return self._end
