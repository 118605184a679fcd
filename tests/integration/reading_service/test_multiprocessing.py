"""MultiProcessingReadingService: determinism, hooks, seeds, resume, transport, failures."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import conveyor.core.read_ahead
import conveyor.workers.parent.pool
from conveyor import (
    DataLoader2,
    MultiProcessingReadingService,
    PrototypeMultiProcessingReadingService,
    WorkerInfo,
    get_worker_info,
)
from conveyor.errors import StateError, WorkerError
from conveyor.pipes import IterableWrapper, IterDataPipe
from pipeline_helpers import (
    mid_epoch_state,
    per_item_pipeline,
    read_epochs,
    resume_after,
    tag,
    twice,
)
from process_helpers import alive
from shm_helpers import conveyor_shm_entries

pytestmark = pytest.mark.timeout(120)


def epochs(loader, count=2):
    return [list(loader) for _ in range(count)]


def run(pipeline, seed=5, count=2, **service):
    return read_epochs(pipeline, seed, count, **service)


@pytest.fixture(params=["adaptive", "reader thread"])
def read_ahead(request, monkeypatch):
    """Runs a test as it comes (these quick consumers mostly receive in their own thread)
    and with the main process's reader thread forced on from the first run, so that both
    ways of receiving are covered."""
    if request.param == "reader thread":
        monkeypatch.setattr(conveyor.core.read_ahead, "_ENTRIES_PER_DECISION", 1)
        monkeypatch.setattr(conveyor.core.read_ahead.ReadAheadCosts, "thread_pays", property(lambda self: True))
        monkeypatch.setattr(conveyor.core.read_ahead.ReadAheadCosts, "thread_costs", property(lambda self: False))
    return request.param


@pytest.fixture(scope="module")
def single_process_epochs():
    loader = DataLoader2(per_item_pipeline())
    loader.seed(5)
    return epochs(loader)


def test_alias_and_exports():
    assert PrototypeMultiProcessingReadingService is MultiProcessingReadingService
    with pytest.raises(ValueError, match="num_workers"):
        MultiProcessingReadingService(num_workers=-1)
    with pytest.raises(ValueError, match="multiprocessing_context"):
        MultiProcessingReadingService(2, multiprocessing_context="threads")
    with pytest.raises(ValueError, match="worker_prefetch_cnt"):
        MultiProcessingReadingService(2, worker_prefetch_cnt=-1)
    with pytest.raises(ValueError, match="timeout"):
        MultiProcessingReadingService(2, timeout=-1)
    assert MultiProcessingReadingService(2, timeout=0).timeout is None, "torch's 0: no limit"


@pytest.mark.parametrize("num_workers", [1, 2, 3])
def test_output_does_not_depend_on_num_workers_or_start_method(
    single_process_epochs, start_method, num_workers, read_ahead
):
    got = run(per_item_pipeline(), num_workers=num_workers, multiprocessing_context=start_method)
    assert got == single_process_epochs
    assert got[0] != got[1], "consecutive epochs differ"
    assert not conveyor_shm_entries()


def test_num_workers_zero_matches_and_leaves_global_rngs_alone(single_process_epochs):
    random.seed(1)
    np.random.seed(1)
    expected = (random.random(), np.random.random())
    random.seed(1)
    np.random.seed(1)
    assert run(per_item_pipeline(), num_workers=0) == single_process_epochs
    assert (random.random(), np.random.random()) == expected


@pytest.mark.parametrize("worker_prefetch_cnt", [0, 1])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_no_prefetch_anywhere(single_process_epochs, worker_prefetch_cnt, num_workers):
    """0 is the reference's "no prefetch" (one message in flight, the protocol's least)."""
    got = run(
        per_item_pipeline(), num_workers=num_workers, main_prefetch_cnt=0, worker_prefetch_cnt=worker_prefetch_cnt
    )
    assert got == single_process_epochs


def test_in_order_false_yields_the_same_items(single_process_epochs):
    got = run(per_item_pipeline(), num_workers=2, in_order=False)
    assert sorted(got[0]) == sorted(single_process_epochs[0])


def test_more_workers_than_items():
    assert run(IterableWrapper(range(3)).sharding_filter().map(tag), num_workers=5, count=1) == [
        [tag(0), tag(1), tag(2)]
    ]


def test_without_sharding_point_every_worker_reads_everything_round_robin():
    got = run(IterableWrapper(range(3)), num_workers=2, count=1)[0]
    assert got == [0, 0, 1, 1, 2, 2]


def test_batching_in_workers_groups_per_worker():
    got = run(IterableWrapper(range(8)).sharding_filter().batch(2), num_workers=2, count=1)[0]
    assert got == [[0, 2], [1, 3], [4, 6], [5, 7]]


def record_init(datapipe, info):
    datapipe.init_info = (info.num_workers, info.worker_id, get_worker_info())
    return datapipe


def record_reset(datapipe, info, seed_generator):
    datapipe.resets = getattr(datapipe, "resets", 0) + 1
    datapipe.reset_info = (info.worker_id, seed_generator.epoch)
    return datapipe


class Report(IterDataPipe):
    """Yields, per item, which worker ran it and the hook bookkeeping it saw."""

    def __init__(self, source):
        self.source = source

    def __iter__(self):
        for item in self.source:
            yield (
                item,
                get_worker_info(),
                getattr(self, "init_info", None),
                getattr(self, "resets", 0),
                getattr(self, "reset_info", None),
                os.getpid(),
            )


def test_hooks_run_once_per_worker_and_once_per_epoch(start_method):
    service = dict(
        num_workers=2, multiprocessing_context=start_method, worker_init_fn=record_init, worker_reset_fn=record_reset
    )
    got = run(Report(IterableWrapper(range(4)).sharding_filter()), count=3, **service)
    for epoch, items in enumerate(got):
        assert [row[0] for row in items] == [0, 1, 2, 3]
        for _, info, init_info, resets, reset_info, pid in items:
            assert isinstance(info, WorkerInfo) and info.num_workers == 2
            assert init_info == (2, info.worker_id, info)
            assert resets == epoch + 1, "worker_reset_fn runs exactly once per epoch"
            assert reset_info == (info.worker_id, epoch)
            assert pid != os.getpid()


def test_hooks_with_zero_workers_run_in_main_with_worker_info_1_0():
    got = run(
        Report(IterableWrapper(range(2)).sharding_filter()),
        count=2,
        num_workers=0,
        worker_init_fn=record_init,
        worker_reset_fn=record_reset,
    )
    in_main = WorkerInfo(num_workers=1, worker_id=0)
    for epoch, items in enumerate(got):
        for _, info, init_info, resets, reset_info, pid in items:
            assert info == in_main and pid == os.getpid()
            assert init_info == (1, 0, in_main)
            assert resets == epoch + 1 and reset_info == (0, epoch)
    assert get_worker_info() is None, "outside its epochs the main process is no worker"


class LogResets:
    """A worker_reset_fn that appends ``worker epoch`` lines to a file (workers are processes)."""

    def __init__(self, path):
        self.path = str(path)

    def __call__(self, datapipe, info, seed_generator):
        with open(self.path, "a") as log:
            log.write(f"{info.worker_id} {seed_generator.epoch}\n")
        return datapipe


@pytest.mark.parametrize("reads", [0, 1])
def test_every_worker_runs_its_reset_for_epochs_ended_early(tmp_path, reads):
    """Workers start one by one; an epoch left after ``reads`` items has not started them
    all, yet each runs its reset once for it (when the next epoch begins)."""
    log = tmp_path / "resets"
    loader = DataLoader2(
        IterableWrapper(range(30)).sharding_filter(),
        reading_service=MultiProcessingReadingService(3, worker_reset_fn=LogResets(log)),
    )
    try:
        for _ in range(3):
            it = iter(loader)
            for _ in range(reads):
                next(it)
        assert sorted(list(loader)) == list(range(30))
    finally:
        loader.shutdown()
    lines = sorted(tuple(map(int, line.split())) for line in log.read_text().splitlines())
    assert lines == sorted((worker, epoch) for worker in range(3) for epoch in range(4))


def draw_global(x):
    return (x, random.randint(0, 1 << 30), int(np.random.randint(1 << 30)), get_worker_info().worker_id)


def test_global_rngs_are_seeded_per_worker_and_epoch():
    pipe = IterableWrapper(range(6)).sharding_filter().map(draw_global)
    first = run(pipe, seed=3, count=2, num_workers=2)
    again = run(pipe, seed=3, count=2, num_workers=2)
    assert first == again
    assert first[0] != first[1]
    worker_draws = {row[3]: row[1] for row in first[0]}
    assert worker_draws[0] != worker_draws[1]


def global_draws_after(machine_seed: int | None, worker_id: int) -> tuple[float, int]:
    """The first draws of ``random`` and numpy's global RNG after a worker state machine
    (worker ``worker_id`` of 2) starts epoch 1 of seed 3, given ``machine_seed`` or not."""
    from conveyor.core.worker_info import WorkerInfo
    from conveyor.random import SeedGenerator
    from conveyor.workers.child.state_machine import WorkerStateMachine
    from conveyor.workers.transport.codec import Encoder
    from conveyor.workers.transport.protocol import StartEpoch

    machine = WorkerStateMachine(IterableWrapper(range(4)), WorkerInfo(2, worker_id), Encoder(None))
    seeds = SeedGenerator(3).for_epoch(1)
    assert machine.start_epoch(StartEpoch(1, seeds, None, 4, global_rng_seed=machine_seed)) == []
    drawn = (random.random(), int(np.random.randint(1 << 30)))
    machine.close()
    return drawn


def test_the_global_seed_the_main_process_makes_is_the_one_the_worker_would_make():
    """The pool makes each worker process's global-RNG seed (a worker just forked took 0.4
    ms for its first SeedSequence): the worker's draws are the same as when it made it."""
    from conveyor.random import SeedGenerator

    saved = random.getstate(), np.random.get_state()
    try:
        for worker_id in (0, 1):
            made_here = SeedGenerator(3).for_epoch(1).spawn(worker_id).global_rng_seed()
            assert global_draws_after(made_here, worker_id) == global_draws_after(None, worker_id)
        assert global_draws_after(None, 0) != global_draws_after(None, 1)
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])
    sent = []
    original = conveyor.workers.parent.pool.WorkerPool.send

    def record(pool, worker_id, message):
        sent.append(message)
        return original(pool, worker_id, message)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(conveyor.workers.parent.pool.WorkerPool, "send", record)
        pipe = IterableWrapper(range(6)).sharding_filter().map(draw_global)
        assert len(run(pipe, seed=3, count=1, num_workers=2)[0]) == 6
    assert [type(m.global_rng_seed) for m in sent if hasattr(m, "global_rng_seed")] == [int, int]


