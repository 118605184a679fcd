"""Every rank's part of a loader state in the state each rank returns (conveyor.distributed.rank_parts),
on real gloo groups: the one copy a trainer keeps resumes every rank exactly, a rank that
calls ``state_dict()`` alone is not left hanging, and a part is never loaded on a rank it
does not belong to."""

from __future__ import annotations

import json
import time
import warnings
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conveyor import DataLoader, DataLoader2, DistributedReadingService
from conveyor.distributed.rank_parts import ENVELOPE_FORMAT, own_part
from conveyor.errors import StateError
from conveyor.pipes import IterableWrapper
from conveyor.torch_compat.elastic import _new_batches
from distributed_helpers import Raised, run_ranks, succeeded

pytestmark = pytest.mark.timeout(180)


def per_rank_loader(rank: int) -> DataLoader:
    """A loader whose order depends on the rank (its own generator), as with any rank-specific content."""
    return DataLoader(list(range(40)), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(100 + rank))


def as_lists(batches: Any) -> list[list[int]]:
    return [batch.tolist() for batch in batches]


def save_then_resume_from_rank0s_copy(rank: int, world_size: int, cut: int) -> dict[str, Any]:
    import torch.distributed as dist

    loader = per_rank_loader(rank)
    it = iter(loader)
    head = as_lists(next(it) for _ in range(cut))
    state = loader.state_dict()  # every rank calls it at the same step
    rest = as_lists(it)
    following = as_lists(loader)
    copies: list[Any] = [None] * world_size
    dist.all_gather_object(copies, state)
    kept = json.loads(json.dumps(copies[0]))  # what a trainer keeps: rank 0's, through a file
    resumed = per_rank_loader(rank)
    resumed.load_state_dict(kept)
    return {
        "same_on_every_rank": all(copy == copies[0] for copy in copies),
        "format": state["format"],
        "head": head,
        "expected": (rest, following),
        "resumed": (as_lists(resumed), as_lists(resumed)),
    }


@pytest.mark.parametrize("cut", [3, 10])  # mid-epoch, and after the epoch's last batch
def test_rank_zeros_copy_resumes_every_rank_exactly(cut: int) -> None:
    results = succeeded(run_ranks(2, save_then_resume_from_rank0s_copy, cut))
    assert results[0]["head"] != results[1]["head"]  # the ranks read different data
    for result in results:
        assert result["same_on_every_rank"] and result["format"] == ENVELOPE_FORMAT
        if cut == 10:  # after the last batch, the first iter() is the next epoch
            assert result["resumed"][0] == result["expected"][1]
        else:
            assert result["resumed"] == result["expected"]


def rank0_alone_saves(rank: int, world_size: int) -> Any:
    loader = DataLoader(list(range(40)), batch_size=4, timeout=2)
    it = iter(loader)
    next(it)
    if rank != 0:
        time.sleep(6)  # busy elsewhere: never calls state_dict()
        return None
    began = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state = loader.state_dict()
    return {
        "waited": time.monotonic() - began,
        "parts": [part is not None for part in state["parts"]],
        "warnings": [str(w.message) for w in caught],
        "state": state,
    }


def test_a_rank_calling_state_dict_alone_returns_its_own_part_with_a_warning() -> None:
    result = succeeded(run_ranks(2, rank0_alone_saves, deadline_s=90))[0]
    assert result["waited"] < 30  # the loader's timeout bounds the wait (2 s), not a hang
    assert result["parts"] == [True, False]
    assert any("rank(s) [1] did not send their part" in text for text in result["warnings"])
    # The other rank cannot resume from it: it holds no part for rank 1.
    outcomes = run_ranks(2, load_on_every_rank, result["state"])
    assert outcomes[0] == "loaded"
    assert isinstance(outcomes[1], Raised) and outcomes[1].type_name == "StateError"
    assert "holds no part for rank 1" in outcomes[1].message


