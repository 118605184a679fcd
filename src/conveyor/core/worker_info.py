"""``WorkerInfo``: which worker this code runs in, for hooks and user functions.

A worker process sets it for the whole process; a thread worker (``worker_type="thread"``)
for its own thread only, so each thread worker sees its own id, and the main thread (and
every other thread) what it saw before. Threads that conveyor starts inside a worker
(``prefetch``, ``threadpool_map``) carry their starter's over (:func:`carried`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class WorkerInfo:
    """``num_workers`` sharing the work and this one's ``worker_id`` (0-based).

    Args:
        num_workers: How many workers share the work.
        worker_id: This worker's index, from 0 to ``num_workers - 1``.
    """

    num_workers: int
    worker_id: int

    def __post_init__(self) -> None:
        if self.num_workers < 1 or not 0 <= self.worker_id < self.num_workers:
            raise ValueError(
                f"WorkerInfo needs num_workers >= 1 and 0 <= worker_id < num_workers, "
                f"got num_workers={self.num_workers}, worker_id={self.worker_id}"
            )


_current: WorkerInfo | None = None


class _ThreadWorkerInfo(threading.local):
    info: WorkerInfo | None = None  # set in a thread worker's thread (and threads it starts)


_thread = _ThreadWorkerInfo()


def get_worker_info() -> WorkerInfo | None:
    """The ``WorkerInfo`` of the worker running this code; ``None`` outside workers."""
    return _thread.info or _current


def set_thread_worker_info(info: WorkerInfo | None) -> None:
    """Set by a thread worker in its own thread: what :func:`get_worker_info` returns there."""
    _thread.info = info


def carried(target: Callable[..., Any]) -> Callable[..., Any]:
    """``target`` as a thread started now should run it: with the starting thread's thread
    worker info, so that a stage's helper threads inside a thread worker see its id."""
    info = _thread.info
    if info is None:
        return target

    def run(*args: Any, **kwargs: Any) -> Any:
        set_thread_worker_info(info)
        return target(*args, **kwargs)

    return run


def set_worker_info(info: WorkerInfo | None) -> None:
    """Set by the reading service in a worker (or around hooks run in the main process)."""
    global _current
    _current = info


#: ``WorkerInfo`` of a process that reads a loader itself (``num_workers=0``): worker 0 of 1.
IN_MAIN = WorkerInfo(num_workers=1, worker_id=0)
_main_readers = 0  # epochs (and hooks) in progress that run here as IN_MAIN
_outside: WorkerInfo | None = None  # what get_worker_info() says when none runs


def enter_main_worker() -> None:
    """An epoch (or a hook) that runs in this process as its only worker begins; loaders
    may nest (an evaluation loader read inside a training epoch), so entries are counted."""
    global _main_readers, _outside
    if _main_readers == 0:
        _outside = _current
    _main_readers += 1
    set_worker_info(IN_MAIN)


def leave_main_worker() -> None:
    """The matching end of :func:`enter_main_worker`."""
    global _main_readers
    _main_readers = max(0, _main_readers - 1)
    if _main_readers == 0:
        set_worker_info(_outside)