def test_early_exit_then_a_full_epoch(single_process_epochs, read_ahead):
    loader = DataLoader2(per_item_pipeline(), reading_service=MultiProcessingReadingService(2))
    loader.seed(5)
    try:
        for count, _ in enumerate(loader):
            if count == 7:
                break
        assert list(loader) == single_process_epochs[1]
    finally:
        loader.shutdown()


@pytest.mark.timing
def test_the_first_item_does_not_wait_for_every_worker_to_start(single_process_epochs, monkeypatch):
    monkeypatch.setattr(conveyor.workers.parent.pool, "NEXT_START_AFTER_S", 60.0)  # start only after a delivery
    loader = DataLoader2(per_item_pipeline(), reading_service=MultiProcessingReadingService(3))
    loader.seed(5)
    try:
        iterator = iter(loader)
        first = next(iterator)
        assert len(loader.reading_service._pool.pids) == 1  # the others start while it travels
        assert [first, *iterator] == single_process_epochs[0]
        assert len(loader.reading_service._pool.pids) == 3
    finally:
        loader.shutdown()


def slow_first(x):
    if x == 0:
        time.sleep(0.5)
    return x


@pytest.mark.timing
def test_a_slow_first_item_does_not_hold_back_the_other_workers():
    loader = DataLoader2(
        IterableWrapper(range(12)).sharding_filter().map(slow_first),
        reading_service=MultiProcessingReadingService(3),
    )
    try:
        iterator = iter(loader)
        assert next(iterator) == 0
        assert len(loader.reading_service._pool.pids) == 3  # started while worker 0 was busy
        assert list(iterator) == list(range(1, 12))
    finally:
        loader.shutdown()


