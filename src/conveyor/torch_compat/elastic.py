"""Resuming a ``conveyor.DataLoader`` on another number of ranks, when each rank's batches
came from torch's ``DistributedSampler`` (as Lightning injects it, or a DDP script passes
it) or from Accelerate's ``BatchSamplerShard`` (as ``Accelerator.prepare()`` shards it).

Every rank's mid-epoch state records what its sampler was (for ``DistributedSampler``:
dataset length, replicas, rank, seed, epoch, shuffle, drop_last; for Accelerate's shard:
its processes and options over a plain ``RandomSampler`` or ``SequentialSampler``) and the
batch sampler's size, beside how many batches it handed out and the RNG state the epoch's
order was drawn from. That is enough to rebuild each old rank's batches with the
framework's own sampler and so the items still to come. On ``W`` new ranks, new rank
``j`` reads ``remaining[j::W]``, in as many batches as every other new rank (DDP steps
together): full where the items divide evenly, else some smaller, so every remaining item
is read once (only a rank with fewer items than steps repeats some, as
``DistributedSampler`` pads). The resumed epoch reads these keys (an explicit list in the
sampler's part of the state, so a checkpoint inside that epoch resumes it too), with
``before``, the batches each old rank had handed out (a trainer restores that many steps
done, and ``len()`` counts them); the epochs after it come from the new ranks' own sampler.
"""

from __future__ import annotations

import copy
from typing import Any

from conveyor.core.torch_support import require_torch
from conveyor.errors import StateError
from conveyor.pipes.torch.sampler_source import decode_rng

_WHERE = "DataLoader state"


def distributed_record(index_source: Any) -> dict[str, Any] | None:
    """What an epoch's ``DistributedSampler`` is, when the loader's keys come from one
    (directly, or inside a ``BatchSampler``), or Accelerate's ``BatchSamplerShard`` (see
    :func:`_accelerate_record`); ``None`` otherwise."""
    torch = require_torch("conveyor.DataLoader")
    if type(index_source).__name__ == "BatchSamplerShard":
        return _accelerate_record(index_source, torch)
    inner = getattr(index_source, "sampler", index_source)
    if not isinstance(inner, torch.utils.data.DistributedSampler):
        return None
    batched = inner is not index_source
    return {
        "length": len(inner.dataset),
        "num_replicas": int(inner.num_replicas),
        "rank": int(inner.rank),
        "seed": int(inner.seed),
        "epoch": int(inner.epoch),
        "shuffle": bool(inner.shuffle),
        "drop_last": bool(inner.drop_last),
        "batch_size": int(index_source.batch_size) if batched else None,
        "batch_drop_last": bool(index_source.drop_last) if batched else False,
    }


def _accelerate_record(shard: Any, torch: Any) -> dict[str, Any] | None:
    """What Accelerate's ``BatchSamplerShard`` is, over torch's ``BatchSampler`` of a plain
    ``RandomSampler`` (whose generator every process shares from rank 0) or
    ``SequentialSampler``: the epoch's batches are drawn again from the origin RNG state
    the part records, and sharded again with Accelerate's own class."""
    from accelerate.data_loader import BatchSamplerShard

    batches = shard.batch_sampler
    sampler: Any = getattr(batches, "sampler", None)
    if not isinstance(shard, BatchSamplerShard) or type(batches) is not torch.utils.data.BatchSampler:
        return None
    plain_random = (
        type(sampler) is torch.utils.data.RandomSampler
        and not sampler.replacement
        and sampler.num_samples == len(sampler.data_source)
    )
    if not (plain_random or type(sampler) is torch.utils.data.SequentialSampler):
        return None
    return {
        "kind": "accelerate",
        "length": len(sampler.data_source),
        "num_replicas": int(shard.num_processes),
        "rank": int(shard.process_index),
        "shuffle": plain_random,
        "split_batches": bool(shard.split_batches),
        "even_batches": bool(shard.even_batches),
        "batch_size": int(batches.batch_size),
        "batch_drop_last": bool(batches.drop_last),
    }