def load_on_every_rank(rank: int, world_size: int, state: Any) -> str:
    DataLoader(list(range(40)), batch_size=4, timeout=2).load_state_dict(state)
    return "loaded"


def test_a_state_of_another_world_size_is_refused_by_a_loader_that_cannot_merge_it() -> None:
    state = {"format": ENVELOPE_FORMAT, "version": 1, "world_size": 3, "parts": [None, None, None]}
    with pytest.raises(StateError, match="saved by 3 ranks, loaded on rank 0 of 1"):
        own_part(state, "DataLoader")


def distributed_pipe() -> Any:
    return IterableWrapper(range(60)).shuffle().sharding_filter().map(lambda x: x * 3)


def distributed_rest(rank: int, world_size: int, state: Any, cut: int) -> Any:
    loader = DataLoader2(distributed_pipe(), reading_service=DistributedReadingService(timeout=60))
    if state is None:
        loader.seed(5)
        it = iter(loader)
        head = [next(it) for _ in range(cut)]
        saved = loader.state_dict()
        rest = list(it)
        loader.shutdown()
        return {"head": head, "rest": rest, "state": saved}
    loader.load_state_dict(state)
    rest = list(loader)
    loader.shutdown()
    return {"rest": rest}


@pytest.mark.parametrize("resume_world", [2, 3])
def test_a_distributed_service_state_resumes_on_the_same_or_another_world_size(resume_world: int) -> None:
    saved = succeeded(run_ranks(2, distributed_rest, None, 9))  # 42 left: as many on each of 2 or 3 ranks
    state = json.loads(json.dumps(saved[0]["state"]))  # rank 0's copy holds both ranks' parts
    assert saved[1]["state"] == saved[0]["state"]
    resumed = succeeded(run_ranks(resume_world, distributed_rest, state, 0))
    if resume_world == 2:
        assert [r["rest"] for r in resumed] == [s["rest"] for s in saved]
    remaining = [item for r in resumed for item in r["rest"]]
    handed_out = [item for s in saved for item in s["head"]]
    assert sorted(handed_out + remaining) == [x * 3 for x in range(60)]  # every item once


def sharded_loader(rank: int, world_size: int) -> DataLoader:
    """A conveyor.DataLoader sharded as a DDP script (or Lightning) shards torch's."""
    items = list(range(64))
    sampler = torch.utils.data.DistributedSampler(items, num_replicas=world_size, rank=rank, shuffle=True, seed=3)
    return DataLoader(items, batch_size=4, sampler=sampler)


def save_sharded(rank: int, world_size: int, cut: int) -> dict[str, Any]:
    loader = sharded_loader(rank, world_size)
    loader.sampler.set_epoch(0)
    it = iter(loader)
    head = as_lists(next(it) for _ in range(cut))
    return {"head": head, "state": loader.state_dict()}


def resume_sharded(rank: int, world_size: int, state: Any) -> list[list[int]]:
    loader = sharded_loader(rank, world_size)
    loader.sampler.set_epoch(0)
    loader.load_state_dict(state)
    return as_lists(loader)


@pytest.mark.parametrize("resume_world", [1, 3])
def test_a_distributed_sampler_state_resumes_on_another_world_size(resume_world: int) -> None:
    """2 ranks hand out 2 batches each; 1 or 3 ranks read every remaining item once."""
    saved = succeeded(run_ranks(2, save_sharded, 2))
    state = json.loads(json.dumps(saved[0]["state"]))
    if resume_world == 1:
        rests = [resume_sharded(0, 1, state)]
    else:
        rests = succeeded(run_ranks(resume_world, resume_sharded, state))
    assert len({len(rest) for rest in rests}) == 1  # as many batches on every rank (DDP needs it)
    handed_out = [key for result in saved for batch in result["head"] for key in batch]
    remaining = [key for rest in rests for batch in rest for key in batch]
    assert sorted(handed_out + remaining) == list(range(64))  # every item once