def slow_first_of_two_seconds(x):
    if x == 0:
        time.sleep(2.0)
    return x


@pytest.mark.timing
def test_no_timeout_means_none_even_while_workers_are_starting(monkeypatch):
    monkeypatch.setattr(conveyor.workers.parent.pool, "START_TIMEOUT_S", 1.0)  # a start-up that stalls
    loader = DataLoader2(
        IterableWrapper(range(8)).sharding_filter().map(slow_first_of_two_seconds),
        reading_service=MultiProcessingReadingService(2, timeout=None),
    )
    try:
        assert list(loader) == list(range(8))  # worker 0's first item takes 2 s: not a stall
    finally:
        loader.shutdown()


def is_odd(x):
    return x % 2 == 1


@pytest.mark.timing
def test_a_worker_whose_share_yields_nothing_does_not_keep_the_others_from_starting():
    import itertools

    loader = DataLoader2(
        IterableWrapper(itertools.count()).sharding_filter().filter(is_odd),  # worker 0 keeps only evens
        reading_service=MultiProcessingReadingService(2, in_order=False),
    )
    try:
        iterator = iter(loader)
        assert [next(iterator) for _ in range(5)] == [1, 3, 5, 7, 9]
    finally:
        loader.shutdown()


def test_a_failed_worker_start_fails_the_epoch_and_every_later_one_clearly(monkeypatch):
    monkeypatch.setattr(conveyor.workers.parent.pool, "NEXT_START_AFTER_S", 60.0)  # start after a delivery
    real_start = conveyor.workers.parent.pool.WorkerPool._start

    def start(pool, worker_id):
        if worker_id == 1:
            raise OSError(24, "Too many open files")
        real_start(pool, worker_id)

    monkeypatch.setattr(conveyor.workers.parent.pool.WorkerPool, "_start", start)
    loader = DataLoader2(per_item_pipeline(), reading_service=MultiProcessingReadingService(2))
    try:
        with pytest.raises(OSError, match="Too many open files"):
            list(loader)  # worker 1 starts once worker 0 has delivered, mid-epoch, and cannot
        assert not multiprocessing.active_children()  # worker 0 was ended with the pool
        with pytest.raises(WorkerError, match=r"shut down after OSError while starting a worker.*build a new one"):
            list(loader)
    finally:
        loader.shutdown()


