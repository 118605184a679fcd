"""``merge_rank_states`` and loading what it makes, on real gloo groups of forked ranks
(fast; the ``torchrun`` cases are in ``test_elastic_resume.py``): the handed-out set,
any order of states, a JSON round trip, refusals (mixed epochs, duplicate or missing
ranks, other pipelines, grouping after the sharding point, a rank inside an item's
parts), a merged state read by one process, and a resumed job merged again."""

from __future__ import annotations

import itertools
import json
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conveyor import DataLoader2, DistributedReadingService, MultiProcessingReadingService, SequentialReadingService
from conveyor.core.handed_out import HandedOut
from conveyor.distributed.rank_parts import own_part
from conveyor.errors import StateError
from conveyor.pipes import IterableWrapper, SequenceWrapper
from distributed_helpers import run_ranks, succeeded
from pipeline_helpers import jitter, not_multiple_of_three, tag, twice

pytest.importorskip("torch.distributed")

pytestmark = pytest.mark.timeout(180)

N, SEED = 40, 11


def per_item(n: int = N) -> Any:
    return IterableWrapper(range(n)).shuffle(buffer_size=8).sharding_filter().map(tag).random_map(jitter)


def batched(n: int = N) -> Any:
    return IterableWrapper(range(n)).sharding_filter().batch(4)


def shuffled_after(n: int = N) -> Any:
    return IterableWrapper(range(n)).sharding_filter().shuffle(buffer_size=4)


def expanded(n: int = N) -> Any:
    return IterableWrapper(range(n)).sharding_filter().map(tag).flatmap(twice)


def indexed(n: int = N) -> Any:
    """A random-access source (the sharding point reads only its own positions), and a
    filter after the sharding point: ranks hand out their shares at different paces."""
    source = SequenceWrapper(list(range(n))).shuffle().to_iter_datapipe()
    return source.sharding_filter().map(tag).filter(not_multiple_of_three).random_map(jitter)


PIPELINES = {
    "per_item": per_item,
    "indexed": indexed,
    "batched": batched,
    "shuffled_after": shuffled_after,
    "expanded": expanded,
}


def service(workers: int | None, epoch_end: str = "pad") -> Any:
    distributed = DistributedReadingService(timeout=30, epoch_end=epoch_end, window=4)
    return (
        distributed
        if workers is None
        else SequentialReadingService(distributed, MultiProcessingReadingService(workers))
    )


# --- run on every rank (module level: the ranks are forked) -------------------------------


def save_at(rank: int, world: int, name: str, cut: int, workers: int | None) -> tuple[list[Any], dict[str, Any]]:
    with DataLoader2(PIPELINES[name](), reading_service=service(workers)) as loader:
        loader.seed(SEED)
        iterator = iter(loader)
        head = [next(iterator) for _ in range(cut)]
        return head, json.loads(json.dumps(own_part(loader.state_dict(), "DataLoader2")))


def resume_and_save(rank: int, world: int, merged: dict[str, Any], cut: int, workers: int | None) -> Any:
    """Resume ``merged``; ``(the first cut items, the state then, the rest, the rest when
    this rank's own state is loaded again on the same world size)``."""
    with DataLoader2(per_item(), reading_service=service(workers)) as loader:
        loader.load_state_dict(merged)
        iterator = iter(loader)
        head = [next(iterator) for _ in range(cut)]
        state = json.loads(json.dumps(own_part(loader.state_dict(), "DataLoader2")))
        rest = list(iterator)
        padded = loader.reading_service.reading_services[0].last_epoch_summary.padded if workers is not None else None
    with DataLoader2(per_item(), reading_service=service(workers)) as loader:
        loader.load_state_dict(state)
        again = list(loader)
    return head, state, rest, again, padded


def read_rest(
    rank: int, world: int, merged: dict[str, Any], workers: int | None, name: str = "per_item"
) -> tuple[list[Any], int]:
    with DataLoader2(PIPELINES[name](), reading_service=service(workers)) as loader:
        loader.load_state_dict(merged)
        rest = list(loader)
        rs = loader.reading_service
        summary = (rs.reading_services[0] if workers is not None else rs).last_epoch_summary
        return rest, summary.padded


# --- helpers -----------------------------------------------------------------------------------


def single_process(name: str = "per_item") -> list[Any]:
    with DataLoader2(PIPELINES[name]()) as loader:
        loader.seed(SEED)
        return list(loader)


@pytest.fixture(scope="module")
def saved() -> dict[str, Any]:
    """3 ranks (1 worker each) after 5 items each, and 2 ranks in-process after 3."""
    return {
        "three": succeeded(run_ranks(3, save_at, "per_item", 5, 1)),
        "two": succeeded(run_ranks(2, save_at, "per_item", 3, None)),
    }


def states_of(results: list[Any]) -> list[dict[str, Any]]:
    return [state for _, state in results]


def real_items(rests: list[tuple[list[Any], int]]) -> list[Any]:
    return [item for rest, padded in rests for item in rest[: len(rest) - padded]]


