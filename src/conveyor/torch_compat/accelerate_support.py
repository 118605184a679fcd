"""How ``conveyor.DataLoader`` takes part in Hugging Face Accelerate.

``Accelerator.prepare()`` rebuilds a torch ``DataLoader`` as one of its own (torch's engine,
its own state format) unless the loader says it is prepared already. A
``conveyor.DataLoader`` says so, so Accelerate registers it as it is; when ``prepare()``
then marks it prepared, it shards itself by process exactly as Accelerate shards torch's
loaders, with Accelerate's own ``BatchSamplerShard`` (map-style) or
``IterableDatasetShard`` (iterable), and sets a shuffling sampler's generator (one it
gives it, if it has none) to rank 0's state on every process (Accelerate's synchronized
generator), so that a generator per process still shards one order.
``save_state``/``load_state`` then save and load its ``state_dict()``, which holds every
process's part (:mod:`conveyor.distributed.rank_parts`).

Accelerate's defaults apply (``split_batches=False``, ``even_batches=True``); batches stay
where the loader makes them (on the CPU): move them with ``.to(accelerator.device)``.
"""

from __future__ import annotations

from typing import Any

from conveyor.core.torch_support import require_torch
from conveyor.torch_compat.arguments import LoaderArguments, resolve


class AccelerateParticipant:
    """What ``conveyor.DataLoader`` answers Accelerate: it is kept as it is by
    ``prepare()``, shards itself once ``prepare()`` marks it prepared, and is saved and
    loaded by ``save_state``/``load_state``."""

    _args: LoaderArguments
    generator: Any
    persistent_workers: bool
    batch_sampler: Any
    _accelerate_sharded = False  # Accelerator.prepare() made each process read its share

    #: Accelerate's ``save_state``/``load_state`` save and load this loader's ``state_dict()``.
    use_stateful_dataloader = True

    @property
    def _is_accelerate_prepared(self) -> bool:
        """Accelerate asks this before it rebuilds a loader as its own: this one is kept
        as it is (conveyor's engine and state format), and registered for checkpoints."""
        return True

    @_is_accelerate_prepared.setter
    def _is_accelerate_prepared(self, prepared: bool) -> None:
        # Accelerator.prepare() marks what it prepared: from the next epoch on, each
        # process reads its share, as Accelerate's own loaders would.
        if not prepared or self._accelerate_sharded:
            return
        self._accelerate_sharded = True
        args = self._args
        source = args.dataset if args.iterable else args.batch_sampler
        shard = accelerate_shards(source, args.iterable, args.batch_size, args.drop_last)
        if shard is None:
            return
        if args.iterable:
            dataset, batch_size, batch_sampler, drop_last = shard, args.batch_size, None, args.drop_last
        else:
            dataset, batch_size, batch_sampler, drop_last = args.dataset, 1, shard, False
        self._args = resolve(
            dataset,
            batch_size,
            None,
            None,
            batch_sampler,
            args.num_workers,
            args.collate_fn,
            drop_last,
            args.timeout,
            self.generator,
            args.prefetch_factor,
            self.persistent_workers,
        )
        object.__setattr__(self, "batch_sampler", self._args.batch_sampler)  # fixed for the user, not here


def accelerate_shards(sampler_or_dataset: Any, iterable: bool, batch_size: int | None, drop_last: bool) -> Any:
    """What the loader reads under Accelerate's processes (``None`` with one process):
    the iterable dataset or the batch sampler, sharded as Accelerate shards torch's."""
    from accelerate.data_loader import BatchSamplerShard, IterableDatasetShard
    from accelerate.state import PartialState

    state = PartialState()
    if state.num_processes <= 1:
        return None
    if iterable:
        return IterableDatasetShard(
            sampler_or_dataset,
            batch_size=batch_size or 1,
            drop_last=drop_last,
            num_processes=state.num_processes,
            process_index=state.process_index,
        )
    _synchronize_shuffle(sampler_or_dataset)
    return BatchSamplerShard(sampler_or_dataset, num_processes=state.num_processes, process_index=state.process_index)


def _synchronize_shuffle(batch_sampler: Any) -> None:
    """Set the generator of torch's ``RandomSampler`` to rank 0's state on every process
    (giving it one if it has none), so that every process draws the same order and takes
    its own share of it, as Accelerate synchronizes the generators of its own loaders."""
    torch = require_torch("conveyor.DataLoader under Accelerate")
    sampler = getattr(batch_sampler, "sampler", None)
    if not isinstance(sampler, torch.utils.data.RandomSampler):
        return
    generator = sampler.generator
    if generator is None:
        generator = torch.Generator()
        generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
    states = [generator.get_state()]
    torch.distributed.broadcast_object_list(states, src=0)
    generator.set_state(states[0])
    sampler.generator = generator