@pytest.mark.timing
def test_only_the_consumers_thread_starts_workers(monkeypatch, read_ahead):
    # Start late: the thread may be running.
    monkeypatch.setattr(conveyor.workers.parent.pool, "NEXT_START_AFTER_S", 60.0)
    starters = []
    real_start = conveyor.workers.parent.pool.WorkerPool._start

    def start(pool, worker_id):
        starters.append(threading.current_thread().name)
        real_start(pool, worker_id)

    monkeypatch.setattr(conveyor.workers.parent.pool.WorkerPool, "_start", start)
    with DataLoader2(per_item_pipeline(), reading_service=MultiProcessingReadingService(3)) as loader:
        loader.seed(5)
        assert len(list(loader)) > 0
    # a worker forked by another thread would not be killed with the main process
    assert starters == [threading.main_thread().name] * 3


@pytest.mark.timing
def test_workers_not_started_yet_begin_with_the_latest_epoch(single_process_epochs, monkeypatch):
    monkeypatch.setattr(conveyor.workers.parent.pool, "NEXT_START_AFTER_S", 60.0)
    loader = DataLoader2(per_item_pipeline(), reading_service=MultiProcessingReadingService(3))
    loader.seed(5)
    try:
        next(iter(loader))  # only the first worker has started
        assert list(loader) == single_process_epochs[1]
    finally:
        loader.shutdown()