# --- the handed-out set ---------------------------------------------------------------------------


def test_handed_out_positions_are_a_frontier_and_runs() -> None:
    merged = HandedOut().union([(0, 13, 3), (1, 8, 3), (2, 12, 3)])
    assert merged.below == 10  # 0..9 all handed out; 10 (rank 1's) is not
    assert [p for p in range(16) if p in merged] == [*range(10), 11, 12]
    assert merged.runs == ((11, 12, 3), (12, 13, 3))
    assert HandedOut.from_state(json.loads(json.dumps(merged.as_state())), "test") == merged
    padded = HandedOut().union([(0, None, 2), (1, 6, 2)])  # rank 0 ran out and padded
    assert padded.below == 7 and [p for p in range(12) if p not in padded] == [7, 9, 11]
    everything = HandedOut().union([(0, None, 1)])
    assert 0 in everything and 10**12 in everything and len(everything.runs) <= 1


def test_the_frontier_and_the_normal_form_match_a_walk_over_positions() -> None:
    draw = random.Random(5)
    for _ in range(2000):
        runs = []
        for _ in range(draw.randint(0, 6)):
            start, step = draw.randint(0, 30), draw.choice([1, 2, 3, 4, 6])
            runs.append((start, None if draw.random() < 0.2 else start + draw.randint(1, 40), step))
        handed_out = HandedOut(draw.randint(0, 10), tuple(runs))
        walked = next(p for p in range(handed_out.below, 1000) if p not in handed_out or p == 999)
        assert handed_out.first_missing() == walked or (walked == 999 and handed_out.first_missing() >= 999)
        normal = handed_out.normalized()
        assert all((p in normal) == (p in handed_out) for p in range(300))


@pytest.mark.parametrize(
    "bad",
    [{"below": -1, "runs": []}, {"below": 0, "runs": [[3, 3, 1]]}, {"below": 0, "runs": [[0, None, 0]]}, {"below": 0}],
)
def test_a_bad_handed_out_set_is_refused(bad: Any) -> None:
    with pytest.raises(StateError):
        HandedOut.from_state(bad, "test")


# --- merging -------------------------------------------------------------------------------------


def test_any_order_of_states_merges_alike_and_survives_json(saved: dict[str, Any]) -> None:
    states = states_of(saved["three"])
    merges = [DistributedReadingService.merge_rank_states(list(order)) for order in itertools.permutations(states)]
    assert all(merged == merges[0] for merged in merges)
    merged = merges[0]
    assert json.loads(json.dumps(merged)) == merged
    assert merged["items"] == 15 and merged["in_progress"] and merged["pipeline"] is None
    part = merged["reading_service"]["elastic"]
    assert part["world_size"] == 3 and part["items"] == 15 and part["origin"]["num_workers"] == 1
    assert len(part["handed_out"]["runs"]) <= 3  # one run per rank at most, not one entry per item


def test_states_of_different_epochs_are_refused(saved: dict[str, Any]) -> None:
    states = states_of(saved["three"])
    later = {**states[1], "epoch": 1}
    with pytest.raises(StateError, match="different epochs"):
        DistributedReadingService.merge_rank_states([states[0], later, states[2]])
    finished = {
        **states[2],
        "epoch": 1,
        "in_progress": False,
        "pipeline": None,
        "position": None,
        "reading_service": None,
    }
    with pytest.raises(StateError, match="different epochs"):
        DistributedReadingService.merge_rank_states([states[0], states[1], finished])


def test_duplicate_and_missing_ranks_are_named(saved: dict[str, Any]) -> None:
    s0, s1, s2 = states_of(saved["three"])
    with pytest.raises(StateError, match=r"rank\(s\) 0 given more than once; rank\(s\) 1 missing"):
        DistributedReadingService.merge_rank_states([s0, s2, s0])
    with pytest.raises(StateError, match=r"rank\(s\) 2 missing"):
        DistributedReadingService.merge_rank_states([s1, s0])
    with pytest.raises(StateError, match="different world sizes"):
        DistributedReadingService.merge_rank_states([s0, s1, s2, *states_of(saved["two"])])


def test_states_of_another_pipeline_are_refused(saved: dict[str, Any]) -> None:
    s0, s1, s2 = states_of(saved["three"])
    with pytest.raises(StateError, match="different pipelines"):
        DistributedReadingService.merge_rank_states([s0, s1, {**s2, "fingerprint": "0" * 32}])
    with pytest.raises(StateError):
        DistributedReadingService.merge_rank_states([])


@pytest.mark.parametrize("name", ["batched", "shuffled_after"])
@pytest.mark.parametrize("workers", [None, 2])
def test_grouping_or_reordering_after_the_sharding_point_is_refused(name: str, workers: int | None) -> None:
    states = states_of(succeeded(run_ranks(2, save_at, name, 2, workers)))
    with pytest.raises(StateError, match="with the same world size"):
        DistributedReadingService.merge_rank_states(states)


