"""Large items end to end: buffers that miss their worker's ring travel in a shared file
of their own, reach the user intact and writable, outlive ``shutdown()``, and leave no
descriptor, mapping or ``/dev/shm`` entry behind on any path (a worker or the main
process killed mid-item, an epoch abandoned with chunks in flight); a small ``/dev/shm``
no longer turns shared memory off, and where shared memory cannot be reserved the loader
warns once and goes on."""

from __future__ import annotations

import gc
import multiprocessing
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest

from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.errors import SharedMemoryWarning, WorkerError
from conveyor.observe.run_delay import run_delay_ns
from conveyor.pipes import IterableWrapper
from shm_helpers import conveyor_shm_entries, run_in_private_dev_shm

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts descriptors in /proc")

#: 1 MiB rings for 2 workers: every buffer below of 2 MB and more misses them.
SMALL_RINGS = 2 << 20


def large_item(i: int) -> dict:
    """A spilled array, tensor and bytes, one that fits the ring, and a label."""
    import torch

    return {
        "array": np.full((750, 1000), i, dtype=np.float32),  # 3 MB
        "tensor": torch.full((500_000,), i, dtype=torch.int32),  # 2 MB
        "raw": bytes([i % 256]) * 2_500_000,
        "fits": np.full(100_000, i, dtype=np.uint8),
        "label": i,
    }


def check_item(item: dict, i: int) -> None:
    assert item["label"] == i
    assert item["array"].shape == (750, 1000) and (item["array"] == i).all()
    assert item["tensor"].shape == (500_000,) and bool((item["tensor"] == i).all())
    assert item["raw"] == bytes([i % 256]) * 2_500_000
    assert (item["fits"] == i).all()
    assert item["array"].flags.writeable and item["fits"].flags.writeable


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def conveyor_mappings() -> list[str]:
    """This process's mappings of conveyor's shared files (rings, spilled buffers)."""
    with open("/proc/self/maps") as maps:
        return [line for line in maps if "conveyor-" in line]


@pytest.fixture
def baseline():
    """The descriptors open before the test, with every start method's helper process
    (resource tracker, fork server) already running: they keep descriptors of their own;
    so does statistics' run-delay reader, one per thread for the thread's life (opened at
    its first sample, which may fall in the test when it runs alone)."""
    multiprocessing.resource_tracker.ensure_running()
    multiprocessing.forkserver.ensure_running()
    run_delay_ns()
    gc.collect()
    return open_fds()


def assert_nothing_left(baseline: set[str]) -> None:
    gc.collect()
    assert open_fds() - baseline == set(), "a descriptor leaked"
    assert not conveyor_mappings(), "a mapping outlived every array over it"
    assert not conveyor_shm_entries()