def test_dispatch_mode_starts_every_worker_at_once():
    loader = DataLoader2(
        IterableWrapper(range(30)).sharding_round_robin_dispatch().map(tag),
        reading_service=MultiProcessingReadingService(3),
    )
    try:
        iterator = iter(loader)
        next(iterator)
        assert len(loader.reading_service._pool.pids) == 3
    finally:
        loader.shutdown()


@pytest.mark.parametrize(("saved_with", "resumed_with"), [(2, 2), (2, 3), (3, 1), (2, 0), (0, 2), (1, 1)])
def test_mid_epoch_resume_is_exact_even_across_worker_counts(
    single_process_epochs, saved_with, resumed_with, read_ahead
):
    full = single_process_epochs[0]
    for cut in (0, 1, 5, len(full) // 2 + 1, len(full) - 1, len(full)):
        epoch, following = resume_after(per_item_pipeline, cut, 5, saved_with, resumed_with)
        assert epoch == full, f"cut {cut}"
        assert following == single_process_epochs[1]


def grouped_pipeline():
    return IterableWrapper(range(30)).shuffle(buffer_size=4).sharding_filter().map(tag).batch(3)


def test_grouping_pipelines_resume_exactly_with_the_same_worker_count():
    reference = run(grouped_pipeline(), seed=2, count=2, num_workers=2)
    for cut in range(len(reference[0]) + 1):
        assert resume_after(grouped_pipeline, cut, 2, 2, 2) == (reference[0], reference[1])
    _, state = mid_epoch_state(grouped_pipeline, 1, 2, num_workers=2)
    other = DataLoader2(grouped_pipeline(), reading_service=MultiProcessingReadingService(3))
    with pytest.raises(StateError, match="num_workers=2"):
        other.load_state_dict(state)


def test_corrupt_worker_state_is_rejected_at_load():
    loader = DataLoader2(per_item_pipeline(), reading_service=MultiProcessingReadingService(2))
    iterator = iter(loader)
    next(iterator)
    state = json.loads(json.dumps(loader.state_dict()))
    loader.shutdown()
    reader = state["pipeline"]
    reader["workers"][0] = {"nonsense": 1}
    with pytest.raises(StateError, match="worker 0"):
        DataLoader2(per_item_pipeline(), reading_service=MultiProcessingReadingService(2)).load_state_dict(state)


# --- transport --------------------------------------------------------------------------


def big_array(i):
    return np.full(300_000, i, dtype=np.int32)


def big_bytes(i):
    return bytes([i % 256]) * 200_000


def mixed(i):
    return {"array": big_array(i), "raw": big_bytes(i), "label": i}


def test_large_buffers_arrive_intact_and_belong_to_the_user(start_method, read_ahead):
    loader = DataLoader2(
        IterableWrapper(range(40)).sharding_filter().map(mixed),
        reading_service=MultiProcessingReadingService(2, multiprocessing_context=start_method),
    )
    received = list(loader)
    assert not conveyor_shm_entries(), "ring names are unlinked once workers mapped them"
    loader.shutdown()
    for i, item in enumerate(received):
        assert item["label"] == i
        assert item["array"].flags.writeable and (item["array"] == i).all()
        assert item["raw"] == bytes([i]) * 200_000
    received[0]["array"][:] = -1  # writable, and private: nothing else changes
    assert (received[1]["array"] == 1).all()
    assert not conveyor_shm_entries()


def big_tensor(i):
    import torch

    return torch.full((100_000,), float(i))


def big_tensors_of_many_dtypes(i):
    import torch

    dtypes = (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool)
    return {str(dtype): torch.full((300, 400), i % 2, dtype=dtype) for dtype in dtypes}


def test_torch_tensors_travel_out_of_band():
    torch = pytest.importorskip("torch")
    with DataLoader2(
        IterableWrapper(range(10)).sharding_filter().map(big_tensor),
        reading_service=MultiProcessingReadingService(2),
    ) as loader:
        got = list(loader)
    assert all(isinstance(t, torch.Tensor) and bool((t == i).all()) for i, t in enumerate(got))


def test_tensors_of_dtypes_numpy_lacks_travel_too():
    torch = pytest.importorskip("torch")
    with DataLoader2(
        IterableWrapper(range(6)).sharding_filter().map(big_tensors_of_many_dtypes),
        reading_service=MultiProcessingReadingService(2),
    ) as loader:
        got = list(loader)
    for i, item in enumerate(got):
        for name, tensor in item.items():
            assert str(tensor.dtype) == name and tensor.shape == (300, 400)
            assert torch.equal(tensor, torch.full((300, 400), i % 2, dtype=tensor.dtype))


def test_more_data_than_the_ring_holds_still_flows():
    with DataLoader2(
        IterableWrapper(range(30)).sharding_filter().map(big_array),
        # 1 MiB rings: smaller than a few items in flight
        reading_service=MultiProcessingReadingService(2, worker_prefetch_cnt=10, shared_memory_budget=2 << 20),
    ) as loader:
        got = list(loader)
    assert [int(a[0]) for a in got] == list(range(30))


# --- failures ---------------------------------------------------------------------------


def fail_on_seven(x):
    if x == 7:
        raise ValueError(f"bad item {x}")
    return x


def test_worker_exception_names_the_worker_and_keeps_the_traceback(start_method, read_ahead):
    loader = DataLoader2(
        IterableWrapper(range(20)).sharding_filter().map(fail_on_seven),
        reading_service=MultiProcessingReadingService(2, multiprocessing_context=start_method),
    )
    with pytest.raises(ValueError, match=r"Caught ValueError in worker process 1: bad item 7") as info:
        list(loader)
    assert isinstance(info.value, WorkerError) and info.value.worker_id == 1
    assert info.value.args == ("bad item 7",)
    assert isinstance(info.value.__cause__, ValueError)
    assert "Original Traceback (most recent call last)" in str(info.value) and "fail_on_seven" in str(info.value)
    loader.shutdown()
    assert not multiprocessing.active_children()


def exit_on_five(x):
    if x == 5:
        os._exit(3)
    return x


def test_worker_that_exits_becomes_an_error_naming_pid_and_code():
    loader = DataLoader2(
        IterableWrapper(range(20)).sharding_filter().map(exit_on_five),
        reading_service=MultiProcessingReadingService(2),
    )
    with pytest.raises(WorkerError, match=r"worker 1 \(pid \d+\) exited with code 3"):
        list(loader)
    loader.shutdown()


def slow(x):
    time.sleep(0.05)
    return x


@pytest.mark.timing
def test_killed_worker_is_noticed_at_once(read_ahead):
    loader = DataLoader2(
        IterableWrapper(range(10_000)).sharding_filter().map(slow),
        reading_service=MultiProcessingReadingService(2),
    )
    iterator = iter(loader)
    next(iterator)
    victim = loader.reading_service._pool.pids[0]
    os.kill(victim, signal.SIGKILL)
    killed = rf"worker 0 \(pid {victim}\) was killed by signal SIGKILL \(9; exit code -9\)"
    with pytest.raises(WorkerError, match=killed):
        for _ in iterator:
            pass
    loader.shutdown()
    assert not multiprocessing.active_children()


def stall(x):
    if x == 3:
        time.sleep(60)
    return x


@pytest.mark.timing
def test_timeout_bounds_each_wait(read_ahead):
    loader = DataLoader2(
        IterableWrapper(range(10)).sharding_filter().map(stall),
        reading_service=MultiProcessingReadingService(2, timeout=1.0),
    )
    with pytest.raises(WorkerError, match=r"within 1\.0s"):
        list(loader)
    loader.shutdown()
    assert not multiprocessing.active_children()


def test_shutdown_joins_every_process_and_leaves_nothing(read_ahead):
    loader = DataLoader2(per_item_pipeline(), reading_service=MultiProcessingReadingService(3))
    iterator = iter(loader)
    next(iterator)
    pids = list(loader.reading_service._pool.pids)
    loader.shutdown()
    assert not multiprocessing.active_children()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not conveyor_shm_entries()


@pytest.mark.timing
def test_garbage_collection_ends_the_workers():
    import gc

    loader = DataLoader2(per_item_pipeline(), reading_service=MultiProcessingReadingService(2))
    iterator = iter(loader)
    next(iterator)
    del loader, iterator
    gc.collect()
    assert not multiprocessing.active_children()


SCRIPT = textwrap.dedent(
    """
    import faulthandler, os, signal, sys, time
    from conveyor import DataLoader2, MultiProcessingReadingService

    faulthandler.dump_traceback_later(40, exit=True)  # a hang shows every thread's stack
    # Ctrl-C as in a terminal: a job started in the background by a non-interactive shell
    # (how some CI runners start the tests) inherits SIGINT ignored, and Python then
    # raises no KeyboardInterrupt (this test hung that way, waiting for 100,000 items).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from conveyor.pipes import IterableWrapper

    def slow(x):
        time.sleep(0.01)
        return x

    if __name__ == "__main__":
        loader = DataLoader2(IterableWrapper(range(100000)).sharding_filter().map(slow),
                             reading_service=MultiProcessingReadingService(2))
        iterator = iter(loader)
        for _ in range(3):  # the second item comes from the second worker: both have started
            next(iterator)
        print(" ".join(map(str, loader.reading_service._pool.pids)), flush=True)
        if sys.argv[1] == "interrupt":
            os.kill(os.getpid(), signal.SIGINT)
            for _ in iterator:
                pass
        elif sys.argv[1] == "raise":
            raise RuntimeError("training loop failed")
        # "exit": leave without shutdown()
    """
)


@pytest.mark.timing
@pytest.mark.parametrize("how", ["exit", "raise", "interrupt"])
def test_no_orphans_after_exit_exception_or_ctrl_c(tmp_path, how):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script), how], capture_output=True, text=True, timeout=60)
    pids = [int(p) for p in done.stdout.split()]
    assert len(pids) == 2, done.stderr
    if how == "interrupt":
        assert "KeyboardInterrupt" in done.stderr, done.stderr
    deadline = time.monotonic() + 10
    remaining = pids
    while remaining and time.monotonic() < deadline:
        remaining = [pid for pid in pids if alive(pid)]
        if remaining:
            time.sleep(0.05)
    assert not remaining, f"orphaned workers: {remaining}"
    assert not conveyor_shm_entries()


