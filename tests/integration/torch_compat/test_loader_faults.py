"""``conveyor.DataLoader`` when things go wrong: a dataset's error surfaces at the step
torch's ``DataLoader`` raises it, with its type, and the epoch goes on with the next batch
(a state taken after it resumes exactly); a worker that dies is an error that names it,
never a hang; and no worker outlives the error."""

from __future__ import annotations

import gc
import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
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
    """An error ends neither the epoch nor the loader: the next iter() reads a whole epoch."""
    dataset = Failing(bad=5)
    loader = DataLoader(dataset, batch_size=4, num_workers=2, persistent_workers=True)
    try:
        for _ in range(2):  # persistent workers hold their own copy: it fails there again
            assert outcomes(loader) == [[0, 1, 2, 3], ("ValueError", "item 5 is corrupt")] + [
                list(range(k, k + 4)) for k in range(8, 24, 4)
            ]
    finally:
        loader.shutdown()
    fresh = DataLoader(Failing(bad=-1), batch_size=4, num_workers=2)
    assert [b.tolist() for b in fresh] == [list(range(k, k + 4)) for k in range(0, 24, 4)]
    fresh.shutdown()


class FailsOn(Dataset):
    """Items in ``bad`` raise a ValueError; every other item is its key."""

    def __init__(self, bad: set[int], n: int = 30) -> None:
        self.bad, self.n = bad, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i in self.bad:
            raise ValueError(f"item {i} is corrupt")
        return i


class FlakyIterator:
    """Worker ``w`` of ``n`` reads items ``w, w + n, ...`` below ``end``; items in ``bad``
    raise a KeyError and the iterator goes on (an iterator, not a generator)."""

    def __init__(self, end: int, bad: set[int], worker: int, workers: int) -> None:
        self.next, self.end, self.bad, self.step = worker, end, bad, workers

    def __iter__(self) -> FlakyIterator:
        return self

    def __next__(self) -> int:
        item = self.next
        if item >= self.end:
            raise StopIteration
        self.next += self.step
        if item in self.bad:
            raise KeyError(item)
        return item


class Flaky(IterableDataset):
    def __init__(self, end: int = 20, bad: tuple[int, ...] = (3, 4, 11)) -> None:
        self.end, self.bad = end, set(bad)

    def __len__(self) -> int:
        return self.end

    def __iter__(self) -> FlakyIterator:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        return FlakyIterator(self.end, self.bad, worker, workers)


class RaisesMidway(IterableDataset):
    """A generator: once it raised, it is finished."""

    def __iter__(self) -> Iterator[int]:
        for i in range(10):
            if i == 4:
                raise ValueError("four")
            yield i


def outcomes(loader: Any, steps: int | None = None, it: Any = None) -> list[Any]:
    """What each ``next()`` gave (a batch as a list, or the error's type and first line),
    until the end or ``steps`` of them."""
    got: list[Any] = []
    it = iter(loader) if it is None else it
    while steps is None or len(got) < steps:
        try:
            batch = next(it)
        except StopIteration:
            break
        except Exception as error:  # the error is the outcome of this step
            got.append((type(error).__mro__[0].__name__, str(error).splitlines()[0].split(": ")[-1]))
            continue
        got.append(batch.tolist() if hasattr(batch, "tolist") else batch)
    return got


def torch_outcomes(loader: Any) -> list[Any]:
    """:func:`outcomes` of torch's loader, its messages cut to the original's (torch's text
    from workers is its traceback)."""
    got = outcomes(loader)
    return [(o[0], None) if isinstance(o, tuple) else o for o in got]


def without_messages(got: list[Any]) -> list[Any]:
    return [(o[0], None) if isinstance(o, tuple) else o for o in got]


def test_a_batchs_error_raises_from_its_next_and_the_next_batch_follows_as_in_torch() -> None:
    check_batch_errors_as_torch(0, None)


def test_a_workers_batch_error_raises_from_its_next_and_the_next_batch_follows(start_method: str) -> None:
    check_batch_errors_as_torch(2, start_method)