def test_a_rank_inside_an_items_parts_is_refused() -> None:
    states = states_of(succeeded(run_ranks(2, save_at, "expanded", 3, None)))
    with pytest.raises(StateError, match="several items of one"):
        DistributedReadingService.merge_rank_states(states)


def test_states_between_epochs_merge_into_the_next_epochs_start() -> None:
    def finished(seed: int, seeded: bool) -> dict[str, Any]:
        return {"format": "conveyor.DataLoader2", "version": 3, "fingerprint": "f", "seed": seed, "seeded": seeded,
                "epoch": 2, "in_progress": False, "items": 0, "pipeline": None, "position": None,
                "reading_service": None}  # fmt: skip

    merged = DistributedReadingService.merge_rank_states([finished(9, False), finished(4, True)])
    assert (merged["epoch"], merged["in_progress"], merged["seed"], merged["seeded"]) == (2, False, 4, True)
    with pytest.raises(StateError, match="seeded differently"):
        DistributedReadingService.merge_rank_states([finished(5, True), finished(4, True)])


# --- loading ---------------------------------------------------------------------------------------


def test_a_merged_state_read_by_one_process_gives_the_remaining_items(saved: dict[str, Any]) -> None:
    """Without DistributedReadingService (in-process, or workers alone) the loader is a
    job of one rank: it reads every remaining item, in the single-process order."""
    results = saved["three"]
    before = {json.dumps(item) for head, _ in results for item in head}
    expected = [item for item in single_process() if json.dumps(item) not in before]
    merged = DistributedReadingService.merge_rank_states(states_of(results))
    with DataLoader2(per_item()) as loader:
        loader.load_state_dict(merged)
        assert list(loader) == expected
        assert len(list(loader)) == N  # the next epoch is whole
    with DataLoader2(per_item(), reading_service=MultiProcessingReadingService(2)) as loader:
        loader.load_state_dict(merged)
        assert list(loader) == expected


def test_a_merged_state_is_checked_against_the_graph_at_load(saved: dict[str, Any]) -> None:
    merged = DistributedReadingService.merge_rank_states(states_of(saved["two"]))
    with DataLoader2(batched()) as loader:
        fingerprint = loader.state_dict()["fingerprint"]
        with pytest.raises(StateError, match="groups or reorders items"):
            loader.load_state_dict({**merged, "fingerprint": fingerprint})


def test_a_resumed_job_merges_again_and_resumes_its_own_states(saved: dict[str, Any]) -> None:
    """3 ranks -> 2 ranks (cut again after 4 items) -> 3 ranks: every item once; and a rank
    of the 2-rank job that loads its own state reads what it read uninterrupted."""
    first = saved["three"]
    merged = DistributedReadingService.merge_rank_states(states_of(first))
    middle = succeeded(run_ranks(2, resume_and_save, merged, 4, 1))
    for _, _, rest, again, _ in middle:
        assert again == rest
    assert all(state["reading_service"]["services"][0]["resumed"]["items"] == 15 for _, state, *_ in middle)
    remerged = DistributedReadingService.merge_rank_states([state for _, state, *_ in reversed(middle)])
    assert remerged["items"] == 15 + 8
    last = succeeded(run_ranks(3, read_rest, remerged, None))
    seen = [item for head, _ in first for item in head] + [item for head, *_ in middle for item in head]
    everything = seen + real_items(last)
    assert sorted(map(json.dumps, everything)) == sorted(map(json.dumps, single_process()))


@pytest.mark.parametrize("workers", [None, 2])
def test_a_random_access_source_resumes_elastically(workers: int | None) -> None:
    """The sharding point reads only its own positions of a map-style source, skipping
    those handed out: 2 ranks -> 3 (the new ones with or without workers)."""
    first = succeeded(run_ranks(2, save_at, "indexed", 6, 1))
    merged = DistributedReadingService.merge_rank_states(states_of(first))
    assert merged["reading_service"]["elastic"]["handed_out"]["runs"]  # one rank went further than the other
    last = succeeded(run_ranks(3, read_rest, merged, workers, "indexed"))
    everything = [item for head, _ in first for item in head] + real_items(last)
    assert sorted(map(json.dumps, everything)) == sorted(map(json.dumps, single_process("indexed")))


@given(
    st.integers(0, 40),
    st.lists(st.tuples(st.integers(0, 60), st.one_of(st.none(), st.integers(0, 80)), st.integers(1, 7)), max_size=4),
    st.integers(1, 5),
    st.integers(0, 90),
)
def test_a_shares_count_of_handed_out_positions_is_the_brute_force_count(
    below: int, runs: list[tuple[int, int | None, int]], world_size: int, positions: int
) -> None:
    handed_out = HandedOut(below, tuple(runs))
    for rank in range(world_size):
        brute = sum(1 for p in range(rank, positions, world_size) if p in handed_out)
        assert handed_out.count_in_share(rank, world_size, positions) == brute
