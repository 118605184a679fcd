"""Resuming a ``conveyor.DataLoader`` on another number of ranks, when each rank's batches
came from torch's ``DistributedSampler`` (as Lightning injects it, or a DDP script passes
it).

Every rank's mid-epoch state records what its ``DistributedSampler`` was (dataset length,
replicas, rank, seed, epoch, shuffle, drop_last) and the batch sampler's size, beside how
many batches it handed out. That is enough to rebuild each old rank's batches with torch's
own sampler and so the items still to come. On ``W`` new ranks, new rank ``j`` reads
``remaining[j::W]``, in batches: every remaining item once; where they do not divide
evenly, the head of the remaining items is repeated so that every rank reads as many
batches (DDP needs that), as ``DistributedSampler`` itself pads. The resumed epoch reads
these keys (an explicit list in the sampler's part of the state, so a checkpoint inside
that epoch resumes it too); the epochs after it come from the new ranks' own sampler.
"""

from __future__ import annotations

import copy
from typing import Any

from conveyor.core.torch_support import require_torch
from conveyor.errors import StateError

_WHERE = "DataLoader state"


def distributed_record(index_source: Any) -> dict[str, Any] | None:
    """What an epoch's ``DistributedSampler`` is, when the loader's keys come from one
    (directly, or inside a ``BatchSampler``); ``None`` otherwise."""
    torch = require_torch("conveyor.DataLoader")
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
        batches = _old_batches(first, index)
        remaining += [key for batch in batches[part["sampler"]["yielded"] :] for key in batch]
    keys = _new_batches(remaining, first, rank, world_size)
    mine = copy.deepcopy(parts[rank % len(parts)])
    # An epoch to begin from these keys: no inner loader's position (it meant nothing on
    # the new ranks), the base seed of the part it came from.
    mine["sampler"] = {"rng": mine["sampler"]["rng"], "yielded": 0, "keys": keys}
    mine["epoch"] = None
    return mine


def _old_batches(record: dict[str, Any], rank: int) -> list[list[int]]:
    """Old rank ``rank``'s batches of keys, drawn again by torch's own sampler."""
    torch = require_torch("conveyor.DataLoader")
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
    if not remaining:
        return []
    per_rank = -(-len(remaining) // world_size)
    padded = remaining + (remaining * per_rank)[: per_rank * world_size - len(remaining)]
    mine = padded[rank::world_size]
    if record["batch_size"] is None:
        return mine
    return _batched(mine, record["batch_size"], record["batch_drop_last"])


def _batched(keys: list[int], size: int | None, drop_last: bool) -> list[Any]:
    if size is None:
        return list(keys)
    batches = [keys[start : start + size] for start in range(0, len(keys), size)]
    if drop_last and batches and len(batches[-1]) < size:
        batches.pop()
    return batches
