"""DataLoader2.stats(): per-stage items and time, and the bottleneck named."""

from __future__ import annotations

import gc
import sys
import threading
import time
import weakref
from typing import Any

import pytest

from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.core.passes import PassContext
from conveyor.observe.stats import CONSUMER, UNSAMPLED, WORKER_RUNTIME, StageTotals, spread_unsampled
from conveyor.pipes import IterableWrapper, Mapper

pytestmark = [pytest.mark.timeout(120), pytest.mark.timing]


def spin(seconds: float) -> None:
    """Busy work (not a sleep): the stage really uses the CPU."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def cheap(x: int) -> int:
    return x + 1


def slow(x: int) -> int:
    spin(0.002)
    return x


def odd(x: int) -> bool:
    return x % 2 == 1


def slow_pipeline(n: int = 300):
    return IterableWrapper(range(n)).sharding_filter().map(cheap).map(slow).filter(odd).map(cheap)


def stats_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "conveyor-stats"]


def test_a_deliberately_slow_stage_is_named_the_bottleneck():
    with DataLoader2(slow_pipeline()) as loader:
        assert list(loader) == [x + 2 for x in range(300) if (x + 1) % 2 == 1]
        report = loader.stats()
    assert report.bottleneck == "Mapper(slow)"
    by_label = {(s.index, s.label): s for s in report.stages}
    slowest = max(report.stages, key=lambda s: s.busy_s)
    assert slowest.label == "Mapper(slow)" and slowest.busy_s >= 0.3  # 300 x 2 ms, sampled
    assert [s.items for s in report.stages] == [150, 150, 300, 300, 300, 300]  # from the end up
    assert report.items == 150
    assert report.stages[0].waiting_s >= 0.3  # the last map waited on the slow one
    assert report.consumer_wait_s >= 0.3 and report.wall_s >= report.consumer_wait_s
    assert "bottleneck: Mapper(slow)" in report.table()
    assert len(by_label) == 6


def test_a_slow_loop_is_the_bottleneck_when_the_loader_keeps_up():
    # 200 x 8 ms of the loop's own work: the consumer's waits (5.8-7.6 ms an epoch here,
    # mostly its start) stay under 5% of the wall, ~80 ms, even when one of them stalls
    # for tens of milliseconds.
    with DataLoader2(IterableWrapper(range(200)).map(cheap)) as loader:
        for _ in loader:
            spin(0.008)
        report = loader.stats()
    assert report.bottleneck == CONSUMER
    assert report.consumer_wait_s < 0.05 * report.wall_s


def test_a_stage_behind_a_prefetch_thread_is_found():
    pipe = IterableWrapper(range(200)).map(slow).prefetch(4).map(cheap)
    with DataLoader2(pipe) as loader:
        assert len(list(loader)) == 200
        report = loader.stats()
    assert report.bottleneck == "Mapper(slow)"
    prefetch = next(s for s in report.stages if s.label == "Prefetcher")
    assert prefetch.waiting_s > prefetch.busy_s


def test_stats_are_per_epoch_and_start_no_thread():
    with DataLoader2(slow_pipeline(50)) as loader:
        assert loader.stats().stages == ()  # nothing read yet
        list(loader)
        first = loader.stats()
        iterator = iter(loader)
        next(iterator)
        assert not stats_threads()
        partial = loader.stats()
        assert partial.items == 1 and first.items == 25


def test_the_stack_sampler_is_opt_in_and_its_thread_ends_with_the_epoch():
    with DataLoader2(slow_pipeline(50), collect_stats="sample") as loader:
        list(loader)
        assert not stats_threads()
        iterator = iter(loader)
        next(iterator)
        assert len(stats_threads()) == 1
        assert loader.stats().items == 1
    assert not stats_threads()
    with pytest.raises(ValueError, match="collect_stats"):
        DataLoader2(slow_pipeline(5), collect_stats="always")


def test_stats_can_be_turned_off():
    with DataLoader2(IterableWrapper(range(3)), collect_stats=False) as loader:
        assert list(loader) == [0, 1, 2]
        assert not stats_threads()
        with pytest.raises(RuntimeError, match="collect_stats=False"):
            loader.stats()


def test_worker_stages_are_summed_over_workers_and_the_slow_one_named():
    with DataLoader2(slow_pipeline(200), reading_service=MultiProcessingReadingService(2)) as loader:
        assert len(list(loader)) == 100
        report = loader.stats()
    workers = [s for s in report.stages if s.where == "workers"]
    assert workers and all(s.processes == 2 for s in workers)
    # From the end up; every worker reads the whole source and keeps its share at the sharding
    # point; then the workers' own loop (capturing states, sending items).
    assert [s.items for s in workers] == [100, 100, 200, 200, 200, 400, 0]
    assert workers[-1].label == WORKER_RUNTIME
    assert report.bottleneck == "Mapper(slow)"
    slow = next(s for s in workers if s.label == "Mapper(slow)")
    # 200 x 2 ms of CPU, split by the samples; worker 1's items are all filtered out, so
    # its one pull, its first, is untraced: worker 0's samples split its time
    assert slow.busy_s >= 0.2
    assert UNSAMPLED not in [s.label for s in report.stages]
    main = [s for s in report.stages if s.where == "main"]
    assert [s.label for s in main] == ["MergedWorkerOutput"]


def fast(x: int) -> int:
    return x + 1


def sleepy(x: int) -> int:
    time.sleep(0.003)  # waits (I/O, a remote call): holds the pipeline back without computing
    return x


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_stage_that_sleeps_is_named_the_bottleneck(num_workers):
    pipe = IterableWrapper(range(200)).sharding_filter().map(fast).map(sleepy).map(fast)
    with DataLoader2(pipe, reading_service=MultiProcessingReadingService(num_workers)) as loader:
        assert len(list(loader)) == 200
        report = loader.stats()
    assert report.bottleneck == "Mapper(sleepy)"
    stage = next(s for s in report.stages if s.label == "Mapper(sleepy)")
    assert stage.busy_s >= 0.3  # 200 x 3 ms of sleep, charged as wall time the worker did not compute


def read_slowly(x: int) -> int:
    """Blocks in a C call that a signal does not cut short or restart (a read on a pipe)."""
    import os
    import threading as threads

    reader, writer = os.pipe()
    threads.Timer(0.003, os.write, (writer, b"x")).start()
    try:
        os.read(reader, 1)
    finally:
        os.close(reader)
        os.close(writer)
    return x


def test_a_stage_blocked_in_io_in_workers_is_named_the_bottleneck():
    pipe = IterableWrapper(range(100)).sharding_filter().map(fast).map(read_slowly).map(fast)
    with DataLoader2(pipe, reading_service=MultiProcessingReadingService(2)) as loader:
        assert len(list(loader)) == 100
        report = loader.stats()
    assert report.bottleneck == "Mapper(read_slowly)"


def short_spin(x: int) -> int:
    spin(160e-6)
    return x


def test_worker_time_is_not_skewed_toward_their_loop():
    """Workers send every few milliseconds; a sampler that looks only when the GIL is
    released would charge the sends and miss a stage costing tens of us per item. (160 us:
    several times what the main process is seen to spend per item receiving, even under
    load, and on Python 3.12+, where tracing's own cost inflates its few microseconds.)
    The main process's time comes from the few of its samples that catch a chunk's arrival
    (from 3.12 on, traced at several microseconds a call): 15,000 items give it enough of
    them that one does not outweigh the workers' stage (3,000 once did, under two hogs)."""
    pipe = IterableWrapper(range(15_000)).sharding_filter().map(short_spin)
    with DataLoader2(pipe, reading_service=MultiProcessingReadingService(2)) as loader:
        assert len(list(loader)) == 15_000
        report = loader.stats()
    assert report.bottleneck == "Mapper(short_spin)"
    stage = next(s for s in report.stages if s.label == "Mapper(short_spin)")
    loop = next(s for s in report.stages if s.label == WORKER_RUNTIME)
    assert stage.busy_s > loop.busy_s
    # 15,000 x 160 us = 2.4 s of spinning, sampled. Preemption by other processes stretches
    # the workers' pulls (their wall time is what they cost the pipeline), so the most a
    # loaded machine allows is the two workers' whole time, give or take the sampling's
    # error (a fifth: measured 2.01x the epoch's wall under 3.12, whose tracing costs more);
    # busy time is never invented (before preemption was taken out: 2.6x under 2 hogs).
    assert 1.2 <= stage.busy_s <= 1.2 * 2 * report.wall_s


def test_the_cpu_clock_restores_the_signal_it_borrowed():
    import signal

    from conveyor.observe.stack_sampler import StageSampler

    before = signal.getsignal(signal.SIGPROF)
    pipe = IterableWrapper(range(300)).map(slow)
    sampler = StageSampler(pipe, cpu_clock=True)
    sampler.start()
    assert signal.getsignal(signal.SIGPROF) is not before
    assert sum(1 for _ in PassContext(meters=sampler.meters).open(pipe, None)) == 300
    sampler.stop()
    assert signal.getsignal(signal.SIGPROF) is before
    assert signal.getitimer(signal.ITIMER_PROF) == (0.0, 0.0)
    assert not stats_threads()
    totals = {t.label: t for t in sampler.totals()}
    assert totals["Mapper(slow)"].items == 300 and totals["Mapper(slow)"].busy_s >= 0.3


class Tracked:
    """An item whose lifetime the test watches."""


def test_sampling_keeps_no_item_alive():
    """A frame object still referenced when its function returns keeps a copy of its
    locals; sampled frames must not outlive the sample, or items (and their shared
    memory) stay alive until the cyclic GC runs. With the GC off, any such cycle shows."""
    import gc
    import weakref

    alive: weakref.WeakSet[Tracked] = weakref.WeakSet()

    def make(i: int) -> Tracked:
        item = Tracked()
        alive.add(item)
        spin(0.001)
        return item

    gc.collect()
    gc.disable()
    try:
        with DataLoader2(IterableWrapper(range(300)).map(make).prefetch(2)) as loader:
            peak = 0
            for item in loader:
                del item
                peak = max(peak, len(alive))
    finally:
        gc.enable()
    assert peak <= 8, f"{peak} items alive at once: something holds them"


def test_two_loaders_in_one_process_keep_their_own_numbers():
    fast_loader = DataLoader2(IterableWrapper(range(200)).map(cheap))
    slow_loader = DataLoader2(IterableWrapper(range(200)).map(slow))
    with fast_loader, slow_loader:
        for _ in zip(fast_loader, slow_loader, strict=True):
            pass
        fast, slow_report = fast_loader.stats(), slow_loader.stats()
    assert slow_report.bottleneck == "Mapper(slow)"
    assert all(s.busy_s < 0.1 for s in fast.stages), fast  # the slow loader's time is not its
    # The slow loader's 200 x 2 ms of spinning is its wait (0.40-0.43 s alone); the fast
    # one waits a few ms, plus whatever preemption falls inside its next() calls: under
    # load (3.12, beside another suite) that was 0.16 s once. Shared accounting would
    # give both the same.
    assert slow_report.consumer_wait_s > 0.3
    assert fast.consumer_wait_s < 0.5 * slow_report.consumer_wait_s, (fast, slow_report)


class Evens(Mapper):
    """A subclass whose __iter__ calls the base class's: its items count once."""

    def __iter__(self):
        for item in super().__iter__():
            if item % 2 == 0:
                yield item


def test_an_op_extending_another_counts_its_items_once():
    with DataLoader2(Evens(IterableWrapper(range(100)), abs)) as loader:
        assert len(list(loader)) == 50
        report = loader.stats()
    assert report.stages[0].label == "Evens(abs)" and report.stages[0].items == 50


def extra_map_in_worker_0(datapipe, info):
    return datapipe.map(cheap) if info.worker_id == 0 else datapipe


def test_workers_with_different_graphs_get_rows_of_their_own():
    service = MultiProcessingReadingService(2, worker_init_fn=extra_map_in_worker_0)
    with DataLoader2(IterableWrapper(range(40)).sharding_filter(), reading_service=service) as loader:
        assert len(list(loader)) == 40
        report = loader.stats()
    labels = [s.label for s in report.stages if s.where == "workers"]
    assert any(label.endswith("[worker 1]") for label in labels) or any("[worker 0]" in label for label in labels)
    assert sum(s.items for s in report.stages if s.label.startswith("ShardingFilter")) == 40


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_random_access_source_read_by_position_is_metered_as_itself(num_workers):
    """A sharding point reads only its positions from a random-access source; the source's
    stage still counts its items and is charged for loading them."""
    from conveyor.pipes import SequenceWrapper

    # 200 items: enough work that starting the workers (a fork each, charged to the main
    # process's reader, ~90 ms under two CPU hogs) cannot outweigh 0.2 s of it per worker.
    service = MultiProcessingReadingService(num_workers)
    with DataLoader2(SequenceWrapper(range(200)).map(slow), reading_service=service) as loader:
        assert sorted(loader) == list(range(200))
        report = loader.stats()
    source = next(s for s in report.stages if s.label == "MapToIterConverter")
    assert source.items == 200
    assert report.bottleneck == "MapToIterConverter"


def what_this_process_installed(x: int) -> tuple[int, bool, tuple[float, float], list[str]]:
    """From inside a worker: its SIGPROF handler, whether a tracer or profiler is set between
    items, its profiling timer and the threads it runs besides its own."""
    import signal

    others = sorted(t.name for t in threading.enumerate() if t is not threading.main_thread())
    installed = signal.getsignal(signal.SIGPROF) is not signal.SIG_DFL
    return x, installed, signal.getitimer(signal.ITIMER_PROF), others


def test_default_statistics_install_nothing_in_any_process():
    """No signal handler, no interval timer, no sampling thread, in the main process or in a
    worker (no thread at all in a worker on Linux, where the kernel watches the lifeline;
    elsewhere its one thread of conveyor's is the watchdog)."""
    import signal

    handler = signal.getsignal(signal.SIGPROF)
    linux = sys.platform.startswith("linux")
    pipe = IterableWrapper(range(40)).sharding_filter().map(what_this_process_installed)
    with DataLoader2(pipe, reading_service=MultiProcessingReadingService(2)) as loader:
        seen = list(loader)
        assert not [t for t in threading.enumerate() if t.name.startswith("conveyor")]
        assert loader.stats().items == 40
    assert signal.getsignal(signal.SIGPROF) is handler and signal.getitimer(signal.ITIMER_PROF) == (0.0, 0.0)
    for _, installed, timer, others in seen:
        assert not installed and timer == (0.0, 0.0) and others == ([] if linux else ["conveyor-watchdog"])


def traced_now(x: int) -> tuple[int, bool]:
    return x, sys.gettrace() is not None


def test_a_workers_first_pull_is_not_traced():
    """Its first pull runs what its stages import at first use: traced, that delayed the
    first item by milliseconds. Later pulls are sampled as ever."""
    pipe = IterableWrapper(range(400)).sharding_filter().map(traced_now)
    with DataLoader2(pipe, reading_service=MultiProcessingReadingService(2)) as loader:
        seen = dict(loader)
        report = loader.stats()
    assert sorted(seen) == list(range(400))
    assert seen[0] is False and seen[1] is False  # each worker's first item
    assert any(seen.values())  # some later pull was traced: the sampling goes on
    assert report.items == 400


def test_a_users_profiler_is_never_displaced():
    """While the user profiles, statistics count items and time nothing: the profile
    function stays the user's from the first item to the last."""
    import sys

    calls = []

    def users_profiler(frame, event, arg):
        calls.append(event)

    sys.setprofile(users_profiler)
    try:
        with DataLoader2(IterableWrapper(range(200)).map(cheap)) as loader:
            for _ in loader:
                assert sys.getprofile() is users_profiler
            report = loader.stats()
    finally:
        sys.setprofile(None)
    assert calls and report.items == 200


class Received:
    """An item that, once it reaches the main process, is counted while it lives there."""

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return _received, ()


RECEIVED: weakref.WeakSet[Received] = weakref.WeakSet()


def _received() -> Received:
    item = Received()
    RECEIVED.add(item)
    return item


def make_received(i: int) -> Received:
    return Received()


def test_the_numbers_outlive_the_epoch_but_its_buffered_items_do_not():
    """``stats()`` answers after an epoch is abandoned; the passes it counted are let go
    then, with what they had buffered: here, the items the workers sent ahead and the
    merge held (with their shared memory, for large ones), even while the loader lives."""
    graph = IterableWrapper(range(200)).sharding_filter().map(make_received)
    loader = DataLoader2(graph, reading_service=MultiProcessingReadingService(2))
    it = iter(loader)
    next(it)
    deadline = time.monotonic() + 20
    while len(RECEIVED) < 10 and time.monotonic() < deadline:  # the workers run ahead into the merge
        next(it)
    loader.shutdown()
    del it
    gc.collect()
    assert len(RECEIVED) == 0, f"{len(RECEIVED)} items of the abandoned epoch are still held"
    assert loader.stats().items >= 1


def test_time_no_sample_split_is_split_as_the_other_workers_samples_split_theirs():
    rows = [
        StageTotals("Mapper(slow)", 10, 0.3, 0.0, 2),
        StageTotals("IterableWrapper", 20, 0.1, 0.2, 2),
        StageTotals(UNSAMPLED, 0, 0.4, 0.0, 2),
        StageTotals(WORKER_RUNTIME, 0, 0.05, 0.0, 2),
    ]
    spread = spread_unsampled(rows)
    assert [row.label for row in spread] == ["Mapper(slow)", "IterableWrapper", WORKER_RUNTIME]
    assert spread[0].busy_s == pytest.approx(0.6) and spread[1].busy_s == pytest.approx(0.2)
    assert spread[1].waiting_s == pytest.approx(0.4)  # the same shares, twice the time
    assert spread[2].busy_s == 0.05  # the loop's own time is not the pulls'


def test_time_no_sample_split_stays_visible_where_nothing_can_split_it():
    rows = [StageTotals("Mapper(slow)", 0, 0.0, 0.0), StageTotals(UNSAMPLED, 0, 0.4), StageTotals(WORKER_RUNTIME)]
    assert [row.label for row in spread_unsampled(rows)] == ["Mapper(slow)", UNSAMPLED, WORKER_RUNTIME]
    nothing = [StageTotals("Mapper(slow)", 3, 0.2), StageTotals(UNSAMPLED), StageTotals(WORKER_RUNTIME)]
    assert [row.label for row in spread_unsampled(nothing)] == ["Mapper(slow)", WORKER_RUNTIME]
