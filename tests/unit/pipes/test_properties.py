"""Property tests of pipeline compositions: reference semantics, determinism, exact resume
and sharding, on random pipelines built from a plain-data spec.

A spec is a tuple of op tuples; ``build`` (tests/support/pipeline_specs.py) turns it into a
fresh graph each call, so an uninterrupted run and an interrupted-then-resumed run read
identical graphs.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conveyor import DataLoader2, SeedGenerator
from conveyor.graph import SHARDING_PRIORITIES, apply_random_seed, apply_sharding
from conveyor.pipes import IterableWrapper, MapDataPipe, SequenceWrapper
from hypothesis_profiles import scaled
from pipeline_helpers import finish_epoch
from pipeline_specs import MAX_N, SEEDS, build, epochs, make_loader, reference, specs
from resume_checks import check_resume_at_every_cut, json_state


def seeded_epochs(pipe: Any, seed: int, count: int) -> list[list[Any]]:
    """``count`` epochs of a default ``DataLoader2`` over ``pipe`` seeded with ``seed``."""
    dl = DataLoader2(pipe)
    try:
        dl.seed(seed)
        return [list(dl) for _ in range(count)]
    finally:
        dl.shutdown()


def check_chained_resume(spec: Any, seed: int, cuts: tuple[int, ...], full: list[list[Any]]) -> None:
    """Read ``cuts[0]`` items, save; for each next cut resume, read that many more, save
    again; a last resume must finish the uninterrupted epoch, then give the next one
    (``full``: the uninterrupted loader's first two epochs)."""
    full0, full1 = full
    got: list[Any] = []
    state: dict[str, Any] | None = None
    for cut in cuts:
        loader = make_loader(spec)
        try:
            if state is None:
                loader.seed(seed)
            else:
                loader.load_state_dict(state)
            it = iter(loader)
            got += [next(it) for _ in range(cut)]
            state = json_state(loader)
        finally:
            loader.shutdown()
    last = make_loader(spec)
    try:
        last.load_state_dict(state)
        assert finish_epoch(last, got, full0) == full0, f"cuts {cuts}"
        assert list(last) == full1
    finally:
        last.shutdown()


def check_resume(spec: Any, seed: int, where: str, data: st.DataObject, prefetch_cnt: int | None) -> None:
    """Interrupt a loader at ``where`` (a random cut when mid-epoch: in the first epoch for
    "mid", in the second for "later"), resume a fresh one; the rest of that epoch and the
    next must match the uninterrupted loader's."""
    full = epochs(spec, seed, 3, prefetch_cnt)
    if where == "later":
        del full[0]  # the first epoch runs whole before the cut
    full0, full1 = full[:2]
    cut = data.draw(st.integers(0, len(full0)), label="cut") if where in ("mid", "later") else 0
    a = make_loader(spec, prefetch_cnt)
    try:
        a.seed(seed)
        first: list[Any] = []
        if where == "later":
            list(a)
        if where in ("mid", "later"):
            it = iter(a)
            first = [next(it) for _ in range(cut)]
        elif where == "between":
            first = list(a)
        state = json_state(a)
    finally:
        a.shutdown()

    b = make_loader(spec, prefetch_cnt)
    try:
        b.load_state_dict(state)
        assert json_state(b) == state, "a state read back right after loading must round-trip"
        if where == "between":
            assert first == full0
            assert list(b) == full1
        else:
            if cut < len(full0):
                rest = list(b)
                assert first + rest == full0, f"resumed at {cut} of {len(full0)}"
            # After the epoch's last item, the first iter() is already the next epoch.
            assert list(b) == full1, f"resumed at {cut} of {len(full0)}"
    finally:
        b.shutdown()


# --- properties --------------------------------------------------------------------------


@given(spec=specs(allow_random=False))
def test_reference_semantics(spec: Any) -> None:
    dl = make_loader(spec)
    try:
        got = list(dl)
    finally:
        dl.shutdown()
    assert got == reference(spec)


@given(spec=specs())
def test_len_when_known_matches_items(spec: Any) -> None:
    """Where the graph has a length (no filter, flatmap, unbatch), it is the item count."""
    try:
        expected_len = len(build(spec))
    except TypeError:
        return
    assert expected_len == len(epochs(spec, 3, 1)[0])


@settings(max_examples=scaled(30))
@given(spec=specs(allow_random=False, max_ops=4), prefetch_cnt=st.integers(1, 4))
def test_reference_semantics_with_prefetching_service(spec: Any, prefetch_cnt: int) -> None:
    expected = reference(spec)
    assert epochs(spec, 0, 2, prefetch_cnt) == [expected, expected]


@given(spec=specs(), seed=SEEDS)
def test_same_seed_same_epochs(spec: Any, seed: int) -> None:
    first = epochs(spec, seed, 2)
    second = epochs(spec, seed, 2)
    assert first == second


@given(spec=specs(), seed=SEEDS)
def test_shuffles_keep_the_multiset(spec: Any, seed: int) -> None:
    """Shuffles only reorder: without order-sensitive ops (header, drop_last batches,
    random_map), each epoch holds the items of the unshuffled reference."""
    n, ops = spec
    kept = [op for op in ops if op[0] not in ("header", "random_map") and not (op[0] == "batch" and op[2])]
    ops = (*kept, ("shuffle", 5))
    spec = (n, ops)
    expected = Counter(reference(spec, shuffle_as_identity=True))
    for epoch in epochs(spec, seed, 2):
        assert Counter(epoch) == expected


@given(n=st.integers(0, MAX_N), buffers=st.lists(st.integers(1, 70), min_size=1, max_size=3), seed=SEEDS)
def test_shuffle_only_is_a_permutation(n: int, buffers: list[int], seed: int) -> None:
    pipe: Any = IterableWrapper(list(range(n)))
    for b in buffers:
        pipe = pipe.shuffle(buffer_size=b)
    for epoch in seeded_epochs(pipe, seed, 2):
        assert sorted(epoch) == list(range(n))


def test_shuffle_epochs_differ() -> None:
    e0, e1 = seeded_epochs(IterableWrapper(list(range(50))).shuffle(buffer_size=50), 2024, 2)
    assert sorted(e0) == sorted(e1) == list(range(50))
    assert e0 != e1
    assert e0 != list(range(50))


@given(
    spec=specs(),
    seed=SEEDS,
    where=st.sampled_from(["mid", "mid", "mid", "later", "later", "between", "before"]),
    data=st.data(),
)
def test_exact_resume(spec: Any, seed: int, where: str, data: st.DataObject) -> None:
    check_resume(spec, seed, where, data, prefetch_cnt=None)


@settings(max_examples=scaled(30))
@given(
    spec=specs(max_ops=5),
    seed=SEEDS,
    where=st.sampled_from(["mid", "later", "between", "before"]),
    data=st.data(),
    prefetch_cnt=st.integers(1, 4),
)
def test_exact_resume_with_prefetching_service(
    spec: Any, seed: int, where: str, data: st.DataObject, prefetch_cnt: int
) -> None:
    check_resume(spec, seed, where, data, prefetch_cnt=prefetch_cnt)


@pytest.mark.parametrize("prefetch_cnt", [None, 1])
@pytest.mark.parametrize(
    "spec",
    [(1, (("header", 1), ("cycle",))), (5, (("header", 2), ("cycle",))), (6, (("header", 3), ("map", 1), ("cycle",)))],
    ids=str,
)
def test_exact_resume_header_then_cycle(spec: Any, prefetch_cnt: int | None) -> None:
    """Regression: a header that reached its limit, resumed inside a cycle, must not leave
    its source's restored position staged for the cycle's next round."""
    full0 = epochs(spec, 0, 1, prefetch_cnt)[0]
    for cut in range(len(full0) + 1):
        a = make_loader(spec, prefetch_cnt)
        try:
            a.seed(0)
            it = iter(a)
            first = [next(it) for _ in range(cut)]
            state = json_state(a)
        finally:
            a.shutdown()
        b = make_loader(spec, prefetch_cnt)
        try:
            b.load_state_dict(state)
            assert finish_epoch(b, first, full0) == full0, f"resumed at {cut} of {len(full0)}"
        finally:
            b.shutdown()


@pytest.mark.parametrize(
    "spec",
    [
        (1, (("random_map",), ("header", 1), ("cycle",))),
        (5, (("shuffle", 3), ("header", 2), ("cycle",))),
        (4, (("random_map",), ("map", 1), ("header", 3), ("cycle",))),
    ],
    ids=str,
)
def test_a_random_op_resumed_inside_a_cycle_draws_the_next_round_anew(spec: Any) -> None:
    """Regression: resumed where a header had reached its limit inside a cycle, a random op
    upstream never saw its staged pass; the cycle's next round must still count that pass
    as begun and draw what the uninterrupted epoch drew (it drew the same again)."""
    full = epochs(spec, 0, 2)
    for c1 in range(len(full[0]) + 1):
        for c2 in range(len(full[0]) - c1 + 1):
            check_chained_resume(spec, 0, (c1, c2), full)


def _concat_with_a_shuffled_second_input() -> Any:
    return IterableWrapper(range(2)).concat(IterableWrapper(range(10, 17)).shuffle())


@pytest.mark.parametrize(
    "make",
    [
        lambda: IterableWrapper(range(10)).shuffle(),
        lambda: IterableWrapper(range(6)).random_map(lambda x, rng: (x, int(rng.integers(1000)))),
        _concat_with_a_shuffled_second_input,
    ],
    ids=["shuffle", "random_map", "concat-then-shuffle"],
)
def test_a_random_op_not_begun_in_a_later_epoch_resumes_that_epoch(make: Any) -> None:
    """Regression: in the second epoch, a state saved before a random op began named the
    previous epoch's pass count (1) as its pass, so the resumed epoch drew another order."""
    check_resume_at_every_cut(make, 7, cut_epochs=(1,))


def _mux_of_three() -> Any:
    return IterableWrapper(range(7)).mux(IterableWrapper(range(10, 15)).shuffle(), IterableWrapper(range(20, 26)))


def _mux_longest_then_shuffle() -> Any:
    return IterableWrapper(range(4)).mux_longest(IterableWrapper(range(10, 17)).prefetch(2)).shuffle(buffer_size=3)


def _mux_of_flatmaps() -> Any:
    return IterableWrapper(range(5)).flatmap(lambda x: [x] * (x % 3)).mux(IterableWrapper(range(10, 14)).batch(3))


@pytest.mark.parametrize("make", [_mux_of_three, _mux_longest_then_shuffle, _mux_of_flatmaps], ids=lambda f: f.__name__)
def test_mux_resumes_at_every_cut_of_two_epochs(make: Any) -> None:
    """``mux`` reads a whole round before yielding it: a state saved inside a round must
    replay the round from the inputs' states before it."""
    check_resume_at_every_cut(make, 3, cut_epochs=(0, 1))


@settings(max_examples=scaled(30))
@given(spec=specs(max_ops=5), seed=SEEDS, data=st.data())
def test_chained_resume(spec: Any, seed: int, data: st.DataObject) -> None:
    """Resume, read some more, save again, resume again: still the uninterrupted epoch."""
    full = epochs(spec, seed, 2)
    c1 = data.draw(st.integers(0, len(full[0])), label="first cut")
    c2 = data.draw(st.integers(0, len(full[0]) - c1), label="second cut")
    check_chained_resume(spec, seed, (c1, c2), full)


# --- random-access pipes -----------------------------------------------------------------


@given(n=st.integers(0, MAX_N), seed=SEEDS)
def test_map_shuffle_is_a_permutation(n: int, seed: int) -> None:
    for epoch in seeded_epochs(SequenceWrapper(list(range(n))).shuffle(), seed, 3):
        assert sorted(epoch) == list(range(n))


def test_map_shuffle_epochs_differ() -> None:
    for n in range(8, MAX_N + 1):
        e0, e1 = seeded_epochs(SequenceWrapper(list(range(n))).shuffle(), 12345, 2)
        assert e0 != e1, f"n={n}: epochs 0 and 1 have the same order"


@given(n=st.integers(0, MAX_N), seed=SEEDS, data=st.data(), between=st.booleans())
def test_map_shuffle_exact_resume(n: int, seed: int, data: st.DataObject, between: bool) -> None:
    def make() -> DataLoader2:
        return DataLoader2(SequenceWrapper(list(range(n))).shuffle())

    ref = make()
    try:
        ref.seed(seed)
        full0, full1 = list(ref), list(ref)
    finally:
        ref.shutdown()
    cut = data.draw(st.integers(0, n), label="cut")
    a = make()
    try:
        a.seed(seed)
        if between:
            first = list(a)
        else:
            it = iter(a)
            first = [next(it) for _ in range(cut)]
        state = json_state(a)
    finally:
        a.shutdown()
    b = make()
    try:
        b.load_state_dict(state)
        if between:
            assert first == full0
            assert list(b) == full1
        else:
            assert finish_epoch(b, first, full0) == full0
            assert list(b) == full1
    finally:
        b.shutdown()


# --- sharding ----------------------------------------------------------------------------


def _sharded(n: int, buffer_size: int, seed: int, world: int, rank: int, nw: int, w: int, random_after: bool) -> Any:
    pipe: Any = IterableWrapper(range(n)).shuffle(buffer_size=buffer_size).sharding_filter()
    if random_after:
        pipe = pipe.random_map(lambda x, rng: (x, int(rng.integers(1 << 30))))
    else:
        pipe = pipe.map(lambda x: x * 7 + 1)
    apply_sharding(pipe, world, rank, SHARDING_PRIORITIES.DISTRIBUTED)
    apply_sharding(pipe, nw, w, SHARDING_PRIORITIES.MULTIPROCESSING)
    apply_random_seed(pipe, SeedGenerator(seed))
    return pipe


@settings(max_examples=scaled(40))
@given(n=st.integers(0, MAX_N), buffer_size=st.integers(1, 20), seed=SEEDS, world=st.integers(1, 3))
def test_sharding_is_disjoint_complete_and_worker_independent(n: int, buffer_size: int, seed: int, world: int) -> None:
    expected = sorted(x * 7 + 1 for x in range(n))
    per_rank: dict[int, dict[int, list[int]]] = {}
    for nw in (1, 2, 3):
        everything: list[int] = []
        for rank in range(world):
            rank_items: list[int] = []
            for w in range(nw):
                pipe = _sharded(n, buffer_size, seed, world, rank, nw, w, random_after=False)
                out = list(pipe)
                assert len(pipe) == len(out), f"len() of shard (rank {rank}/{world}, worker {w}/{nw})"
                rank_items += out
            per_rank.setdefault(rank, {})[nw] = sorted(rank_items)
            everything += rank_items
        assert sorted(everything) == expected, f"nw={nw}: shards are not disjoint and complete"
    for rank, by_nw in per_rank.items():
        assert by_nw[1] == by_nw[2] == by_nw[3], f"rank {rank} receives different items for different nw"


@settings(max_examples=scaled(25))
@given(n=st.integers(0, 40), buffer_size=st.integers(1, 20), seed=SEEDS)
def test_random_op_after_sharding_does_not_depend_on_the_split(n: int, buffer_size: int, seed: int) -> None:
    """Random ops after the sharding point key their draws by the item's position, so each
    item gets the same draw whatever the number of ranks and workers."""
    outputs: dict[tuple[int, int], dict[int, int]] = {}
    for world in (1, 2, 3):
        for nw in (1, 2):
            drawn: dict[int, int] = {}
            for rank in range(world):
                for w in range(nw):
                    for x, r in _sharded(n, buffer_size, seed, world, rank, nw, w, random_after=True):
                        assert x not in drawn
                        drawn[x] = r
            assert sorted(drawn) == list(range(n))
            outputs[(world, nw)] = drawn
    baseline = outputs[(1, 1)]
    for config, drawn in outputs.items():
        assert drawn == baseline, f"draws differ between (world, nw)=(1, 1) and {config}"


@pytest.mark.parametrize("world,nw", [(2, 3), (3, 2), (1, 4)])
def test_sharded_len_matches_items(world: int, nw: int) -> None:
    for n in range(0, 30):
        for rank in range(world):
            for w in range(nw):
                pipe = _sharded(n, 4, 1, world, rank, nw, w, random_after=False)
                assert len(pipe) == len(list(pipe)), (n, rank, w)


# --- sharding a random-access source by index ----------------------------------------------


class CountingLoads(MapDataPipe):
    """``range(n)`` that counts every item it loads."""

    def __init__(self, n: int):
        self.n = n
        self.loads: Counter[int] = Counter()

    def __getitem__(self, index: int) -> int:
        self.loads[index] += 1
        return index

    def __len__(self) -> int:
        return self.n


def _sharded_by_index(source: Any, levels: list[tuple[int, int]]) -> Any:
    pipe = source.sharding_filter()
    apply_sharding(pipe, *levels[0], SHARDING_PRIORITIES.DISTRIBUTED)
    apply_sharding(pipe, *levels[1], SHARDING_PRIORITIES.MULTIPROCESSING)
    return pipe


@settings(max_examples=scaled(40))
@given(
    n=st.integers(0, MAX_N),
    world=st.integers(1, 3),
    nw=st.integers(1, 4),
    data=st.data(),
)
def test_a_random_access_source_is_sharded_without_loading_the_others(
    n: int, world: int, nw: int, data: st.DataObject
) -> None:
    """A sharding point right after a random-access source loads only its shard's items,
    and yields (and saves, and resumes) exactly what reading every item would."""
    rank, worker = data.draw(st.integers(0, world - 1), label="rank"), data.draw(st.integers(0, nw - 1), label="w")
    levels = [(world, rank), (nw, worker)]
    loads = CountingLoads(n)
    fast = _sharded_by_index(loads.to_iter_datapipe(), levels)
    slow = _sharded_by_index(IterableWrapper(range(n)), levels)
    expected = list(slow)
    assert list(fast) == expected
    assert sorted(loads.loads) == expected and set(loads.loads.values()) <= {1}
    cut = data.draw(st.integers(0, len(expected)), label="cut")
    fast = _sharded_by_index(CountingLoads(n).to_iter_datapipe(), levels)
    slow = _sharded_by_index(IterableWrapper(range(n)), levels)
    head_fast, head_slow = iter(fast), iter(slow)
    assert [next(head_fast) for _ in range(cut)] == [next(head_slow) for _ in range(cut)]
    state_fast, state_slow = fast.state_dict(), slow.state_dict()
    # The filter's position and the source's index, as if every item had been read.
    assert state_fast == state_slow
    resumed = _sharded_by_index(CountingLoads(n).to_iter_datapipe(), levels)
    resumed.load_state_dict(json.loads(json.dumps(state_fast)))
    assert list(resumed) == expected[cut:]


@pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
def test_a_map_pipe_given_to_the_loader_is_split_by_index(num_workers: int) -> None:
    """As torch's samplers split a map-style Dataset: every item once, in index order."""
    from conveyor import MultiProcessingReadingService

    loader = DataLoader2(SequenceWrapper(list(range(23))), reading_service=MultiProcessingReadingService(num_workers))
    try:
        assert list(loader) == list(range(23))
        it = iter(loader)
        head = [next(it) for _ in range(9)]
        state = json_state(loader)
    finally:
        loader.shutdown()
    resumed = DataLoader2(SequenceWrapper(list(range(23))), reading_service=MultiProcessingReadingService(2))
    try:
        resumed.load_state_dict(state)
        assert head + list(resumed) == list(range(23))
    finally:
        resumed.shutdown()
