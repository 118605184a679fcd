"""The main process's side of the workers: when to start them, what to send, what came.

A :class:`WorkerPool` owns every :class:`~conveyor.workers.parent.process.WorkerProcess` (or, with
``worker_type="thread"``, :class:`~conveyor.workers.parent.thread.ThreadWorker`) it starts; a
``weakref.finalize`` ends them (:func:`~conveyor.workers.parent.process.stop_all`,
:func:`~conveyor.workers.parent.thread.stop_threads`; bounded) if the pool is garbage-collected or
the interpreter exits without ``close()``.
One thread drives a pool at a time (the reader's: the consumer's, or its read-ahead
thread's); it never blocks on a worker: requests are written without blocking and the
rest goes when the pipe has room, while waiting for responses. Waiting always includes
every process sentinel, so a worker that dies is noticed at once; it is bounded by the
service's ``timeout`` when one is set, and by the workers' lives otherwise.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from conveyor.core.base import IterDataPipe
from conveyor.errors import WorkerDeathError, WorkerError
from conveyor.workers.child.event_loop import InitFn, WorkerConfig
from conveyor.workers.child.state_machine import ResetFn
from conveyor.workers.parent.credits import CreditLedger
from conveyor.workers.parent.descriptors import WorkerDescriptors
from conveyor.workers.parent.healing import WorkerRestarts
from conveyor.workers.parent.merge import Merge
from conveyor.workers.parent.pool_errors import closed_error, death_error, silence_error
from conveyor.workers.parent.process import WorkerProcess, stop_all
from conveyor.workers.parent.thread import ThreadWorker, stop_threads
from conveyor.workers.transport.protocol import Failure, StartEpoch
from conveyor.workers.transport.remote_errors import failure_error
from conveyor.workers.transport.shared_memory import SharedMemory

#: How long start-up may take before a worker counts as stuck.
START_TIMEOUT_S = 120.0
#: How long the caller waits for the started workers' output before starting the next
#: worker anyway (about what a fork costs the main process).
NEXT_START_AFTER_S = 0.005

F = TypeVar("F", bound=Callable[..., Any])


def _exclusive(method: F) -> F:
    """One thread at a time inside the pool: the reader's thread normally; an abandoned
    epoch's read-ahead thread that wakes up late waits here, then finds its epoch gone."""

    @functools.wraps(method)
    def locked(self: WorkerPool, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return locked  # type: ignore[return-value]


class WorkerPool:
    """``num_workers`` processes, each running the worker loop on its copy of the graph.

    Workers start with the first epoch, one at a time: the first at once, each next one
    when the caller next waits for output after some worker has delivered, or after it
    has waited :data:`NEXT_START_AFTER_S` without output. Starting a worker blocks the main
    process for milliseconds (``fork`` copies its page tables); this way the first
    worker's first item reaches the caller while the others are being started, not after
    all of them, and a slow first item does not hold back the others' start.
    ``start_all_at_once`` starts them together instead (dispatch mode, where the main
    process feeds every worker from the start, and graphs whose main-process part runs
    threads: no worker is forked while a thread of ours runs). Workers that an epoch ended
    before starting are started when the next one begins, and run the ended epoch's reset
    first.

    ``worker_type="thread"``: the workers are threads of this process
    (:class:`~conveyor.workers.parent.thread.ThreadWorker`), waited on like processes; ``context``
    and ``shared_memory_budget`` do not apply.
    """

    def __init__(
        self,
        graph: IterDataPipe,
        num_workers: int,
        context: str | None,
        init_fn: InitFn | None,
        reset_fn: ResetFn | None,
        timeout: float | None,
        start_all_at_once: bool = False,
        shared_memory_budget: int | None = None,
        worker_type: str = "process",
        max_restarts: int = 0,
    ):
        self.num_workers = num_workers
        self._threads = worker_type == "thread"
        self.restarts = WorkerRestarts(max_restarts)  # dead workers it may still replace
        self._start_all_at_once = start_all_at_once
        # The epoch's start, for late starters too: every worker's but its resume, and the resumes.
        self._epoch: StartEpoch | None = None
        self._resumes: Sequence[Any] = ()
        self._delivered = False  # some worker has sent output: the next wait may start another
        self.timeout = timeout
        self.pids: list[int] = []
        self._workers: list[Any] = []  # WorkerProcess or ThreadWorker
        self._stop = stop_threads if self._threads else stop_all  # ends workers, bounded
        self._finalizer = weakref.finalize(self, self._stop, self._workers)
        self._ctx = multiprocessing.get_context(None if self._threads else context)
        self._fork = not self._threads and self._ctx.get_start_method() == "fork"
        self._shared_memory = None if self._threads else SharedMemory(num_workers, shared_memory_budget)
        self._graph, self._init_fn, self._reset_fn = graph, init_fn, reset_fn
        self._starting: set[int] = set()  # workers started whose Ready has not arrived yet
        self._broken: BaseException | None = None  # what closed the pool during a start
        self._fds = WorkerDescriptors()
        self._writing: set[int] = set()  # workers with request bytes waiting for room
        self._queued: list[deque[Any]] = []  # per worker: frames read, not yet handed out
        self._credits = CreditLedger()
        self._lock = threading.RLock()

    def _start(self, worker_id: int) -> None:
        """Start one worker (its epoch's start follows; see the class docstring for when),
        or a new process in place of worker ``worker_id`` when it has one already."""
        self._starting.add(worker_id)
        worker: WorkerProcess | ThreadWorker
        if self._shared_memory is None:
            worker = ThreadWorker(worker_id)
        else:
            worker = WorkerProcess(worker_id, self._ctx, self._shared_memory.open(worker_id))
        replacing = worker_id < len(self._workers)
        if replacing:
            self._workers[worker_id] = worker  # from here on, stop_all (stop_threads) ends and releases it
        else:
            self._workers.append(worker)
        config = WorkerConfig(
            worker_id=worker_id,
            num_workers=self.num_workers,
            graph=self._graph,
            init_fn=self._init_fn,
            reset_fn=self._reset_fn,
            parent_pid=os.getpid(),
            die_with_parent=threading.current_thread() is threading.main_thread(),
            inherited_fds=WorkerProcess.inherited_under_fork() if self._fork else (),
        )
        if isinstance(worker, ThreadWorker):
            worker.start(config)
        else:
            worker.start(self._ctx, config, self._fork)
        if replacing:
            self._queued[worker_id] = deque()
        else:
            self._queued.append(deque())
        self._fds.add(worker_id, worker)

    # --- requests ------------------------------------------------------------------------

    @_exclusive
    def start_epoch(
        self,
        generation: int,
        seeds: Any,
        resumes: Sequence[Any],
        credits: int,
        collect_stats: bool | str = False,
        skips: dict[str, Any] | None = None,
    ) -> None:
        """Start epoch ``generation`` on the running workers; workers still to start get it
        when they start (the first one starts now). ``skips``: what workers need when stages
        drop the items they fail on (``on_error="skip"``; ``SkipLedger.worker_spec``)."""
        self._check_usable()
        if self._epoch is not None and self.started < self.num_workers:
            # The last epoch ended before these workers were started: they run its reset
            # now (a hook runs once per worker and epoch) with no credits, so they read
            # nothing of it and go straight on to this one.
            self._epoch = replace(self._epoch, credits=0, collect_stats=False)
            self.start_remaining()
        self._epoch = StartEpoch(generation, seeds, None, credits, collect_stats, skips)
        self._resumes = resumes
        for worker_id in range(self.started):
            self._send_start_epoch(worker_id)
        if self._start_all_at_once:
            self.start_remaining()
        elif not self.started:
            self._start_next()

    @property
    def started(self) -> int:
        """How many workers have been started."""
        return len(self._workers)

    @_exclusive
    def start_remaining(self) -> None:
        """Start every worker not started yet, in this thread (before another thread takes
        over the waiting: no worker is forked while a thread of ours runs)."""
        while self.started < self.num_workers:
            self._start_next()

    def _start_next(self) -> None:
        worker_id = self.started
        self._start_or_close(worker_id)
        self._send_start_epoch(worker_id)

    def _start_or_close(self, worker_id: int) -> None:
        """:meth:`_start`; on failure, close the pool: half-made resources cannot be told
        apart from whole ones, so all of them end."""
        try:
            self._start(worker_id)
        except BaseException as error:
            self._broken = error
            self.close()
            raise
        self.pids = [w.pid for w in self._workers]

    def _send_start_epoch(self, worker_id: int, replacement: tuple[Any, Any] | None = None) -> None:
        """Send worker ``worker_id`` the current epoch's start; ``replacement``: ``(resume,
        skips)`` for a new process in place of a dead one. A worker process gets its
        global RNGs' seed made here (see :class:`StartEpoch`); a thread worker seeds none."""
        epoch = self._epoch
        assert epoch is not None
        resume, skips = replacement if replacement is not None else (self._resumes[worker_id], epoch.skips)
        seed = epoch.seeds.spawn(worker_id).global_rng_seed() if self._shared_memory is not None else None
        self.send(worker_id, replace(epoch, resume=resume, skips=skips, global_rng_seed=seed))

    @_exclusive
    def grant(self, worker_id: int, generation: int, credits: int = 1) -> None:
        """Let worker ``worker_id`` send ``credits`` more chunks of epoch ``generation``
        (never blocks: see :mod:`conveyor.workers.parent.credits`)."""
        self._credits.grant(worker_id, self._workers[worker_id].credit_fd, generation, credits)

    @_exclusive
    def send(self, worker_id: int, message: Any) -> None:
        """Send a request without blocking; what the pipe cannot take now goes while the
        pool waits for responses."""
        worker = self._workers[worker_id]
        if not worker.queue(message):
            self._writing.add(worker_id)

    # --- responses -----------------------------------------------------------------------

    def _listens_to(self, worker_id: int, awaited: list[int] | None) -> bool:
        """Whether to listen to a worker: one the merge awaits (None: all), or one still
        starting (its Ready ends the start-up timeout); deaths always show."""
        return awaited is None or worker_id in awaited or worker_id in self._starting

    def _flush_writes(self, ready: set[int]) -> None:
        """Write held-back requests to the workers whose pipes have room now."""
        for worker_id in list(self._writing):
            worker = self._workers[worker_id]
            if worker.request_fd in ready and worker.flush():
                self._writing.discard(worker_id)

    @_exclusive
    def receive(
        self,
        timeout: float | None,
        wake: int | None = None,
        awaited: list[int] | None = None,
        merge: Merge | None = None,
    ) -> list[tuple[int, Any]] | None:
        """Frames from the workers that spoke (possibly none), at most one per worker, as
        ``(worker id, frame)``, or None when the file descriptor ``wake`` became readable.
        Only workers in ``awaited`` (None: all) and workers still starting
        are listened to; ``merge``, the reader's, explains a silence.

        Raises :class:`WorkerError` when a worker died, or when none spoke in time.
        """
        self._check_usable()
        # Frames read earlier go first, one per worker and call: handing out a whole read
        # at once would keep a burst of entries (once decoded) waiting long enough for the garbage collector
        # to promote them (measured: small items through 2 workers ~20% slower).
        messages = self._queued_messages(
            w for w, frames in enumerate(self._queued) if frames and self._listens_to(w, awaited)
        )
        if messages:
            return messages
        if self._delivered and self.started < self.num_workers:
            self._start_next()  # the ones started meanwhile go on working
        limit = self.timeout if timeout is None else (timeout if self.timeout is None else min(timeout, self.timeout))
        if limit is None and self._starting:
            limit = START_TIMEOUT_S  # a worker stuck in start-up (worker_init_fn) must not hang us
        more_to_start = self.started < self.num_workers
        if more_to_start:
            # Give the started workers a moment to deliver, not longer: a slow first item
            # (or worker_init_fn) must not hold back the start of the others.
            limit = NEXT_START_AFTER_S if limit is None else min(limit, NEXT_START_AFTER_S)
        self._fds.listen_to(lambda worker_id: self._listens_to(worker_id, awaited))
        room = [self._workers[worker_id].request_fd for worker_id in self._writing]  # for requests held back
        ready = self._fds.wait(limit, [wake] if wake is not None else [], room)
        if self._writing:
            self._flush_writes(ready)
        if not ready and more_to_start:
            self._start_next()
            return []
        if not ready:  # who holds things up, and what the others wait for
            assert limit is not None  # with no limit, the wait ends only when something is ready
            raise silence_error(self._workers, awaited, self._starting, limit, merge)
        if wake is not None and wake in ready:
            return None
        spoke = self._fds.speaking(ready)
        for worker_id in spoke:
            try:
                self._queued[worker_id].extend(self._workers[worker_id].frames.read())
            except (EOFError, OSError):
                raise self.death_error(worker_id) from None
        messages = self._queued_messages(spoke)
        dead = self._fds.dead(ready)
        if dead and not messages:  # else they go first: a death stays visible for the next call
            raise self.death_error(dead[0])
        return messages

    # --- replacing a dead worker ----------------------------------------------------------

    @_exclusive
    def drain(self, worker_id: int) -> list[Any]:
        """Every whole frame dead worker ``worker_id`` sent: what was read and what its pipe
        still holds (a frame cut short by the death is dropped)."""
        worker, frames = self._workers[worker_id], self._queued[worker_id]
        while True:
            try:
                frames.extend(worker.frames.read())
            except (EOFError, OSError):
                break
        return [message for _, message in self._queued_messages([worker_id] * len(frames))]

    @_exclusive
    def replace(self, worker_id: int, resume: Any, skips: dict[str, Any] | None) -> str:
        """End dead worker ``worker_id`` and start a new process in its place, which
        resumes the epoch in progress from ``resume`` (its state after the last item the
        main process received from it); returns how the old one died."""
        self._check_usable()
        old = self._workers[worker_id]
        death = f"pid {old.pid} {old.describe_death()}"
        self._fds.remove(old)
        self._writing.discard(worker_id)
        self._credits.forget(worker_id)
        self._stop([old])  # its pipes and memory (arrays the user holds stay valid)
        self._start_or_close(worker_id)
        self._send_start_epoch(worker_id, (resume, skips))
        return death

    def check_alive(self) -> None:
        """Raise the death of any worker, looking without waiting (for a reader that hands
        out items it already holds, so a death is raised at once, not after them)."""
        if self.closed:
            return
        for worker_id in self._fds.dead_now():
            raise self.death_error(worker_id)

    def _queued_messages(self, workers: Iterable[int]) -> list[tuple[int, Any]]:
        """The next frame from each of these workers' frames read so far, as it came: the
        reader decodes it (:meth:`decoder`), and tells the pool of a Ready (:meth:`ready`)."""
        messages: list[tuple[int, Any]] = []
        for worker_id in workers:
            frames = self._queued[worker_id]
            if frames:
                if worker_id not in self._starting:
                    self._delivered = True
                messages.append((worker_id, frames.popleft()))
        return messages

    def decoder(self, worker_id: int) -> Callable[[Any], Any]:
        """What reads worker ``worker_id``'s frames (of the process that sent them: ask
        before :meth:`replace`)."""
        return self._workers[worker_id].decode

    def ready(self, worker_id: int) -> None:
        """Worker ``worker_id`` has started (its Ready came): what follows waits until the
        merge listens to it, and its start-up timeout ends."""
        self._starting.discard(worker_id)

    # --- errors --------------------------------------------------------------------------

    def death_error(self, worker_id: int) -> WorkerDeathError:
        return death_error(self._workers[worker_id])

    def failure_error(self, failure: Failure) -> WorkerError:
        """The error to raise for a worker's (see :func:`conveyor.workers.transport.remote_errors.failure_error`)."""
        return failure_error(failure, "thread worker" if self._threads else "worker process")

    # --- end -----------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def _check_usable(self) -> None:
        """A pool closed by a failed start cannot serve another epoch: say so, never hang."""
        if self.closed:
            raise closed_error(self._threads, self._broken) from self._broken

    def close(self) -> None:
        """End every worker within about two seconds (EOF, then SIGTERM, then SIGKILL),
        close the pipes, release shared memory. Idempotent."""
        self._finalizer()
