"""``MultiProcessingReadingService(worker_type="thread")``: the same output, states, hooks,
errors and statistics as worker processes, in threads of this process, with items handed
over as the objects the pipeline made."""

from __future__ import annotations

import json
import pickle
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from conveyor import DataLoader2, MultiProcessingReadingService, PauseIteration, WorkerInfo, get_worker_info
from conveyor.errors import WorkerError
from conveyor.graph import SHARDING_PRIORITIES
from conveyor.observe.stats import WORKER_RUNTIME
from conveyor.pipes import IterableWrapper, IterDataPipe
from pipeline_helpers import jitter, per_item_pipeline, tag

pytestmark = pytest.mark.timeout(120)

KINDS = ["process", "thread"]


def collate_pairs(batch: list[tuple[int, int]]) -> np.ndarray:
    return np.asarray(batch)


def batched_pipeline() -> IterDataPipe:
    return IterableWrapper(range(50)).shuffle().sharding_filter().map(tag).batch(4).map(collate_pairs)


def dispatched_pipeline() -> IterDataPipe:
    return IterableWrapper(range(40)).shuffle().sharding_round_robin_dispatch().map(tag).random_map(jitter)


def double(x: Any) -> Any:
    return x * 2


def two_dispatch_channels() -> IterDataPipe:
    def dispatched(n: int, offset: int) -> IterDataPipe:
        source = IterableWrapper([offset + i for i in range(n)]).shuffle()
        return source.sharding_round_robin_dispatch(SHARDING_PRIORITIES.MULTIPROCESSING)

    return dispatched(10, 0).map(double).zip(dispatched(10, 100))


def big_array(i: int) -> np.ndarray:
    """1 MiB: a worker process sends it through its shared-memory ring."""
    return np.full(1 << 17, i, dtype=np.float64)


def arrays_pipeline() -> IterDataPipe:
    return IterableWrapper(range(24)).shuffle().sharding_filter().map(big_array)


def service(kind: str, workers: int = 2, **options: Any) -> MultiProcessingReadingService | None:
    if kind == "in-process":
        return None
    return MultiProcessingReadingService(workers, worker_type=kind, **options)


def read(make: Callable[[], IterDataPipe], kind: str, workers: int = 2, seed: int = 5, **options: Any) -> list[Any]:
    """Two seeded epochs."""
    with DataLoader2(make(), reading_service=service(kind, workers, **options)) as loader:
        loader.seed(seed)
        return [list(loader) for _ in range(2)]