class MainOnly(IterDataPipe):
    """A non-replicable op: it must run once, in the main process."""

    replicable = False

    def __init__(self, source):
        self.source = source

    def __iter__(self):
        for item in self.source:
            yield (item, os.getpid())


def test_non_replicable_ops_stay_in_the_main_process():
    pipe = MainOnly(IterableWrapper(range(6)).sharding_filter().map(tag)).map(lambda pair: (pair[0][0], pair[1]))
    loader = DataLoader2(pipe, reading_service=MultiProcessingReadingService(2))
    got = list(loader)
    assert [g[0] for g in got] == [0, 1, 2, 3, 4, 5]
    assert {g[1] for g in got} == {os.getpid()}
    iterator = iter(loader)
    head = [next(iterator) for _ in range(3)]
    state = loader.state_dict()
    loader.shutdown()
    resumed = DataLoader2(
        MainOnly(IterableWrapper(range(6)).sharding_filter().map(tag)).map(lambda pair: (pair[0][0], pair[1])),
        reading_service=MultiProcessingReadingService(2),
    )
    resumed.load_state_dict(state)
    assert [g[0] for g in head + list(resumed)] == [0, 1, 2, 3, 4, 5]
    resumed.shutdown()


def main_side_prefetch():
    return MainOnly(IterableWrapper(range(30)).sharding_filter().map(tag)).prefetch(4).map(first_of_pair)


