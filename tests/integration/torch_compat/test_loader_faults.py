"""``conveyor.DataLoader`` when things go wrong: a dataset's error surfaces at the step
torch's ``DataLoader`` raises it, with its type; a worker that dies is an error that
names it, never a hang; and no worker outlives the error."""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from conveyor import DataLoader, DataLoader2, MultiProcessingReadingService
from conveyor.errors import WorkerError
from conveyor.pipes import IterableWrapper
from process_helpers import alive

pytestmark = pytest.mark.timeout(180)


class Failing(Dataset):
    """Item ``bad`` raises a ValueError."""

    def __init__(self, bad: int, n: int = 24) -> None:
        self.bad, self.n = bad, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i == self.bad:
            raise ValueError(f"item {i} is corrupt")
        return i


def batches_until_error(loader: Any) -> tuple[list[Any], BaseException | None]:
    got: list[Any] = []
    try:
        for batch in loader:
            got.append(batch.tolist())
    except Exception as error:  # what each loader raised is compared below
        return got, error
    finally:
        if isinstance(loader, DataLoader):
            loader.shutdown()
    return got, None


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("bad", [0, 7, 23])
def test_a_datasets_error_raises_at_the_step_torch_raises_it_with_its_type(workers: int, bad: int) -> None:
    # torch raises at the same step with any worker count (in order); its workers, once an
    # epoch failed, take ~10 s to end when the loader is collected: read torch's in process.
    theirs, their_error = batches_until_error(TorchDataLoader(Failing(bad), batch_size=4))
    ours, our_error = batches_until_error(DataLoader(Failing(bad), batch_size=4, num_workers=workers))
    assert ours == theirs  # the same batches before it
    assert isinstance(their_error, ValueError) and isinstance(our_error, ValueError)
    assert f"item {bad} is corrupt" in str(our_error)
    if workers:
        assert isinstance(our_error, WorkerError) and "worker" in str(our_error)


class FailsToStart(IterableDataset):
    def __iter__(self) -> Any:
        raise RuntimeError("Error in __iter__")


@pytest.mark.parametrize("workers", [0, 2])
def test_an_error_in_an_iterable_datasets_iter_reaches_the_loop(workers: int) -> None:
    loader = DataLoader(FailsToStart(), num_workers=workers)
    try:
        with pytest.raises(RuntimeError, match="Error in __iter__"):
            list(loader)
    finally:
        loader.shutdown()


def failing_init(worker_id: int) -> None:
    raise RuntimeError(f"Error in worker_init_fn {worker_id}")


def test_an_error_in_worker_init_fn_reaches_the_loop() -> None:
    loader = DataLoader(Failing(bad=-1), num_workers=2, worker_init_fn=failing_init)
    try:
        with pytest.raises(RuntimeError, match="Error in worker_init_fn"):
            list(loader)
    finally:
        loader.shutdown()


class Dies(Dataset):
    """Item ``bad`` ends its worker process at once, as an OOM kill or a crash in native
    code would; each item tells the pid that fetched it."""

    def __init__(self, bad: int) -> None:
        self.bad = bad

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> tuple[int, int]:
        if i == self.bad and get_worker_info() is not None:
            os._exit(9)
        return i, os.getpid()


class NotePid:
    """A ``worker_init_fn`` that leaves each worker's pid in a directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def __call__(self, worker_id: int) -> None:
        (self.directory / str(os.getpid())).touch()


@pytest.mark.parametrize("persistent", [False, True])
def test_a_worker_that_dies_is_an_error_naming_it_and_no_worker_is_left(persistent: bool, tmp_path: Path) -> None:
    loader = DataLoader(
        Dies(bad=13), batch_size=None, num_workers=2, persistent_workers=persistent, worker_init_fn=NotePid(tmp_path)
    )
    started = time.monotonic()
    with pytest.raises(WorkerError, match=r"worker [01]") as raised:
        list(loader)
    assert time.monotonic() - started < 60  # an error, not a hang (the bound is generous: loaded CI)
    assert "exit" in str(raised.value) or "died" in str(raised.value)
    loader.shutdown()
    pids = [int(path.name) for path in tmp_path.iterdir()]
    deadline = time.monotonic() + 30
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pids and not any(alive(pid) for pid in pids)


def test_the_loader_reads_again_after_a_datasets_error() -> None:
    """An error ends the epoch, not the loader: the next iter() reads a whole epoch."""
    dataset = Failing(bad=5)
    loader = DataLoader(dataset, batch_size=4, num_workers=2, persistent_workers=True)
    try:
        with pytest.raises(ValueError, match="item 5 is corrupt"):
            list(loader)
        dataset.bad = -1  # persistent workers hold their own copy: it still fails there
        with pytest.raises(ValueError, match="item 5 is corrupt"):
            list(loader)
    finally:
        loader.shutdown()
    fresh = DataLoader(Failing(bad=-1), batch_size=4, num_workers=2)
    assert [b.tolist() for b in fresh] == [list(range(k, k + 4)) for k in range(0, 24, 4)]
    fresh.shutdown()


def fails_on_three(x: int) -> int:
    if x == 3:
        raise ValueError("three")
    return x


def note_pid(directory: Path) -> Any:
    def init(graph: Any, info: Any) -> Any:
        (directory / str(os.getpid())).touch()
        return graph

    return init


def wait_until_gone(pids: list[int], seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(alive(pid) for pid in pids)


@pytest.mark.parametrize("kind", ["DataLoader", "DataLoader2"])
def test_a_loader_dropped_after_a_failed_epoch_ends_its_workers(kind: str, tmp_path: Path) -> None:
    """The error the merge keeps (to raise it again) references the frames it went
    through, the caller's too, and so the loader: the loader must still be collectable."""

    def run() -> None:
        loader: Any
        if kind == "DataLoader":
            loader = DataLoader(Failing(bad=3), batch_size=2, num_workers=2, worker_init_fn=NotePid(tmp_path))
        else:
            graph = IterableWrapper(range(10)).sharding_filter().map(fails_on_three)
            service = MultiProcessingReadingService(2, worker_init_fn=note_pid(tmp_path))
            loader = DataLoader2(graph, reading_service=service)
        with pytest.raises(ValueError):
            list(loader)

    run()
    gc.collect()
    pids = [int(path.name) for path in tmp_path.iterdir()]
    assert pids and wait_until_gone(pids)
