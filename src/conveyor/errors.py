"""Typed exceptions raised by conveyor.

Every conveyor error derives from :class:`ConveyorError`. Errors about bad input also
derive from the builtin a user would expect (``ValueError``), so existing ``except``
clauses keep working.
"""

from __future__ import annotations

__all__ = [
    "BranchBufferError",
    "CacheTimeoutError",
    "ConveyorError",
    "DistributedError",
    "FrameError",
    "GraphError",
    "HashMismatchError",
    "MissingDependencyError",
    "PauseIteration",
    "PrefetchTimeoutError",
    "ResumeError",
    "SharedMemoryError",
    "SharedMemoryWarning",
    "SkipBudgetError",
    "StateError",
    "WorkerDeathError",
    "WorkerError",
    "WorkerTimeoutError",
]


class ConveyorError(Exception):
    """Base class of every error conveyor raises on purpose. Each pickles to its like (type,
    message, attributes and notes), as errors sent between processes must."""


def _reduced(error: BaseException, arguments: tuple[object, ...]) -> tuple[object, ...]:
    """Pickle support for an error whose ``__init__`` takes ``arguments``: made again from
    them, then given its attributes (notes, and any set after it was made)."""
    return (type(error), arguments, dict(vars(error)))


class StateError(ConveyorError, ValueError):
    """A state given to ``load_state_dict``/``restore`` is not valid for this pipeline.

    Raised at once, before anything is changed: wrong type, missing or extra keys,
    corrupt values, an unknown format version, or a state saved from another graph.
    """


class GraphError(ConveyorError, ValueError, RuntimeError):
    """A graph operation cannot be carried out on this graph (for example removing a source).

    A ``ValueError`` (the graph given is wrong for it) and, since torchdata's graph tools
    raise ``RuntimeError`` there, a ``RuntimeError`` too."""


class ResumeError(ConveyorError, RuntimeError):
    """A valid state cannot be resumed because the source cannot replay (a one-shot iterator)."""


class BranchBufferError(ConveyorError, BufferError):
    """A branch of ``fork``/``demux``/``round_robin_demux``/``unzip`` read so far ahead of
    another that its hub would hold more than ``buffer_size`` items for the lagging one.
    A ``BufferError``, as torchdata raises there."""


class WorkerError(ConveyorError, RuntimeError):
    """A worker process failed: it raised, or it died. The message names the worker."""


class WorkerDeathError(WorkerError):
    """A worker died (killed, out of memory, a crash in native code, ``os._exit``);
    :attr:`worker_id` names it. ``MultiProcessingReadingService(max_worker_restarts=n)``
    replaces such a worker instead, while restarts are left.

    Args:
        worker_id: The worker that died.
        message: What happened and what to do, naming the ranks, workers or pipes concerned.
    """

    def __init__(self, worker_id: int, message: str) -> None:
        super().__init__(message)
        self.worker_id = worker_id

    def __reduce__(self) -> tuple[object, ...]:
        return _reduced(self, (self.worker_id, str(self)))


class FrameError(WorkerError):
    """A worker's response frame does not read as one (a wrong header, sizes that do not
    add up, a chunk out of sequence): the pipe from that worker is out of step.
    :attr:`worker_id` names the worker.

    Args:
        worker_id: The worker whose frame it was.
        message: What was wrong and what to do, naming the worker.
    """

    def __init__(self, worker_id: int, message: str) -> None:
        super().__init__(message)
        self.worker_id = worker_id

    def __reduce__(self) -> tuple[object, ...]:
        return _reduced(self, (self.worker_id, str(self)))


class WorkerTimeoutError(WorkerError):
    """No worker the main process waited on sent anything within the reading service's
    ``timeout`` (seconds, in :attr:`timeout`). :attr:`worker_ids` names the workers that
    hold the epoch up (whose output is needed first); the message says what the other
    silent workers wait for.

    Args:
        message: What happened and what to do, naming the ranks, workers or pipes concerned.
        worker_ids: The workers that hold the epoch up.
        timeout: The seconds waited.
    """

    def __init__(self, message: str, worker_ids: list[int], timeout: float) -> None:
        super().__init__(message)
        self.worker_ids = worker_ids
        self.timeout = timeout

    def __reduce__(self) -> tuple[object, ...]:
        return _reduced(self, (str(self), self.worker_ids, self.timeout))


