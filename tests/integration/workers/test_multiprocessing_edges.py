"""Edge cases of the worker runtime, each once a defect: kept as regressions."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest

from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.errors import GraphError, StateError, WorkerError
from conveyor.pipes import IterableWrapper, IterDataPipe
from pipeline_helpers import mid_epoch_state
from shm_helpers import conveyor_shm_entries

pytestmark = pytest.mark.timeout(120)

MAIN_CLASS_SCRIPT = textwrap.dedent(
    """
    import sys
    from dataclasses import dataclass
    from conveyor import DataLoader2, MultiProcessingReadingService
    from conveyor.pipes import IterableWrapper

    @dataclass
    class Sample:
        index: int

    def make(i):
        return Sample(i)

    if __name__ == "__main__":
        service = MultiProcessingReadingService(2, multiprocessing_context=sys.argv[1])
        with DataLoader2(IterableWrapper(range(6)).sharding_filter().map(make), reading_service=service) as loader:
            got = list(loader)
        assert all(type(s) is Sample for s in got), got
        print(",".join(str(s.index) for s in got))
    """
)


def test_items_of_classes_defined_in_the_training_script(tmp_path, start_method):
    script = tmp_path / "train.py"
    script.write_text(MAIN_CLASS_SCRIPT)
    done = subprocess.run([sys.executable, str(script), start_method], capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0,1,2,3,4,5"


def lock_at_three(i):
    return threading.Lock() if i == 3 else i


def test_an_item_that_cannot_be_pickled_is_a_worker_error_with_its_reason():
    loader = DataLoader2(
        IterableWrapper(range(10)).sharding_filter().map(lock_at_three),
        reading_service=MultiProcessingReadingService(2),
    )
    with pytest.raises(WorkerError, match=r"Caught TypeError in worker process 1: .*lock"):
        list(loader)
    loader.shutdown()


def test_workers_started_from_a_thread_outlive_that_thread():
    service = MultiProcessingReadingService(2)
    loader = DataLoader2(IterableWrapper(range(300)).sharding_filter(), reading_service=service)
    holder = {}
    starter = threading.Thread(target=lambda: holder.setdefault("it", iter(loader)))
    starter.start()
    starter.join()
    assert list(holder["it"]) == list(range(300))
    loader.shutdown()


def test_resuming_an_unordered_read_on_another_worker_count_is_refused():
    def build():
        return IterableWrapper(range(40)).sharding_filter()

    _, state = mid_epoch_state(build, 1, num_workers=2, in_order=False)
    with pytest.raises(StateError, match="in_order=False"):
        DataLoader2(build(), reading_service=MultiProcessingReadingService(3)).load_state_dict(state)


def text(i):
    return "x" * 4000  # a 64-item chunk is bigger than a pipe's buffer


@pytest.mark.timing
def test_shutdown_does_not_have_to_kill_workers_blocked_on_a_full_pipe():
    loader = DataLoader2(
        IterableWrapper(range(100_000)).sharding_filter().map(text),
        reading_service=MultiProcessingReadingService(2),
    )
    iterator = iter(loader)
    for _ in range(300):
        next(iterator)
    workers = list(loader.reading_service._pool._workers)
    loader.shutdown()
    assert [w.exitcode for w in workers] == [0, 0], "workers exit by themselves, not by SIGKILL"


def fail_at_seven(i):
    if i == 7:
        raise KeyError(i)
    return i


def test_after_a_failed_epoch_next_keeps_failing_and_the_state_stays_mid_epoch():
    loader = DataLoader2(
        IterableWrapper(range(20)).sharding_filter().map(fail_at_seven),
        reading_service=MultiProcessingReadingService(2),
    )
    iterator = iter(loader)
    got = []
    with pytest.raises(WorkerError):
        for item in iterator:
            got.append(item)
    with pytest.raises(RuntimeError, match="epoch failed"):
        next(iterator)
    state = loader.state_dict()
    assert state["in_progress"] is True and state["items"] == len(got)
    loader.shutdown()


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_lambdas_and_closures_travel_by_value(context):
    offset = 100
    pipe = IterableWrapper(range(8)).sharding_filter().map(lambda x: x + offset).filter(lambda x: x % 2 == 0)
    service = MultiProcessingReadingService(
        2,
        multiprocessing_context=context,
        worker_init_fn=lambda datapipe, info: datapipe,
        worker_reset_fn=lambda datapipe, info, seeds: datapipe,
    )
    with DataLoader2(pipe, reading_service=service) as loader:
        assert list(loader) == [100, 102, 104, 106]


class MainSide(IterDataPipe):
    """A non-replicable pass-through: it and what follows run in the main process."""

    replicable = False
    per_item = True
    keeps_order = True

    def __init__(self, source):
        self.source = source

    def __iter__(self):
        yield from self.source


def draw(x, rng):
    return (x, int(rng.integers(1 << 30)))


@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_random_ops_in_the_main_process_draw_as_in_one_process(num_workers):
    def build():
        return MainSide(IterableWrapper(range(12)).sharding_filter()).random_map(draw)

    reference = DataLoader2(build())
    reference.seed(4)
    expected = list(reference)
    loader = DataLoader2(build(), reading_service=MultiProcessingReadingService(num_workers))
    loader.seed(4)
    try:
        assert list(loader) == expected
    finally:
        loader.shutdown()


def test_a_non_replicable_op_before_the_sharding_point_is_refused():
    """It would keep sharding_filter() in the main process: every worker would read every item."""
    pipe = IterableWrapper(range(6)).pin_memory().sharding_filter()
    loader = DataLoader2(pipe, reading_service=MultiProcessingReadingService(2))
    with pytest.raises(GraphError, match=r"PinMemory.*cannot be replicated.*sharding_filter\(\)"):
        list(loader)
    loader.shutdown()
    with DataLoader2(pipe, reading_service=MultiProcessingReadingService(0)) as in_main:
        assert list(in_main) == list(range(6))


KILLED_WHILE_STARTING = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    from conveyor import DataLoader2, MultiProcessingReadingService
    from conveyor.pipes import IterableWrapper

    def big(i):
        return np.full(1 << 20, i % 251, dtype=np.uint8)

    if __name__ == "__main__":
        service = MultiProcessingReadingService(4, multiprocessing_context=sys.argv[1])
        loader = DataLoader2(IterableWrapper(range(64)).sharding_filter().map(big), reading_service=service)
        it = iter(loader)
        next(it)
        print(os.getpid(), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)  # workers may still be starting
    """
)


@pytest.mark.timing
def test_a_main_process_killed_while_workers_start_leaves_no_shared_memory(tmp_path, start_method):
    """Rings are anonymous: there is no name a killed process could leave in /dev/shm."""
    script = tmp_path / "killed.py"
    script.write_text(KILLED_WHILE_STARTING)
    done = subprocess.run([sys.executable, str(script), start_method], capture_output=True, text=True, timeout=100)
    assert done.returncode == -9, done.stderr
    pid = done.stdout.split()[0]
    assert not [name for name in conveyor_shm_entries() if name.startswith(f"conveyor-{pid}-")]