def same(a: Any, b: Any) -> bool:
    """Equal item by item, arrays by dtype, shape and content."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape and bool((a == b).all())
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


# --- arguments ------------------------------------------------------------------------------


def test_worker_type_is_checked_shown_and_pickled() -> None:
    with pytest.raises(ValueError, match=r"worker_type must be 'process' or 'thread', got 'threads'"):
        MultiProcessingReadingService(2, worker_type="threads")
    with pytest.raises(TypeError, match="worker_type must be a str"):
        MultiProcessingReadingService(2, worker_type=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="leave multiprocessing_context None"):
        MultiProcessingReadingService(2, worker_type="thread", multiprocessing_context="spawn")
    threads = MultiProcessingReadingService(2, worker_type="thread", timeout=5)
    assert threads.worker_type == "thread"
    assert MultiProcessingReadingService(2).worker_type == "process"
    assert repr(threads) == "MultiProcessingReadingService(num_workers=2, timeout=5, worker_type='thread')"
    assert "worker_type='process'" in repr(MultiProcessingReadingService(2))
    copied = pickle.loads(pickle.dumps(threads))
    assert copied.worker_type == "thread" and repr(copied) == repr(threads)


# --- the same output ------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_per_item_output_is_the_same_with_threads_processes_or_none(workers: int) -> None:
    expected = read(per_item_pipeline, "in-process")
    assert read(per_item_pipeline, "thread", workers) == expected
    assert read(per_item_pipeline, "process", workers) == expected


@pytest.mark.parametrize(
    "make", [batched_pipeline, dispatched_pipeline, two_dispatch_channels, arrays_pipeline], ids=lambda f: f.__name__
)
def test_threads_give_what_processes_give(make: Callable[[], IterDataPipe]) -> None:
    threads = read(make, "thread", 3)
    assert same(threads, read(make, "process", 3))
    assert not same(threads[0], threads[1])  # each epoch draws anew


@pytest.mark.parametrize("make", [dispatched_pipeline, arrays_pipeline], ids=lambda f: f.__name__)
def test_per_item_dispatch_and_arrays_match_one_process(make: Callable[[], IterDataPipe]) -> None:
    assert same(read(make, "thread", 2), read(make, "in-process"))


@pytest.mark.parametrize(
    "options",
    [{"in_order": False}, {"worker_prefetch_cnt": 0}, {"main_prefetch_cnt": 0}, {"main_prefetch_cnt": 1}],
    ids=str,
)
def test_the_other_arguments_apply_to_threads(options: dict[str, Any]) -> None:
    expected = read(per_item_pipeline, "in-process")
    got = read(per_item_pipeline, "thread", 2, **options)
    if options.get("in_order") is False:
        assert [sorted(epoch) for epoch in got] == [sorted(epoch) for epoch in expected]
    else:
        assert got == expected


REGISTRY: dict[int, Any] = {}
_REGISTRY_LOCK = threading.Lock()


def made_here(i: int) -> tuple[int, Any]:
    """An item that cannot pickle (a lock), remembered by its number."""
    item = (i, threading.Lock())
    with _REGISTRY_LOCK:
        REGISTRY[i] = item
    return item


def test_items_are_handed_over_as_the_objects_the_pipeline_made() -> None:
    REGISTRY.clear()
    with DataLoader2(
        IterableWrapper(range(30)).sharding_filter().map(made_here), reading_service=service("thread", 3)
    ) as loader:
        items = list(loader)
    assert [i for i, _ in items] == list(range(30))
    assert all(item is REGISTRY[item[0]] for item in items)  # no copy, no pickling


def test_arrays_arrive_without_a_copy_and_belong_to_the_user() -> None:
    with DataLoader2(arrays_pipeline(), reading_service=service("thread", 2)) as loader:
        loader.seed(1)
        arrays = list(loader)
    assert sorted(int(a[0]) for a in arrays) == list(range(24))
    assert all(a.flags.owndata and a.flags.writeable for a in arrays)
    arrays[0][:] = -1  # the user's to change


# --- states ---------------------------------------------------------------------------------


def mid_epoch(make: Callable[[], IterDataPipe], cut: int, kind: str, workers: int) -> tuple[list[Any], Any]:
    with DataLoader2(make(), reading_service=service(kind, workers)) as loader:
        loader.seed(3)
        iterator = iter(loader)
        head = [next(iterator) for _ in range(cut)]
        return head, json.loads(json.dumps(loader.state_dict()))


def resumed(make: Callable[[], IterDataPipe], state: Any, kind: str, workers: int) -> tuple[list[Any], list[Any]]:
    """The rest of the saved epoch, then the next epoch."""
    with DataLoader2(make(), reading_service=service(kind, workers)) as loader:
        loader.load_state_dict(state)
        return list(loader), list(loader)


@pytest.mark.parametrize(
    ("saved", "resumed_as"),
    [
        (("thread", 2), ("thread", 2)),
        (("thread", 2), ("process", 2)),
        (("process", 2), ("thread", 2)),
        (("thread", 3), ("process", 1)),
        (("process", 2), ("thread", 3)),
        (("thread", 2), ("process", 0)),  # 0: in this process
        (("thread", 0), ("thread", 2)),
    ],
    ids=str,
)
def test_a_per_item_state_resumes_exactly_across_worker_types_and_counts(saved: Any, resumed_as: Any) -> None:
    expected = read(per_item_pipeline, "in-process", seed=3)
    for cut in (0, 1, 17, len(expected[0]) - 1, len(expected[0])):
        head, state = mid_epoch(per_item_pipeline, cut, *saved)
        rest, following = resumed(per_item_pipeline, state, *resumed_as)
        if cut == len(expected[0]):  # after the last item, the first iter() is the next epoch
            assert rest == expected[1], cut
            continue
        assert head + rest == expected[0], cut
        assert following == expected[1], cut


@pytest.mark.parametrize(
    "make", [batched_pipeline, dispatched_pipeline, two_dispatch_channels], ids=lambda f: f.__name__
)
def test_a_state_resumes_exactly_in_the_other_worker_type_with_the_same_count(make: Callable[[], IterDataPipe]) -> None:
    expected = read(make, "process", 2, seed=3)
    for cut in range(0, len(expected[0]) + 1, 4):
        for saved, resumed_as in (("thread", "process"), ("process", "thread"), ("thread", "thread")):
            head, state = mid_epoch(make, cut, saved, 2)
            rest, following = resumed(make, state, resumed_as, 2)
            if cut == len(expected[0]):  # after the last item, the first iter() is the next epoch
                assert same(rest, expected[1]), (cut, saved, resumed_as)
                continue
            assert same(head + rest, expected[0]), (cut, saved, resumed_as)
            assert same(following, expected[1]), (cut, saved, resumed_as)


def test_states_handed_out_do_not_change_as_the_workers_go_on() -> None:
    with DataLoader2(per_item_pipeline(200), reading_service=service("thread", 2, main_prefetch_cnt=0)) as loader:
        loader.seed(3)
        iterator = iter(loader)
        head = [next(iterator) for _ in range(7)]
        state = loader.state_dict()
        frozen = json.dumps(state)
        rest = list(iterator)  # the workers' passes go on
        assert json.dumps(state) == frozen
    back, _ = resumed(lambda: per_item_pipeline(200), json.loads(frozen), "thread", 2)
    assert back == rest and len(head) == 7


# --- hooks and worker info ------------------------------------------------------------------

SEEN: list[tuple[str, Any, str]] = []
_SEEN_LOCK = threading.Lock()


def note(what: str, value: Any) -> None:
    with _SEEN_LOCK:
        SEEN.append((what, value, threading.current_thread().name))


def init(graph: IterDataPipe, info: WorkerInfo) -> IterDataPipe:
    note("init", (info, get_worker_info()))
    return graph


def reset(graph: IterDataPipe, info: WorkerInfo, seeds: Any) -> IterDataPipe:
    note("reset", info.worker_id)
    return graph


def whose(x: int) -> tuple[int, int]:
    info = get_worker_info()
    assert info is not None
    return x, info.worker_id


def test_hooks_run_in_each_thread_once_and_once_per_epoch_and_each_thread_sees_its_own_info() -> None:
    SEEN.clear()
    pipe = IterableWrapper(range(12)).sharding_filter().map(whose)
    threads = MultiProcessingReadingService(3, worker_type="thread", worker_init_fn=init, worker_reset_fn=reset)
    with DataLoader2(pipe, reading_service=threads) as loader:
        epochs = [list(loader) for _ in range(2)]
        assert get_worker_info() is None  # the main thread's own
    assert epochs[0] == epochs[1] == [(x, x % 3) for x in range(12)]
    inits = sorted(((value, name) for what, value, name in SEEN if what == "init"), key=lambda pair: pair[1])
    assert inits == [
        ((WorkerInfo(3, w), WorkerInfo(3, w)), f"conveyor-thread-worker-{w}") for w in range(3)
    ]  # the info passed in is the thread's get_worker_info()
    resets = sorted((value, name) for what, value, name in SEEN if what == "reset")
    assert resets == sorted([(w, f"conveyor-thread-worker-{w}") for w in range(3)] * 2)


def whose_in_a_helper_thread(x: int) -> tuple[int, int, str]:
    info = get_worker_info()
    assert info is not None
    return x, info.worker_id, threading.current_thread().name


def test_a_stages_own_threads_inside_a_thread_worker_see_its_info() -> None:
    pipe = IterableWrapper(range(8)).sharding_filter().threadpool_map(whose_in_a_helper_thread, max_workers=2)
    with DataLoader2(pipe.prefetch(2).map(lambda t: t[:2]), reading_service=service("thread", 2)) as loader:
        assert sorted(loader) == [(x, x % 2) for x in range(8)]


def test_thread_workers_leave_the_global_rngs_alone() -> None:
    """They are the process's: seeding them per worker would reseed the user's own."""
    random.seed(11)
    np.random.seed(11)
    expected = (random.random(), np.random.random())
    random.seed(11)
    np.random.seed(11)
    with DataLoader2(per_item_pipeline(), reading_service=service("thread", 2)) as loader:
        loader.seed(1)
        assert len(list(loader)) > 0
    assert (random.random(), np.random.random()) == expected


# --- errors ---------------------------------------------------------------------------------


def bad_seven(x: int) -> int:
    if x == 7:
        raise ValueError(f"bad item {x}")
    return x


@pytest.mark.parametrize("workers", [2, 3])
@pytest.mark.parametrize("prefetch", [0, 1, 10])
def test_an_error_names_the_thread_worker_and_comes_after_the_items_before_it(workers: int, prefetch: int) -> None:
    pipe = IterableWrapper(range(20)).sharding_filter().map(bad_seven)
    got: list[int] = []
    threads = service("thread", workers, worker_prefetch_cnt=prefetch)
    failure = rf"Caught ValueError in thread worker {7 % workers}: bad item 7"
    with DataLoader2(pipe, reading_service=threads) as loader, pytest.raises(ValueError, match=failure) as info:
        for item in loader:
            got.append(item)
    assert got == list(range(7))
    assert isinstance(info.value, WorkerError) and info.value.worker_id == 7 % workers
    assert info.value.args == ("bad item 7",)
    assert "Original Traceback (most recent call last)" in str(info.value) and "bad_seven" in str(info.value)


def broken_init(graph: IterDataPipe, info: WorkerInfo) -> IterDataPipe:
    raise KeyError("no config for this worker")


def test_a_failed_start_names_the_thread_worker() -> None:
    threads = MultiProcessingReadingService(2, worker_type="thread", worker_init_fn=broken_init)
    with DataLoader2(IterableWrapper(range(4)).sharding_filter(), reading_service=threads) as loader:
        with pytest.raises(KeyError, match=r"Caught KeyError in thread worker \d during start-up"):
            list(loader)
        with pytest.raises(WorkerError, match=r"thread worker \d"):
            list(loader)


def exits_on_five(x: int) -> int:
    if x == 5:
        raise SystemExit(3)
    return x


def test_a_thread_that_ends_is_an_error_naming_it() -> None:
    with (
        DataLoader2(
            IterableWrapper(range(20)).sharding_filter().map(exits_on_five), reading_service=service("thread")
        ) as loader,
        pytest.raises(WorkerError, match=r"thread worker 1 ended: SystemExit: 3 escaped its pipeline"),
    ):
        list(loader)


# --- pause, limit, statistics ---------------------------------------------------------------


def test_pause_resume_and_limit() -> None:
    with DataLoader2(IterableWrapper(range(10)).sharding_filter(), reading_service=service("thread")) as loader:
        iterator = iter(loader)
        seen = [next(iterator) for _ in range(3)]
        loader.pause()
        with pytest.raises(PauseIteration):
            next(iterator)
        state = loader.state_dict()
        loader.resume()
        loader.limit(2)
        seen += list(iterator)
        assert len(seen) == 5
        loader.limit(None)
        loader.resume()
        seen += list(iterator)
    assert seen == list(range(10))
    rest, _ = resumed(lambda: IterableWrapper(range(10)).sharding_filter(), state, "thread", 2)
    assert rest == list(range(3, 10))


def nap(x: int) -> int:
    """A stage's own wait that releases the GIL, as decoding or a read does."""
    time.sleep(0.002)
    return x


