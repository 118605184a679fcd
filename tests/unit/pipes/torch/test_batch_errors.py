"""``FailedBatch``: a batch's error in its place crosses a process boundary as its
description, and is rebuilt there with its type, args and attributes when it can be."""

from __future__ import annotations

import pickle
import threading

from conveyor.core.worker_info import WorkerInfo, set_worker_info
from conveyor.pipes.torch.batch_errors import FailedBatch


class TwoArguments(Exception):
    """An ``__init__`` that plain pickling cannot call again with the args alone."""

    def __init__(self, key: int, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key = key


def failed(error: BaseException) -> FailedBatch:
    try:
        raise error
    except BaseException as raised:
        return FailedBatch(raised)


def test_in_the_fetching_process_it_holds_the_exception_itself() -> None:
    error = ValueError("item 3 is corrupt")
    batch = failed(error)
    assert batch.error is error and batch.worker_id is None and not batch.crossed


def test_across_processes_it_is_rebuilt_with_its_traceback_as_text() -> None:
    set_worker_info(WorkerInfo(num_workers=2, worker_id=1))
    try:
        batch = failed(TwoArguments(7, "unreadable"))
    finally:
        set_worker_info(None)
    back = pickle.loads(pickle.dumps(batch))
    assert back.crossed and back.worker_id == 1
    assert type(back.error) is TwoArguments and back.error.key == 7 and back.error.args == ("7: unreadable",)
    assert back.type_name == "TwoArguments" and back.message == "7: unreadable"
    assert back.traceback.startswith("Traceback (most recent call last)") and "in failed" in back.traceback
    again = pickle.loads(pickle.dumps(back))  # passed on again: as it came
    assert again.traceback == back.traceback and again.worker_id == 1


def test_an_attribute_that_does_not_pickle_leaves_the_rest() -> None:
    error = KeyError("k")
    error.lock = threading.Lock()  # type: ignore[attr-defined]
    back = pickle.loads(pickle.dumps(failed(error)))
    assert type(back.error) is KeyError and back.error.args == ("k",) and not hasattr(back.error, "lock")
    assert back.message == "'k'"