def first_of_pair(pair):
    return pair[0][0]


@pytest.mark.parametrize("cut", [1, 9, 29])
def test_a_main_side_prefetch_resumes_from_its_snapshot_not_the_workers_lead(cut, read_ahead):
    """The prefetch thread reads ahead of the user; its snapshot is older than the
    workers' state, so the resumed workers must start from the snapshot."""
    head, state = mid_epoch_state(main_side_prefetch, cut, num_workers=2)
    loader = DataLoader2(main_side_prefetch(), reading_service=MultiProcessingReadingService(2))
    loader.load_state_dict(state)
    try:
        assert head + list(loader) == list(range(30))
        assert list(loader) == list(range(30))
    finally:
        loader.shutdown()


@pytest.mark.parametrize("num_workers", [0, 3])
def test_a_main_side_prefetch_resumes_on_another_worker_count(num_workers):
    """The prefetch holds the 2-worker reader's state behind the last item it handed out:
    re-split for another worker count, it resumes exactly."""
    head, state = mid_epoch_state(main_side_prefetch, 5, num_workers=2)
    loader = DataLoader2(main_side_prefetch(), reading_service=MultiProcessingReadingService(num_workers))
    try:
        loader.load_state_dict(state)
        assert head + list(loader) == list(range(30))
    finally:
        loader.shutdown()


