"""Dispatch mode: a source read once, in the main process, fed round-robin to workers."""

from __future__ import annotations

import multiprocessing

import pytest

from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.errors import GraphError, WorkerError
from conveyor.pipes import IterableWrapper, IterDataPipe, ShardingRoundRobinDispatcher
from pipeline_helpers import (
    finish_epoch,
    jitter,
    mid_epoch_state,
    not_multiple_of_three,
    read_epochs,
    resume_after,
    tag,
    twice,
)

pytestmark = pytest.mark.timeout(120)


class OnceOnly(IterDataPipe):
    """A stream that can be read once per pass and counts every read, like a socket."""

    def __init__(self, n):
        self.n = n
        self.reads = 0

    def __iter__(self):
        for i in range(self.n):
            self.reads += 1
            yield i


def per_item(n=90):
    return (
        IterableWrapper(range(n))
        .shuffle(buffer_size=7)
        .sharding_round_robin_dispatch()
        .map(tag)
        .filter(not_multiple_of_three)
        .flatmap(twice)
        .random_map(jitter)
    )


def epochs(pipe, seed=3, count=2, **service):
    return read_epochs(pipe, seed, count, **service)


@pytest.fixture(scope="module")
def single_process():
    loader = DataLoader2(per_item())
    loader.seed(3)
    return [list(loader) for _ in range(2)]


def test_functional_name_and_in_process_behaviour():
    pipe = IterableWrapper(range(5)).sharding_round_robin_dispatch()
    assert isinstance(pipe, ShardingRoundRobinDispatcher)
    assert list(DataLoader2(pipe)) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("num_workers", [1, 2, 3])
def test_same_output_for_every_worker_count(single_process, num_workers, start_method):
    assert epochs(per_item(), num_workers=num_workers, multiprocessing_context=start_method) == single_process


def test_the_source_is_read_once_per_epoch_in_the_main_process():
    source = OnceOnly(40)
    loader = DataLoader2(
        source.sharding_round_robin_dispatch().map(tag), reading_service=MultiProcessingReadingService(3)
    )
    assert [pair[0] for pair in loader] == list(range(40))
    assert [pair[0] for pair in loader] == list(range(40))
    dispatcher = loader.reading_service._dispatcher
    (upstream,) = dispatcher._upstreams
    assert upstream.reads == 80, "the main process read each item once per epoch"
    loader.shutdown()


def drop_if_odd(pair):
    return pair[0] % 2 == 0


@pytest.mark.parametrize("in_order", [True, False])
def test_a_worker_whose_items_are_all_dropped_does_not_stall_the_others(in_order):
    pipe = IterableWrapper(range(2000)).sharding_round_robin_dispatch().map(tag).filter(drop_if_odd)
    got = epochs(pipe, count=1, num_workers=2, in_order=in_order, worker_prefetch_cnt=1)[0]
    assert sorted(p[0] for p in got) == list(range(0, 2000, 2))


def test_grouping_after_dispatch_merges_round_robin_and_resumes():
    def build():
        return (
            IterableWrapper(range(60)).sharding_round_robin_dispatch().map(tag).filter(not_multiple_of_three).batch(4)
        )

    reference = epochs(build(), count=2, num_workers=2)
    assert reference == epochs(build(), count=2, num_workers=2)
    for cut in (0, 3, len(reference[0])):
        assert resume_after(build, cut, 3, 2, 2) == (reference[0], reference[1])


@pytest.mark.parametrize("num_workers", [1, 2, 3])
def test_mid_epoch_resume_is_exact(single_process, num_workers):
    full = single_process[0]
    for cut in (0, 1, 17, len(full) // 2, len(full)):
        epoch, following = resume_after(per_item, cut, 3, num_workers, num_workers)
        assert epoch == full, f"cut {cut}"
        assert following == single_process[1]


def one_by_one(n=60):
    return IterableWrapper(range(n)).shuffle(buffer_size=7).sharding_round_robin_dispatch().map(tag)


def test_a_dispatched_epoch_of_one_item_per_item_resumes_on_another_worker_count():
    reference = DataLoader2(one_by_one())
    reference.seed(3)
    expected = list(reference)
    for cut in (0, 1, 17, 59):
        head, state = mid_epoch_state(one_by_one, cut, seed=3, num_workers=2)
        loader = DataLoader2(one_by_one(), reading_service=MultiProcessingReadingService(3))
        try:
            loader.load_state_dict(state)
            assert finish_epoch(loader, head, expected) == expected, cut
        finally:
            loader.shutdown()


def test_a_dispatched_epoch_that_expands_items_resumes_only_with_its_worker_count():
    _, state = mid_epoch_state(per_item, 5, seed=3, num_workers=2)
    with pytest.raises(ValueError, match="num_workers=2"):
        DataLoader2(per_item(), reading_service=MultiProcessingReadingService(3)).load_state_dict(state)


def test_a_dispatched_epoch_resumes_without_workers_is_refused_clearly():
    _, state = mid_epoch_state(one_by_one, 1, num_workers=2)
    with pytest.raises(ValueError, match="only between counts above 0"):
        DataLoader2(one_by_one(), reading_service=MultiProcessingReadingService(0)).load_state_dict(state)


def test_early_exit_then_a_full_epoch(single_process):
    loader = DataLoader2(per_item(), reading_service=MultiProcessingReadingService(2))
    loader.seed(3)
    try:
        for count, _ in enumerate(loader):
            if count == 5:
                break
        assert list(loader) == single_process[1]
    finally:
        loader.shutdown()


class Broken(IterDataPipe):
    def __init__(self, source):
        self.source = source

    def __iter__(self):
        for item in self.source:
            if item == 7:
                raise OSError("the stream broke")
            yield item


def test_an_error_while_dispatching_names_the_dispatcher():
    earlier = set(multiprocessing.active_children())  # an earlier test's loader may still be collected
    loader = DataLoader2(
        Broken(IterableWrapper(range(20))).sharding_round_robin_dispatch().map(tag),
        reading_service=MultiProcessingReadingService(2),
    )
    with pytest.raises(WorkerError, match=r"Caught OSError in dispatching process \(the main process\): the stream"):
        list(loader)
    loader.shutdown()
    assert not set(multiprocessing.active_children()) - earlier


def test_prefetch_after_the_dispatch_point_is_refused():
    pipe = IterableWrapper(range(5)).sharding_round_robin_dispatch().prefetch(2)
    loader = DataLoader2(pipe, reading_service=MultiProcessingReadingService(2))
    with pytest.raises(GraphError, match="prefetch"):
        list(loader)
    loader.shutdown()