def resume_sharded_counting(rank: int, world_size: int, state: Any) -> dict[str, Any]:
    loader = sharded_loader(rank, world_size)
    loader.sampler.set_epoch(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader.load_state_dict(state)
    length = len(loader)
    rest = as_lists(loader)
    return {"rest": rest, "len": length, "usual": len(loader), "warned": [str(w.message) for w in caught]}


@pytest.mark.parametrize(("cut", "resume_world"), [(2, 3), (3, 3), (3, 1), (7, 3)])
def test_an_uneven_remainder_is_read_once_in_as_many_steps_on_every_rank(cut: int, resume_world: int) -> None:
    """What is left need not divide by the new ranks and their batch size: some batches are
    smaller, none repeats an item, every rank takes as many steps; ``len()`` counts the
    steps taken before, and a resumed epoch longer than a fresh one is warned about."""
    saved = succeeded(run_ranks(2, save_sharded, cut))
    state = json.loads(json.dumps(saved[0]["state"]))
    if resume_world == 1:
        results = [resume_sharded_counting(0, 1, state)]
    else:
        results = succeeded(run_ranks(resume_world, resume_sharded_counting, state))
    steps = {len(result["rest"]) for result in results}
    assert len(steps) == 1
    assert all(1 <= len(batch) <= 4 for result in results for batch in result["rest"])
    handed_out = [key for result in saved for batch in result["head"] for key in batch]
    remaining = [key for result in results for batch in result["rest"] for key in batch]
    assert sorted(handed_out + remaining) == list(range(64))
    needed = cut + steps.pop()
    usual = -(-64 // resume_world // 4)  # a fresh epoch's batches on the new world size
    for result in results:
        assert result["len"] == max(usual, needed) and result["usual"] == usual  # the next epoch is fresh
        assert bool(result["warned"]) == (needed > usual)
        assert all("takes" in message and "len()" in message for message in result["warned"])


def distributed_length(rank: int, world_size: int, state: Any) -> dict[str, Any]:
    loader = DataLoader2(distributed_pipe(), reading_service=DistributedReadingService(timeout=60))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader.load_state_dict(state)
    length = len(loader)
    rest = list(loader)
    after = len(loader)
    loader.shutdown()
    return {"len": length, "rest": rest, "after": after, "warned": bool(caught)}


@pytest.mark.parametrize(("cut", "resume_world"), [(9, 3), (25, 3), (9, 1)])
def test_a_dataloader2_resumed_on_another_world_size_counts_its_steps(cut: int, resume_world: int) -> None:
    """len() of an epoch merged from 2 ranks: each old rank's items before the cut and this
    rank's share of what is left (never less than a fresh epoch's), while that epoch lasts."""
    saved = succeeded(run_ranks(2, distributed_rest, None, cut))
    state = json.loads(json.dumps(saved[0]["state"]))
    resumed = succeeded(run_ranks(resume_world, distributed_length, state))
    usual = 60 // resume_world
    left = 60 - 2 * cut
    needed = cut + left // resume_world  # "drop": the shortest share
    for result in resumed:
        assert result["len"] == max(usual, needed)
        assert len(result["rest"]) == left // resume_world
        assert result["warned"] == (needed > usual)


@given(st.integers(1, 90), st.integers(1, 5), st.integers(1, 6))
def test_new_ranks_share_what_is_left_once_in_equal_steps(left: int, world_size: int, batch_size: int) -> None:
    record = {"batch_size": batch_size, "batch_drop_last": False}
    remaining = list(range(100, 100 + left))
    shares = [_new_batches(remaining, record, rank, world_size) for rank in range(world_size)]
    assert len({len(share) for share in shares}) == 1
    steps = len(shares[0])
    assert steps == -(-left // (world_size * batch_size))  # no more steps than full batches need
    assert all(1 <= len(batch) <= batch_size for share in shares for batch in share)
    keys = [key for share in shares for batch in share for key in batch]
    if left >= world_size * steps:  # enough items for one in every batch: none repeats
        assert sorted(keys) == remaining
    else:
        assert set(keys) == set(remaining)