def check_batch_errors_as_torch(workers: int, start_method: str | None) -> None:
    args = {"batch_size": 3, "shuffle": True}
    theirs = torch_outcomes(TorchDataLoader(FailsOn({4, 5, 20}), generator=torch.Generator().manual_seed(1), **args))
    loader = DataLoader(
        FailsOn({4, 5, 20}),
        num_workers=workers,
        multiprocessing_context=start_method,
        generator=torch.Generator().manual_seed(1),
        **args,
    )
    try:
        it = iter(loader)
        errors: list[BaseException] = []
        ours: list[Any] = []
        while True:
            try:
                ours.append(next(it).tolist())
            except StopIteration:
                break
            except ValueError as error:  # torch's type, with or without workers
                errors.append(error)
                ours.append(("ValueError", None))
    finally:
        loader.shutdown()
    assert ours == theirs and len(errors) >= 2  # the same steps raise; every other batch is torch's
    for error in errors:
        assert re.search(r"item (4|5|20) is corrupt", str(error))
        if workers:  # torch's text: where it was caught, then the worker's traceback
            assert isinstance(error, WorkerError) and "in worker process" in str(error)
            assert "Original Traceback (most recent call last)" in str(error) and "__getitem__" in str(error)
        else:  # fetched here: the dataset's exception itself, as torch raises it
            assert type(error) is ValueError


@pytest.mark.parametrize("batch_size", [3, None])
@pytest.mark.parametrize("kind", [Flaky, RaisesMidway])
def test_an_iterable_datasets_errors_take_their_batchs_place_as_in_torch(
    kind: type, batch_size: int | None, start_method: str
) -> None:
    """An iterator that raised goes on (the items read before the error in its batch are
    dropped, as torch's fetcher drops them); a generator that raised is finished."""
    for workers in (0, 2):
        theirs = torch_outcomes(TorchDataLoader(kind(), batch_size=batch_size, num_workers=workers))
        loader = DataLoader(
            kind(),
            batch_size=batch_size,
            num_workers=workers,
            multiprocessing_context=start_method if workers else None,
        )
        try:
            assert without_messages(outcomes(loader)) == theirs, workers
        finally:
            loader.shutdown()


# The two resume tests below run under fork alone: what they check is the state after an
# error, which no start method changes; how errors cross from workers under each start
# method is the tests above. Each of their loaders starts workers that import torch.
@pytest.mark.parametrize("persistent", [False, True])
def test_a_state_taken_after_a_failed_next_resumes_the_batches_that_follow(persistent: bool) -> None:
    """Right after the failed next(), and after a later batch: the resumed loader hands out
    exactly what the uninterrupted iterator does next (errors included)."""

    def loader() -> DataLoader:
        return DataLoader(
            FailsOn({4, 20}),
            batch_size=3,
            shuffle=True,
            num_workers=2,
            persistent_workers=persistent,
            multiprocessing_context="fork",
            generator=torch.Generator().manual_seed(3),
        )

    reference = loader()
    whole = outcomes(reference)
    reference.shutdown()
    failed = [i for i, o in enumerate(whole) if isinstance(o, tuple)]
    assert len(failed) == 2 and failed[0] + 1 < len(whole)
    for steps in (failed[0] + 1, failed[0] + 2):
        first = loader()
        it = iter(first)
        assert outcomes(first, steps, it) == whole[:steps]
        state = json.loads(json.dumps(first.state_dict()))
        assert outcomes(first, it=it) == whole[steps:]  # the interrupted loader goes on too
        first.shutdown()
        resumed = loader()
        resumed.load_state_dict(state)
        assert outcomes(resumed) == whole[steps:], steps
        resumed.shutdown()


@pytest.mark.parametrize("kind", [Flaky, RaisesMidway])
def test_an_iterable_datasets_state_after_its_error_resumes_the_rest(kind: type) -> None:
    for workers in (0, 2):
        context = "fork" if workers else None
        reference = DataLoader(kind(), batch_size=2, num_workers=workers, multiprocessing_context=context)
        whole = outcomes(reference)
        reference.shutdown()
        first_error = next(i for i, o in enumerate(whole) if isinstance(o, tuple))
        first = DataLoader(kind(), batch_size=2, num_workers=workers, multiprocessing_context=context)
        assert outcomes(first, first_error + 1) == whole[: first_error + 1]
        state = first.state_dict()
        first.shutdown()
        resumed = DataLoader(kind(), batch_size=2, num_workers=workers, multiprocessing_context=context)
        resumed.load_state_dict(state)
        # Nothing left after it (a generator's last step): the resumed iter() reads the next
        # epoch, as after any epoch's last batch.
        assert outcomes(resumed) == (whole[first_error + 1 :] or whole), workers
        resumed.shutdown()


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