def cheap(x: int) -> int:
    return x + 1


@pytest.mark.timing
@pytest.mark.parametrize("collect", [True, "sample"])
def test_statistics_count_each_thread_workers_stages(collect: Any) -> None:
    pipe = IterableWrapper(range(200)).sharding_filter().map(cheap).map(nap)
    with DataLoader2(pipe, reading_service=service("thread"), collect_stats=collect) as loader:
        assert sorted(loader) == list(range(1, 201))
        report = loader.stats()
    workers = [s for s in report.stages if s.where == "workers"]
    assert all(s.processes == 2 for s in workers)
    # From the end up: every worker reads the whole source; then the workers' own loop.
    assert [(s.label, s.items) for s in workers] == [
        ("Mapper(nap)", 200),
        ("Mapper(cheap)", 200),
        ("ShardingFilter", 200),
        ("IterableWrapper", 400),
        (WORKER_RUNTIME, 0),
    ]
    assert workers[0].busy_s > 0
    if collect is True:
        # A stage releasing the GIL leaves the main thread free to run, so nothing but the
        # stage is busy. (Had it held the GIL, the main thread's waits for the GIL would be
        # charged to the merge, which may then be named: docs/guides/thread-workers.md says so. Stack samples
        # charge a waiting thread where it waits, so only the default is checked here.)
        assert report.bottleneck == "Mapper(nap)"
    assert not [t for t in threading.enumerate() if t.name == "conveyor-stats"]