def test_large_items_arrive_intact_writable_and_outlive_shutdown(start_method, baseline):
    loader = DataLoader2(
        IterableWrapper(range(12)).sharding_filter().map(large_item),
        reading_service=MultiProcessingReadingService(
            2, multiprocessing_context=start_method, shared_memory_budget=SMALL_RINGS
        ),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", SharedMemoryWarning)  # nothing had to take a slower path
        received = list(loader)
    loader.shutdown()
    assert not multiprocessing.active_children()
    for i, item in enumerate(received):
        check_item(item, i)
    received[0]["array"][:] = -1  # writable, and private: nothing else changes
    received[0]["tensor"][:] = -1
    check_item(received[1], 1)
    assert open_fds() - baseline == set(), "kept arrays need no descriptor"
    del received, item
    assert_nothing_left(baseline)


def big(i: int) -> np.ndarray:
    return np.full(3_000_000, i, dtype=np.uint8)


def big_then_die(i: int) -> np.ndarray:
    if i == 5:
        os.kill(os.getpid(), signal.SIGKILL)  # worker 1, after sending item 3 (spilled)
    return big(i)


@pytest.mark.timing
def test_a_worker_killed_with_a_large_item_in_flight_leaves_nothing_behind(start_method, baseline):
    loader = DataLoader2(
        IterableWrapper(range(10)).sharding_filter().map(big_then_die),
        reading_service=MultiProcessingReadingService(
            2, multiprocessing_context=start_method, main_prefetch_cnt=0, shared_memory_budget=SMALL_RINGS
        ),
    )
    iterator = iter(loader)
    first = next(iterator)
    with pytest.raises(WorkerError, match=r"worker 1 \(pid \d+\) was killed by signal SIGKILL"):
        list(iterator)
    loader.shutdown()
    assert (first == 0).all(), "an item already handed out stays valid"
    del first, iterator, loader  # the loader holds the epoch's undelivered items until it goes
    assert_nothing_left(baseline)


def test_a_worker_killed_between_passing_a_descriptor_and_its_chunk_leaves_nothing_behind(baseline, monkeypatch):
    import conveyor.workers.transport.spill as spill

    send_fds = spill.socket.send_fds

    def send_then_die(sock, buffers, fds, *args):
        sent = send_fds(sock, buffers, fds, *args)
        if multiprocessing.parent_process() is not None and spill.RECORD.unpack(buffers[0])[0] == 2:
            os.kill(os.getpid(), signal.SIGKILL)  # the descriptor is queued, its chunk never comes
        return sent

    monkeypatch.setattr(spill.socket, "send_fds", send_then_die)  # inherited by forked workers
    loader = DataLoader2(
        IterableWrapper(range(10)).sharding_filter().map(big),
        reading_service=MultiProcessingReadingService(
            2, multiprocessing_context="fork", shared_memory_budget=SMALL_RINGS
        ),
    )
    with pytest.raises(WorkerError, match="SIGKILL"):
        list(loader)
    loader.shutdown()
    assert_nothing_left(baseline)


def test_an_epoch_abandoned_with_large_items_in_flight_leaves_nothing_behind(baseline):
    loader = DataLoader2(
        IterableWrapper(range(16)).sharding_filter().map(big),
        reading_service=MultiProcessingReadingService(2, shared_memory_budget=SMALL_RINGS),
    )
    iterator = iter(loader)
    kept = next(iterator)
    time.sleep(0.2)  # the workers fill their credits with spilled items meanwhile
    del iterator
    again = list(loader)  # a new epoch: the old one's chunks are read and dropped, or freed
    assert [int(a[0]) for a in again] == list(range(16)) and (kept == 0).all()
    loader.shutdown()
    del again, kept
    assert_nothing_left(baseline)


def test_large_items_take_the_pipe_with_one_warning_when_no_shared_memory_can_be_reserved(baseline, monkeypatch):
    import errno

    def refuse(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", refuse)  # rings here, spilled files in the forked workers
    loader = DataLoader2(
        IterableWrapper(range(8)).sharding_filter().map(large_item),
        reading_service=MultiProcessingReadingService(2, multiprocessing_context="fork"),
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        received = list(loader)
    loader.shutdown()
    ours = [w for w in caught if w.category is SharedMemoryWarning]
    assert len(ours) == 1, [str(w.message) for w in ours]
    assert "ENOSPC" in str(ours[0].message) and "shared_memory_budget" in str(ours[0].message)
    for i, item in enumerate(received):
        check_item(item, i)
    del received, item
    assert_nothing_left(baseline)


MAIN_KILLED = """
import os, signal, sys, numpy as np
import conveyor.workers.transport.shared_files as shared_files
from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.pipes import IterableWrapper

def big(i):
    return np.full(3_000_000, i, dtype=np.uint8)

if __name__ == "__main__":
    shared_files.memfd_create = None  # /dev/shm files: the case where a leftover could show
    loader = DataLoader2(
        IterableWrapper(range(100)).sharding_filter().map(big),
        reading_service=MultiProcessingReadingService(2, multiprocessing_context="fork", shared_memory_budget=2 << 20),
    )
    iterator = iter(loader)
    next(iterator)
    next(iterator)  # every worker started and spilling
    print(" ".join(str(pid) for pid in loader.reading_service._pool.pids), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.timing
def test_the_main_process_killed_mid_epoch_leaves_no_worker_and_nothing_in_dev_shm(tmp_path):
    script = tmp_path / "main_killed.py"
    script.write_text(textwrap.dedent(MAIN_KILLED))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGKILL, done.stderr
    pids = [int(pid) for pid in done.stdout.split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 10
    while any(os.path.exists(f"/proc/{pid}") for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(os.path.exists(f"/proc/{pid}") for pid in pids), "the workers died with the main process"
    assert not [name for name in conveyor_shm_entries() if any(f"-{pid}-" in name for pid in pids)]


# --- /dev/shm's size --------------------------------------------------------------------------

SMALL_DEV_SHM = """
import sys, warnings, numpy as np
{setup}
from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.errors import SharedMemoryWarning
from conveyor.pipes import IterableWrapper

def item(i):
    return np.full({size}, i % 251, dtype=np.uint8)

if __name__ == "__main__":
    loader = DataLoader2(
        IterableWrapper(range(40)).sharding_filter().map(item),
        reading_service=MultiProcessingReadingService(2, multiprocessing_context="fork"),
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = list(loader)
    loader.shutdown()
    assert [int(a[0]) for a in got] == [i % 251 for i in range(40)]
    assert all((a == i % 251).all() and a.flags.writeable for i, a in enumerate(got))
    print("ring-sized bases:", sum(len(a.base) > 60 << 20 for a in got))
    for w in caught:
        if w.category is SharedMemoryWarning:
            print("warned:", w.message)
"""


def test_a_16_mib_dev_shm_keeps_the_rings():
    code = SMALL_DEV_SHM.format(setup="", size=1 << 20)
    done = run_in_private_dev_shm(code, "16m")
    assert done.returncode == 0, done.stderr
    assert "warned:" not in done.stdout
    assert "ring-sized bases: 40" in done.stdout, "every 1 MiB array came through a 64 MiB ring"


def test_a_dev_shm_file_that_cannot_be_backed_fails_cleanly_and_the_item_takes_the_pipe():
    # Without memfd_create, shared files are /dev/shm files, and 20 MB do not fit in 16 MiB:
    # the reservation fails (ENOSPC), the item goes through the pipe, never a SIGBUS.
    code = SMALL_DEV_SHM.format(
        setup="import conveyor.workers.transport.shared_files as files; files.memfd_create = None", size=20_000_000
    )
    done = run_in_private_dev_shm(code, "16m")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("warned:") == 1 and "ENOSPC" in done.stdout


def test_a_worker_keeps_two_large_chunks_in_flight():
    """With one, an in-order merge (which hands item k out once the next worker has sent
    item k+1) makes workers take turns on items over the in-flight limit."""
    from conveyor.core.worker_info import WorkerInfo
    from conveyor.random import SeedGenerator
    from conveyor.workers.child.state_machine import IN_FLIGHT_MAX_BYTES, WorkerStateMachine
    from conveyor.workers.transport.codec import EncodedFrame, Encoder
    from conveyor.workers.transport.protocol import StartEpoch

    graph = IterableWrapper(range(6)).map(lambda i: np.full(IN_FLIGHT_MAX_BYTES + 1, i, dtype=np.uint8))
    machine = WorkerStateMachine(graph, WorkerInfo(1, 0), Encoder(None))
    assert machine.start_epoch(StartEpoch(0, SeedGenerator(0), None, credits=10)) == []
    sent = []
    while machine.can_produce():
        sent += [m for m in machine.produce() if isinstance(m, EncodedFrame)]
    assert len(sent) == 2, "two chunks, each over the byte limit, then it waits"
    machine.grant(1)  # the first is merged
    assert machine.can_produce()
    sent += [m for m in machine.produce() if isinstance(m, EncodedFrame)]
    assert len(sent) == 3 and not machine.can_produce()
