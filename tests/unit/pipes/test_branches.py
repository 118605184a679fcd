"""``fork``, ``demux``, ``round_robin_demux`` and ``unzip``: several consumers of one pipe.

Branches share one hub per pass tree, bounded by ``buffer_size``; they resume exactly at
every cut (the hub's input is replayed from the earliest item a branch still needs), in
one process and in workers, where the graph is replicated like any other.
"""

from __future__ import annotations

import copy
import json
import pickle
from typing import Any

import pytest

from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.errors import BranchBufferError, GraphError, StateError
from conveyor.graph import find_dps, list_dps, traverse_dps
from conveyor.pipes import Branch, Demultiplexer, Forker, IterableWrapper, RoundRobinDemultiplexer, UnZipper
from pipeline_helpers import finish_epoch, resume_after
from resume_checks import check_resume_at_every_cut

pytestmark = pytest.mark.timeout(120)


def times_ten(x: int) -> int:
    return x * 10


def parity(x: int) -> int:
    return x % 2


def by_three(x: int) -> int | None:
    return None if x % 3 == 0 else x % 3 - 1


def pair_sum(pair: tuple[int, int]) -> int:
    return pair[0] + pair[1]


# --- what each op yields --------------------------------------------------------------


def test_fork_gives_every_branch_every_item() -> None:
    a, b, c = IterableWrapper(range(6)).fork(3)
    assert list(a.zip(b, c)) == [(i, i, i) for i in range(6)]
    assert [len(a), len(b), len(c)] == [6, 6, 6]
    assert a.main_datapipe is b.main_datapipe is c.main_datapipe
    assert isinstance(a, Branch) and isinstance(a.main_datapipe, Forker)
    assert [a.instance_id, b.instance_id, c.instance_id] == [0, 1, 2]


def test_fork_copies_when_asked() -> None:
    def firsts(copy_mode: str | None) -> tuple[bool, bool]:
        a, b = IterableWrapper([[1], [2]]).fork(2, copy=copy_mode)
        x, y = next(iter(a.zip(b)))
        return x is y, x == y

    assert firsts(None) == (True, True)
    assert firsts("shallow") == (False, True)
    assert firsts("deep") == (False, True)


def test_demux_routes_by_the_classifier() -> None:
    evens, odds = IterableWrapper(range(9)).demux(2, parity)
    assert list(evens) == [0, 2, 4, 6, 8]
    assert list(odds) == [1, 3, 5, 7]
    assert list(evens.zip(odds)) == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert isinstance(evens.main_datapipe, Demultiplexer)
    with pytest.raises(TypeError, match="no length"):
        len(evens)


def test_demux_drops_none_only_when_asked() -> None:
    ones, twos = IterableWrapper(range(9)).demux(2, by_three, drop_none=True)
    assert list(ones.concat(twos)) == [1, 4, 7, 2, 5, 8]
    ones, _ = IterableWrapper(range(9)).demux(2, by_three)
    with pytest.raises(ValueError, match=r"classifier_fn must return an int in \[0, 2\), got None.*drop_none"):
        list(ones)


def test_demux_classifier_out_of_range_and_errors_name_the_pipe() -> None:
    first, _ = IterableWrapper(range(3)).demux(2, lambda x: 5)
    with pytest.raises(ValueError, match=r"Demultiplexer\(.*got 5 for item number 0"):
        list(first)

    def broken(x: int) -> int:
        raise KeyError(x)

    first, _ = IterableWrapper(range(3)).demux(2, broken)
    with pytest.raises(KeyError) as caught:
        list(first)
    assert any("Demultiplexer" in note for note in caught.value.__notes__)


def test_round_robin_demux_deals_items_in_turn() -> None:
    branches = IterableWrapper(range(8)).round_robin_demux(3)
    assert [list(b) for b in branches] == [[0, 3, 6], [1, 4, 7], [2, 5]]
    assert [len(b) for b in branches] == [3, 3, 2]
    assert isinstance(branches[0].main_datapipe, RoundRobinDemultiplexer)