def shuffled_after_sharding():
    return IterableWrapper(range(40)).sharding_filter().map(tag).flatmap(twice).shuffle(buffer_size=6)


@pytest.mark.parametrize("num_workers", [1, 2, 3])
def test_reordering_after_the_sharding_point_merges_round_robin_and_resumes(num_workers):
    reference = run(shuffled_after_sharding(), seed=4, count=2, num_workers=num_workers)
    assert reference == run(shuffled_after_sharding(), seed=4, count=2, num_workers=num_workers)
    assert sorted(reference[0]) == sorted(pair for x in range(40) for pair in twice(tag(x)))
    for cut in (0, 7, len(reference[0]) - 1):
        epoch, following = resume_after(shuffled_after_sharding, cut, 4, num_workers, num_workers)
        assert epoch == reference[0]
        assert following == reference[1]


class Reverser(IterDataPipe):
    """Wrongly claims to keep the order of positions."""

    keeps_order = True
    per_item = True

    def __init__(self, source):
        self.source = source

    def __iter__(self):
        yield from reversed(list(self.source))


def test_an_op_that_lies_about_order_fails_instead_of_hanging():
    loader = DataLoader2(
        Reverser(IterableWrapper(range(10)).sharding_filter()), reading_service=MultiProcessingReadingService(2)
    )
    with pytest.raises(Exception, match="reorders items"):
        list(loader)
    loader.shutdown()


def reset_drawing_a_seed(datapipe, info, seed_generator):
    datapipe.reset_info = seed_generator.generate_seed()
    return datapipe


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_seed_a_reset_hook_draws_does_not_depend_on_num_workers(num_workers):
    """Workers seed their global RNGs from a stream of their own: worker 0's hook draws
    what the single process's draws."""
    pipe = Report(IterableWrapper(range(4)).sharding_filter())
    got = run(pipe, count=1, num_workers=num_workers, worker_reset_fn=reset_drawing_a_seed)[0]
    alone = run(pipe, count=1, num_workers=0, worker_reset_fn=reset_drawing_a_seed)[0]
    assert {row[4] for row in got if row[1].worker_id == 0} == {alone[0][4]}


def test_worker_info_with_zero_workers_survives_a_nested_loader():
    """An evaluation loader read inside a training epoch must not reset what the training
    loader's stages see."""
    in_main = WorkerInfo(num_workers=1, worker_id=0)

    def make():
        pipe = IterableWrapper(range(3)).sharding_filter().map(lambda x: (x, get_worker_info()))
        return DataLoader2(pipe, reading_service=MultiProcessingReadingService(0))

    outer, inner = make(), make()
    try:
        seen = []
        for item in outer:
            seen.append(item)
            assert [info for _, info in inner] == [in_main] * 3
        assert [info for _, info in seen] == [in_main] * 3
    finally:
        outer.shutdown()
        inner.shutdown()
    assert get_worker_info() is None