class DistributedError(ConveyorError, RuntimeError):
    """A collective between ranks failed or timed out: a rank died, stalled, or left the
    epoch early. The message names the rank that is gone or stalled and how that was seen
    (or says it could not be told), this process's rank, and what it was agreeing on;
    :attr:`lost_ranks` holds the ranks named (empty when none could be).

    Args:
        message: What happened and what to do, naming the ranks, workers or pipes concerned.
        lost_ranks: The ranks that are gone or stalled; empty when none could be told.
    """

    def __init__(self, message: str, lost_ranks: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.lost_ranks = tuple(lost_ranks)

    def __reduce__(self) -> tuple[object, ...]:
        return _reduced(self, (str(self), self.lost_ranks))


class PrefetchTimeoutError(DistributedError):
    """A collective between ranks (``fullsync``'s agreement on the epoch's end) waited its
    whole ``timeout`` (seconds, in :attr:`timeout`): a rank stalled. torchdata's name.

    Args:
        message: What happened and what to do, naming the ranks, workers or pipes concerned.
        timeout: The seconds waited.
        lost_ranks: The ranks that did not answer; empty when none could be told.
    """

    def __init__(self, message: str, timeout: float, lost_ranks: tuple[int, ...] = ()) -> None:
        super().__init__(message, lost_ranks)
        self.timeout = timeout

    def __reduce__(self) -> tuple[object, ...]:
        return _reduced(self, (str(self), self.timeout, self.lost_ranks))


class HashMismatchError(ConveyorError, RuntimeError):
    """Data failed its hash check (``check_hash``, or ``on_disk_cache``'s ``hash_dict`` when
    ``end_caching`` saves a file): its digest differs from the expected one, or no digest
    is given for its name. Nothing is written. A ``RuntimeError``, as torchdata raises."""


class CacheTimeoutError(ConveyorError, TimeoutError):
    """``end_caching`` waited its whole ``timeout`` for another process (a worker, a rank)
    to finish making a file it also needs. The message names the file and its lock."""


class PauseIteration(StopIteration):
    """Raised by ``next()`` on an epoch that :meth:`DataLoader2.pause` (or a limit) paused:
    a ``StopIteration`` that does not end the epoch; ``resume()`` continues it."""


class MissingDependencyError(ConveyorError, ImportError):
    """An optional dependency is not installed; the message names the extra that brings it
    (for example ``pip install 'conveyor[torch]'``)."""


class SharedMemoryError(ConveyorError, OSError):
    """Shared memory could not be reserved: ``posix_fallocate`` (or writing zeros where it
    is missing) refused to back a worker's ring or a large item's memory file, so the
    memory is refused up front instead of killing a process with ``SIGBUS`` on first use.
    ``errno`` holds the system's error number (``ENOSPC``, ``ENOMEM``, ...)."""


class SharedMemoryWarning(RuntimeWarning):
    """Large buffers take a slower path than the shared-memory ring: the ring could not be
    reserved or was sized down, or a buffer's own memory file could not be. Issued at most
    once per loader, naming the cause."""


class SkipBudgetError(ConveyorError, RuntimeError):
    """More items failed than ``DataLoader2(on_error="skip", max_skipped=...)`` allows.
    :attr:`skipped` lists every item skipped so far in the epoch, as the records
    ``stats().skipped`` holds (stage, position, type, message); the message shows the
    first few.

    Args:
        message: What happened and what to do, naming the ranks, workers or pipes concerned.
        skipped: The records of the items skipped so far in the epoch.
    """

    def __init__(self, message: str, skipped: list[dict[str, object]]) -> None:
        super().__init__(message)
        self.skipped = skipped

    def __reduce__(self) -> tuple[object, ...]:
        return _reduced(self, (str(self), self.skipped))