def merge_for_rank(parts: list[dict[str, Any]], rank: int, world_size: int) -> dict[str, Any]:
    """The state new rank ``rank`` of ``world_size`` resumes from, given every old rank's
    part (in rank order). Raises :class:`StateError` for states it cannot split again."""
    if all(part.get("epoch") is None for part in parts):
        return copy.deepcopy(parts[rank % len(parts)])  # between epochs: the next one is the new ranks' own
    records = []
    for index, part in enumerate(parts):
        sampler = part.get("sampler") or {}
        record = sampler.get("distributed")
        if part.get("epoch") is None or record is None or "keys" in sampler:
            why = "is between epochs" if part.get("epoch") is None else "was not read through a DistributedSampler"
            raise StateError(
                f"{_WHERE}: rank {index}'s part {why}; a conveyor.DataLoader resumes on another world size only "
                "mid-epoch over torch's DistributedSampler (or between epochs on every rank): resume it with the "
                "world size it was saved with"
            )
        records.append(record)
    first = {key: value for key, value in records[0].items() if key != "rank"}
    for index, record in enumerate(records):
        if {key: value for key, value in record.items() if key != "rank"} != first or record["rank"] != index:
            raise StateError(
                f"{_WHERE}: rank {index}'s DistributedSampler differs from rank 0's, or is not rank {index}"
            )
    if first["num_replicas"] != len(parts):
        raise StateError(
            f"{_WHERE}: the samplers had {first['num_replicas']} replicas but {len(parts)} ranks saved parts"
        )
    remaining: list[int] = []
    for index, part in enumerate(parts):
        batches = _old_batches(first, index, part["sampler"]["rng"])
        remaining += [key for batch in batches[part["sampler"]["yielded"] :] for key in batch]
    keys = _new_batches(remaining, first, rank, world_size)
    mine = copy.deepcopy(parts[rank % len(parts)])
    # An epoch to begin from these keys: no inner loader's position (it meant nothing on
    # the new ranks), the base seed of the part it came from.
    # ``before``: what each old rank handed out, which a trainer restores as steps done.
    before = max(part["sampler"]["yielded"] for part in parts)
    mine["sampler"] = {"rng": mine["sampler"]["rng"], "yielded": 0, "keys": keys, "before": before}
    mine["epoch"] = None
    return mine


def _old_batches(record: dict[str, Any], rank: int, origin: str) -> list[list[int]]:
    """Old rank ``rank``'s batches of keys, drawn again by torch's own sampler (and
    Accelerate's shard, from the epoch's ``origin`` RNG state)."""
    torch = require_torch("conveyor.DataLoader")
    if record.get("kind") == "accelerate":
        from accelerate.data_loader import BatchSamplerShard

        every = range(record["length"])
        generator = torch.Generator()
        generator.set_state(decode_rng(origin))
        order = torch.utils.data.RandomSampler(every, generator=generator) if record["shuffle"] else every
        batched = torch.utils.data.BatchSampler(order, record["batch_size"], record["batch_drop_last"])
        shard = BatchSamplerShard(
            batched, record["num_replicas"], rank, record["split_batches"], record["even_batches"]
        )
        return [list(batch) for batch in shard]
    sampler = torch.utils.data.DistributedSampler(
        range(record["length"]),
        num_replicas=record["num_replicas"],
        rank=rank,
        shuffle=record["shuffle"],
        seed=record["seed"],
        drop_last=record["drop_last"],
    )
    sampler.set_epoch(record["epoch"])
    keys = list(sampler)
    return _batched(keys, record["batch_size"], record["batch_drop_last"])


def _new_batches(remaining: list[int], record: dict[str, Any], rank: int, world_size: int) -> list[Any]:
    """New rank ``rank``'s keys: ``remaining[rank::world_size]``, in as many batches as
    every other new rank reads (DDP steps together). Batches are full where the items
    divide evenly, else some hold fewer (never more) than ``batch_size``: every item once.
    Only a rank with fewer items than steps repeats items from the head (as
    ``DistributedSampler`` pads), and under ``drop_last`` batches stay whole and the
    items that fill no batch on every rank are dropped, as torch drops them."""
    if not remaining:
        return []
    size, drop_last = record["batch_size"], record["batch_drop_last"]
    if size is None or drop_last:
        per_rank = -(-len(remaining) // world_size)
        padded = remaining + (remaining * per_rank)[: per_rank * world_size - len(remaining)]
        mine = padded[rank::world_size]
        return mine if size is None else _batched(mine, size, drop_last)
    steps = -(-len(remaining) // (world_size * size))
    mine = remaining[rank::world_size]
    if len(mine) < steps:
        mine = mine + (remaining * steps)[: steps - len(mine)]
    # `steps` batches of at most `size` keys, as full as they can be with none empty.
    batches, start = [], 0
    for step in range(steps):
        take = min(size, len(mine) - start - (steps - step - 1))
        batches.append(mine[start : start + take])
        start += take
    return batches


def _batched(keys: list[int], size: int | None, drop_last: bool) -> list[Any]:
    if size is None:
        return list(keys)
    batches = [keys[start : start + size] for start in range(0, len(keys), size)]
    if drop_last and batches and len(batches[-1]) < size:
        batches.pop()
    return batches