def test_unzip_splits_columns() -> None:
    pairs = IterableWrapper([(i, -i, str(i)) for i in range(4)])
    a, b, c = pairs.unzip(3)
    assert (list(a), list(b), list(c)) == ([0, 1, 2, 3], [0, -1, -2, -3], ["0", "1", "2", "3"])
    first, last = pairs.unzip(sequence_length=3, columns_to_skip=[1])
    assert list(first.zip(last)) == [(i, str(i)) for i in range(4)]
    assert isinstance(first.main_datapipe, UnZipper) and len(first) == 4
    short, _ = IterableWrapper([(1, 2), (3,)]).unzip(2)
    with pytest.raises(ValueError, match="item number 1 should hold 2 values, got 1 values"):
        list(short)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda p: p.fork(0), ValueError, "num_instances"),
        (lambda p: p.fork(2, buffer_size=-2), ValueError, "buffer_size"),
        (lambda p: p.fork(2, copy="twice"), ValueError, "copy"),
        (lambda p: p.demux(2, "not callable"), TypeError, "classifier_fn"),
        (lambda p: p.unzip(0), ValueError, "sequence_length"),
        (lambda p: p.unzip(2, columns_to_skip=[0, 1]), ValueError, "leaves no column"),
    ],
)
def test_bad_arguments_are_refused_at_construction(call: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        call(IterableWrapper(range(3)))


def test_the_hub_is_read_through_its_branches_only() -> None:
    a, _ = IterableWrapper(range(3)).fork(2)
    with pytest.raises(GraphError, match="read through its branches"):
        list(a.main_datapipe)


# --- bounded buffers --------------------------------------------------------------------


def test_a_branch_running_past_buffer_size_is_an_error_naming_the_hub() -> None:
    a, b = IterableWrapper(range(50)).fork(2, buffer_size=10)
    loader = DataLoader2(a.concat(b))
    with pytest.raises(
        BranchBufferError, match=r"Forker\(.*branch 0 has read 11 input items.*buffer_size=10"
    ) as caught:
        list(loader)
    assert isinstance(caught.value, BufferError)  # what torchdata raises
    loader.shutdown()
    evens, _ = IterableWrapper(range(50)).demux(2, parity, buffer_size=5)
    with pytest.raises(BufferError, match="Demultiplexer"):
        list(evens)


def test_within_the_buffer_and_unbounded_buffers_read_one_branch_after_another() -> None:
    a, b = IterableWrapper(range(10)).fork(2, buffer_size=10)
    assert list(a.concat(b)) == [*range(10), *range(10)]
    a, b = IterableWrapper(range(5000)).fork(2, buffer_size=-1)
    assert list(a.concat(b)) == [*range(5000), *range(5000)]


def test_a_closed_branch_holds_nothing_back() -> None:
    """A branch whose reader is done (concat closes an input it finished: here a header
    that stopped early) no longer has items queued for it."""
    a, b = IterableWrapper(range(30)).fork(2, buffer_size=5)
    loader = DataLoader2(a.header(3).concat(b))
    assert list(loader) == [0, 1, 2, *range(30)]
    loader.shutdown()


# --- graphs, copies, pickles --------------------------------------------------------------


def test_graph_tools_see_the_hub_once_in_breadth_first_order() -> None:
    source = IterableWrapper(range(6))
    left, right = source.demux(2, parity)
    doubled = left.map(times_ten)
    end = doubled.zip(right)
    assert list_dps(end) == [end, doubled, right, left, left.main_datapipe, source]
    graph = traverse_dps(end)
    ((_, inputs),) = graph.values()
    assert len(inputs) == 2  # each branch's path shows the hub, as torchdata's graphs do
    assert find_dps(graph, Demultiplexer) == [left.main_datapipe]


@pytest.mark.parametrize(
    "duplicate", [copy.deepcopy, lambda g: pickle.loads(pickle.dumps(g))], ids=["deepcopy", "pickle"]
)
def test_copies_keep_one_hub_for_all_branches(duplicate: Any) -> None:
    a, b = IterableWrapper(range(4)).fork(2)
    twin = duplicate(a.map(lambda x: -x).zip(b))
    first, second = twin.sources
    assert first.source.main_datapipe is second.main_datapipe
    assert list(twin) == [(0, 0), (-1, 1), (-2, 2), (-3, 3)]


def test_a_pipe_read_by_two_consumers_without_a_split_is_refused() -> None:
    source = IterableWrapper(range(3))
    with pytest.raises(GraphError, match=r"feeds several pipes.*fork"):
        DataLoader2(source.map(times_ten).zip(source))


def test_each_iteration_reads_the_input_anew() -> None:
    a, b = IterableWrapper(range(4)).fork(2)
    assert list(a) == list(b) == list(a) == [0, 1, 2, 3]


# --- resume -----------------------------------------------------------------------------


def _fork_zip() -> Any:
    a, b = IterableWrapper(range(12)).shuffle(buffer_size=5).fork(2)
    return a.map(times_ten).zip(b)


def _fork_concat() -> Any:
    a, b = IterableWrapper(range(8)).fork(2)
    return a.concat(b.map(times_ten))


def _demux_mux() -> Any:
    ones, twos = IterableWrapper(range(15)).demux(2, by_three, drop_none=True)
    return ones.mux(twos.map(times_ten))


def _round_robin_mux_longest() -> Any:
    return IterableWrapper(range(11)).mux(IterableWrapper(range(20, 25))).round_robin_demux(3)[1].enumerate()


def _unzip_prefetched_branch() -> Any:
    a, b = IterableWrapper([(i, i * i) for i in range(14)]).unzip(2)
    return a.prefetch(3).zip(b.shuffle(buffer_size=4))


def _nested_forks() -> Any:
    a, b = IterableWrapper(range(9)).fork(2)
    c, d = b.demux(2, parity)
    return a.zip(c.concat(d))


@pytest.mark.parametrize(
    "make",
    [_fork_zip, _fork_concat, _demux_mux, _round_robin_mux_longest, _unzip_prefetched_branch, _nested_forks],
    ids=lambda f: f.__name__.strip("_"),
)
def test_resumes_exactly_at_every_cut_of_two_epochs(make: Any) -> None:
    check_resume_at_every_cut(make, 11, cut_epochs=(0, 1))


def test_a_forged_state_is_refused_naming_the_hub() -> None:
    loader = DataLoader2(_fork_zip())
    it = iter(loader)
    next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    loader.shutdown()
    text = json.dumps(state)
    forged = json.loads(text.replace('"cursors": [', '"cursors": [4, ', 1))
    assert forged != state
    with pytest.raises(StateError, match=r"Forker.*'cursors' must be 2 ints"):
        DataLoader2(_fork_zip()).load_state_dict(forged)


# --- in workers ---------------------------------------------------------------------------


def forked_before_sharding() -> Any:
    a, b = IterableWrapper(range(40)).shuffle().fork(2)
    return a.zip(b.map(times_ten)).sharding_filter().map(pair_sum)


def demuxed_after_sharding() -> Any:
    evens, odds = IterableWrapper(range(40)).sharding_filter().demux(2, parity)
    return evens.mux_longest(odds.map(times_ten))


def read(make: Any, workers: int | None, seed: int = 4) -> list[list[Any]]:
    service = MultiProcessingReadingService(workers) if workers is not None else None
    loader = DataLoader2(make(), reading_service=service)
    loader.seed(seed)
    try:
        return [list(loader) for _ in range(2)]
    finally:
        loader.shutdown()


def test_a_fork_before_the_sharding_point_does_not_depend_on_num_workers() -> None:
    expected = read(forked_before_sharding, None)
    assert sorted(expected[0]) == sorted(11 * x for x in range(40)) and expected[0] != expected[1]
    for workers in (1, 2, 3):
        assert read(forked_before_sharding, workers) == expected


@pytest.mark.parametrize(("saved_with", "resumed_with"), [(2, 2), (2, 3), (0, 2)])
def test_a_fork_before_the_sharding_point_resumes_across_worker_counts(saved_with: int, resumed_with: int) -> None:
    expected = read(forked_before_sharding, None, seed=9)
    for cut in (0, 7, 23, 40):
        epoch, following = resume_after(forked_before_sharding, cut, 9, saved_with, resumed_with)
        assert epoch == expected[0], cut
        assert following == expected[1], cut


def test_a_demux_after_the_sharding_point_is_replicated_and_resumes_with_the_same_workers() -> None:
    expected = read(demuxed_after_sharding, 2, seed=3)
    assert sorted(expected[0]) == sorted([x for x in range(0, 40, 2)] + [10 * x for x in range(1, 40, 2)])
    assert read(demuxed_after_sharding, 2, seed=3) == expected
    for cut in (0, 1, 19, 33, 40):
        epoch, following = resume_after(demuxed_after_sharding, cut, 3, 2, 2)
        assert epoch == expected[0], cut
        assert following == expected[1], cut


def _both_branches_prefetched() -> Any:
    a, b = IterableWrapper(range(300)).fork(2, buffer_size=20)
    return a.prefetch(3).map(times_ten).zip(b.prefetch(5))


def test_branches_read_from_two_threads_hand_out_every_item_in_order() -> None:
    for _ in range(5):
        assert list(DataLoader2(_both_branches_prefetched())) == [(10 * i, i) for i in range(300)]


def test_branches_read_from_two_threads_resume_exactly() -> None:
    full = list(DataLoader2(_both_branches_prefetched()))
    for cut in (0, 1, 57, 150, 299, 300):
        loader = DataLoader2(_both_branches_prefetched())
        it = iter(loader)
        head = [next(it) for _ in range(cut)]
        state = json.loads(json.dumps(loader.state_dict()))
        loader.shutdown()
        again = DataLoader2(_both_branches_prefetched())
        again.load_state_dict(state)
        assert finish_epoch(again, head, full) == full, cut
        again.shutdown()
