"""An exception raised in a worker or the dispatching process reaches the caller as an
instance of its own type and of ``WorkerError``, with the worker id and the original
traceback in its message; a type that cannot be combined gives a plain ``WorkerError``."""

from __future__ import annotations

import errno
import pickle
from typing import Any

import pytest

from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.errors import WorkerError
from conveyor.pipes import IterableWrapper
from conveyor.workers.transport.remote_errors import MAX_TRACEBACK_CHARS, remote_error


class CustomError(Exception):
    """An exception whose __init__ takes other arguments than its args."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code


def raise_on_five(item: int) -> int:
    if item == 5:
        raise KeyError("five")
    return item


def raise_custom(item: int) -> int:
    if item == 2:
        raise CustomError(42, "the answer")
    return item


def open_missing(item: int) -> int:
    if item == 4:
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", "/nowhere/shard-4.tar")
    return item


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [1, 2])
def test_a_workers_key_error_is_caught_as_key_error_and_as_worker_error(workers: int) -> None:
    loader = DataLoader2(
        IterableWrapper(range(10)).sharding_filter().map(raise_on_five),
        reading_service=MultiProcessingReadingService(num_workers=workers),
    )
    got: list[int] = []
    with pytest.raises(KeyError) as info:
        for item in loader:
            got.append(item)
    loader.shutdown()
    error = info.value
    assert got == [0, 1, 2, 3, 4]  # in order: every item before the failing one arrived
    assert isinstance(error, WorkerError) and isinstance(error, LookupError)
    assert error.args == ("five",) and error.worker_id == 5 % workers
    text = str(error)
    assert text.startswith(f"Caught KeyError in worker process {5 % workers}: 'five'")
    assert "Original Traceback (most recent call last):" in text and "raise_on_five" in text
    assert isinstance(error.__cause__, KeyError) and not isinstance(error.__cause__, WorkerError)
    assert type(error).__name__ == "KeyError"


@pytest.mark.timeout(60)
def test_attributes_and_constructor_arguments_survive() -> None:
    loader = DataLoader2(
        IterableWrapper(range(6)).sharding_filter().map(raise_custom),
        reading_service=MultiProcessingReadingService(num_workers=2),
    )
    with pytest.raises(CustomError) as info:
        list(loader)
    loader.shutdown()
    assert info.value.code == 42 and info.value.args == ("42: the answer",)
    assert isinstance(info.value, WorkerError)


@pytest.mark.timeout(60)
def test_an_os_error_keeps_its_subclass_errno_and_file_name() -> None:
    loader = DataLoader2(
        IterableWrapper(range(8)).sharding_filter().map(open_missing),
        reading_service=MultiProcessingReadingService(num_workers=2),
    )
    with pytest.raises(FileNotFoundError) as info:
        list(loader)
    loader.shutdown()
    error = info.value
    assert error.errno == errno.ENOENT and error.filename == "/nowhere/shard-4.tar"
    assert isinstance(error, WorkerError) and "Caught FileNotFoundError in worker process 0" in str(error)


class BrokenSource(IterableWrapper):
    def __iter__(self) -> Any:
        yield from range(3)
        raise ValueError("the source broke")


@pytest.mark.timeout(60)
def test_the_dispatching_process_error_keeps_its_type() -> None:
    loader = DataLoader2(
        BrokenSource(range(3)).sharding_round_robin_dispatch().map(raise_on_five),
        reading_service=MultiProcessingReadingService(num_workers=2),
    )
    got: list[int] = []
    expected = r"Caught ValueError in dispatching process \(the main process\): the source broke"
    with pytest.raises(ValueError, match=expected):
        for item in loader:
            got.append(item)
    loader.shutdown()
    assert got == [0, 1, 2]


def test_the_combined_error_pickles_back_to_its_type() -> None:
    original = CustomError(7, "x")
    traceback_text = "Traceback (most recent call last):\n  ..."
    error = remote_error(original, "CustomError", str(original), traceback_text, "worker process 3", 3)
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error) and isinstance(again, CustomError) and isinstance(again, WorkerError)
    assert again.code == 7 and again.worker_id == 3 and str(again) == str(error)
    missing = FileNotFoundError(2, "gone", "/a/b")
    error = remote_error(missing, "FileNotFoundError", str(missing), "", "worker process 0", 0)
    moved = pickle.loads(pickle.dumps(error))
    assert moved.filename == "/a/b" and isinstance(moved, FileNotFoundError)


class Final(Exception):
    def __init_subclass__(cls, **kwargs: Any) -> None:
        raise TypeError("Final may not be subclassed")


def test_a_type_that_cannot_be_combined_gives_a_plain_worker_error_with_the_cause() -> None:
    original = Final("no subclasses")
    error = remote_error(original, "Final", "no subclasses", "Traceback ...", "worker process 1", 1)
    assert type(error) is WorkerError and error.__cause__ is original and error.worker_id == 1
    assert str(error).startswith("Caught Final in worker process 1: no subclasses")
    interrupt = remote_error(KeyboardInterrupt(), "KeyboardInterrupt", "", "", "worker process 0", 0)
    assert type(interrupt) is WorkerError
    unknown = remote_error(None, "Unpicklable", "it did not pickle", "Traceback ...", "worker process 2", 2)
    assert type(unknown) is WorkerError and unknown.__cause__ is None


def test_the_message_is_bounded() -> None:
    huge = ValueError("x" * 10_000_000)
    error = remote_error(huge, "ValueError", str(huge), "Traceback\n" + "y" * 10_000_000, "worker process 0", 0)
    assert len(str(error)) < 3 * MAX_TRACEBACK_CHARS and "characters left out" in str(error)
    assert error.args == huge.args  # the original's own value is kept whole
