"""The main process's side of the workers: start them, talk to them, end them.

A :class:`WorkerPool` owns every process, pipe and shared-memory ring it creates; the
resources live in a separate :class:`_Resources` object that a ``weakref.finalize``
releases if the pool is garbage-collected or the interpreter exits without ``close()``.
Waiting always includes the processes' sentinels, so a worker that dies is noticed at
once, and always carries a timeout.
"""

from __future__ import annotations

import contextlib
import gc
import math
import multiprocessing
import os
import pickle
import queue
import select
import signal
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterable, Sequence
from multiprocessing.connection import Connection
from typing import Any

from conveyor.errors import WorkerError
from conveyor.pipes.base import IterDataPipe
from conveyor.serialization import dumps, loads
from conveyor.waiting import waits_for_upstream
from conveyor.workers.codec import Decoder
from conveyor.workers.event_loop import InitFn, PickledConfig, WorkerConfig, worker_main
from conveyor.workers.framing import FrameReader
from conveyor.workers.protocol import (
    CREDIT_RECORD,
    Chunk,
    Failure,
    Ready,
    StartEpoch,
    Terminate,
    credit_records,
)
from conveyor.workers.shared_memory import MainEnds, SharedMemory
from conveyor.workers.state_machine import ResetFn

#: How long start-up may take before a worker counts as stuck.
START_TIMEOUT_S = 120.0
#: How long the caller waits for the started workers' output before starting the next
#: worker anyway (about what a fork costs the main process).
NEXT_START_AFTER_S = 0.005
#: How long termination waits for a worker to exit by itself before killing it.
JOIN_TIMEOUT_S = 5.0
#: Credits written at once: a pipe write of at most PIPE_BUF (4096) bytes is atomic.
_CREDITS_PER_WRITE = 4096 // CREDIT_RECORD.size


class _Resources:
    """Everything the pool must release; no reference back to the pool.

    Requests go out through one sender thread, so that no thread of the main process
    ever blocks writing to a worker that is busy writing to it (large dispatch feeds).
    Credits do not: they go straight into each worker's credit pipe, whose write end
    never blocks (see :meth:`WorkerPool.grant`).
    """

    def __init__(self) -> None:
        self.processes: list[multiprocessing.process.BaseProcess] = []
        self.requests: list[Connection] = []
        self.credits: list[Connection] = []
        self.responses: list[Connection] = []
        self.rings: list[MainEnds] = []  # each worker's shared memory (ring, spill channel)
        self.outbox: queue.SimpleQueue[tuple[int, Any] | None] = queue.SimpleQueue()
        self.sender = threading.Thread(target=self._send_forever, name="conveyor-requests", daemon=True)
        self.sender.start()

    def _send_forever(self) -> None:
        broken: set[int] = set()
        while True:
            job = self.outbox.get()
            if job is None:
                return
            worker_id, message = job
            if worker_id in broken:
                continue
            try:
                self.requests[worker_id].send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
            except (OSError, ValueError):
                broken.add(worker_id)  # dead: the reader learns it from the process sentinel

    def release(self) -> None:
        # Close our read ends first: a worker blocked writing a large message to us gets
        # EPIPE and exits instead of waiting for a reader that will never come.
        for connection in self.responses:
            connection.close()
        self.outbox.put(None)
        self.sender.join(JOIN_TIMEOUT_S)
        for connection in self.requests:
            # A dead worker's pipe refuses the message; it is killed below if still alive.
            with contextlib.suppress(OSError, ValueError):
                connection.send_bytes(pickle.dumps(Terminate()))
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
        for process in self.processes:
            if process.is_alive():
                process.kill()
                process.join(JOIN_TIMEOUT_S)
        for connection in (*self.requests, *self.credits):
            connection.close()
        for ends in self.rings:
            ends.close()
        self.processes, self.requests, self.credits, self.responses, self.rings = [], [], [], [], []


class WorkerPool:
    """``num_workers`` processes, each running :func:`worker_main` on its copy of the graph.

    Workers start with the first epoch, one at a time: the first at once, each next one
    when the caller next waits for output after some worker has delivered, or after it
    has waited :data:`NEXT_START_AFTER_S` without output. Starting a worker blocks the main
    process for milliseconds (``fork`` copies its page tables); this way the first
    worker's first item reaches the caller while the others are being started, not after
    all of them, and a slow first item does not hold back the others' start.
    ``start_all_at_once`` starts them together instead (dispatch mode, where the main
    process feeds every worker from the start). Workers that an epoch ended before
    starting are started when the next one begins, and run the ended epoch's reset first.
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
    ):
        self.num_workers = num_workers
        self._start_all_at_once = start_all_at_once
        self._epoch: tuple[int, Any, Sequence[Any], int, bool] | None = None  # the StartEpoch for late starters
        self._delivered = False  # some worker has sent output: the next wait may start another
        self.timeout = timeout
        self.pids: list[int] = []
        self._resources = _Resources()
        self._finalizer = weakref.finalize(self, self._resources.release)
        self._decoders: list[Decoder] = []
        self._ctx = multiprocessing.get_context(context)
        self._fork = self._ctx.get_start_method() == "fork"
        self._shared_memory = SharedMemory(num_workers, shared_memory_budget)
        self._graph, self._init_fn, self._reset_fn = graph, init_fn, reset_fn
        self._starting: set[int] = set()  # workers started whose Ready has not arrived yet
        self._broken: BaseException | None = None  # what closed the pool during a start
        # One poll object for the pool's life: each worker's response pipe and process
        # sentinel are registered once, not on every receive (a chunk each time).
        self._poller = select.poll()
        self._responding: dict[int, tuple[int, FrameReader]] = {}  # fd -> (worker, its pipe's reader)
        self._sentinels: dict[int, int] = {}  # fd -> worker
        self._listening: set[int] = set()  # response fds polled for input now
        self._queued: list[deque[memoryview]] = []  # per worker: frames read, not yet decoded
        self._owed: dict[int, tuple[int, int]] = {}  # worker -> (generation, credits its full pipe refused)

    def _start(self, worker_id: int) -> None:
        """Start one worker (its epoch's start follows; see the class docstring for when)."""
        resources = self._resources
        self._starting.add(worker_id)
        ctx, graph, init_fn, reset_fn = self._ctx, self._graph, self._init_fn, self._reset_fn
        ends = self._shared_memory.open(worker_id)
        resources.rings.append(ends)
        request_reader, request_writer = ctx.Pipe(duplex=False)
        credit_reader, credit_writer = ctx.Pipe(duplex=False)
        response_reader, response_writer = ctx.Pipe(duplex=False)
        config = WorkerConfig(
            worker_id=worker_id,
            num_workers=self.num_workers,
            graph=graph,
            init_fn=init_fn,
            reset_fn=reset_fn,
            parent_pid=os.getpid(),
            die_with_parent=threading.current_thread() is threading.main_thread(),
            # Under fork the child inherits every main-side pipe end, its own included; holding
            # them would hide EOFs and EPIPEs (a worker blocked writing would never notice).
            inherited_fds=tuple(
                c.fileno()
                for c in (
                    *resources.requests,
                    *resources.credits,
                    *resources.responses,
                    request_writer,
                    credit_writer,
                    response_reader,
                )
            )
            + tuple(fd for other in resources.rings for fd in other.main_fds())  # spill channels' main ends
            if self._fork
            else (),
        )
        process = ctx.Process(
            target=worker_main,
            # fork shares the graph as it is; other start methods get it pickled by value
            args=(
                config if self._fork else PickledConfig(dumps(config)),
                request_reader,
                credit_reader,
                response_writer,
                ends.for_worker(),
            ),
            name=f"conveyor-worker-{worker_id}",
            daemon=True,
        )
        if self._fork:
            # The child's garbage collector would touch every inherited object and so copy
            # the parent's whole heap page by page: freeze them for the fork (Python's
            # documented recipe), then give the parent its collector back.
            gc.freeze()
            try:
                process.start()
            finally:
                gc.unfreeze()
        else:
            process.start()
        request_reader.close()
        credit_reader.close()
        response_writer.close()
        ends.handed_over()
        os.set_blocking(credit_writer.fileno(), False)
        resources.processes.append(process)
        resources.requests.append(request_writer)
        resources.credits.append(credit_writer)
        resources.responses.append(response_reader)
        self._decoders.append(ends.decoder)
        self._responding[response_reader.fileno()] = (worker_id, FrameReader(response_reader.fileno()))
        self._queued.append(deque())
        self._sentinels[process.sentinel] = worker_id
        self._poller.register(response_reader.fileno(), select.POLLIN)
        self._listening.add(response_reader.fileno())
        self._poller.register(process.sentinel, select.POLLIN)

    # --- requests ------------------------------------------------------------------------

    def start_epoch(
        self, generation: int, seeds: Any, resumes: Sequence[Any], credits: int, collect_stats: bool = False
    ) -> None:
        """Start epoch ``generation`` on the running workers; workers still to start get it
        when they start (the first one starts now)."""
        self._check_usable()
        if self._epoch is not None and self.started < self.num_workers:
            # The last epoch ended before these workers were started: they run its reset
            # now (a hook runs once per worker and epoch) with no credits, so they read
            # nothing of it and go straight on to this one.
            last_generation, last_seeds, last_resumes, _, _ = self._epoch
            self._epoch = (last_generation, last_seeds, last_resumes, 0, False)
            self.start_remaining()
        self._epoch = (generation, seeds, resumes, credits, collect_stats)
        for worker_id in range(self.started):
            self._send_start_epoch(worker_id)
        if self._start_all_at_once:
            self.start_remaining()
        elif not self.started:
            self._start_next()

    @property
    def started(self) -> int:
        """How many workers have been started."""
        return len(self._resources.processes)

    def start_remaining(self) -> None:
        """Start every worker not started yet, in this thread (before another thread takes
        over the waiting: a worker started by the main thread dies with the main process)."""
        while self.started < self.num_workers:
            self._start_next()

    def _start_next(self) -> None:
        worker_id = self.started
        try:
            self._start(worker_id)
        except BaseException as error:
            # Half-made resources cannot be told apart from whole ones: end them all.
            self._broken = error
            self.close()
            raise
        self.pids = [p.pid for p in self._resources.processes]  # type: ignore[misc]
        self._send_start_epoch(worker_id)

    def _send_start_epoch(self, worker_id: int) -> None:
        assert self._epoch is not None
        generation, seeds, resumes, credits, collect_stats = self._epoch
        self.send(worker_id, StartEpoch(generation, seeds, resumes[worker_id], credits, collect_stats))

    def grant(self, worker_id: int, generation: int, credits: int = 1) -> None:
        """Let worker ``worker_id`` send ``credits`` more chunks of epoch ``generation``.

        Called by the one thread that merges. The write never blocks: the pipe holds
        thousands of records, and when a worker has left that many unread (it has that
        many credits already) the rest are owed and go with its next grant.
        """
        owed_generation, owed = self._owed.pop(worker_id, (generation, 0))
        if owed_generation == generation:
            credits += owed
        count = min(credits, _CREDITS_PER_WRITE)
        try:
            os.write(self._resources.credits[worker_id].fileno(), credit_records(generation, count))
        except BlockingIOError:
            count = 0
        except BrokenPipeError:
            return  # the worker is gone: receive() reports it from its process sentinel
        if credits > count:
            self._owed[worker_id] = (generation, credits - count)

    def send(self, worker_id: int, message: Any) -> None:
        """Queue a request; the sender thread writes it (a dead worker shows in ``receive``)."""
        self._resources.outbox.put((worker_id, message))

    # --- responses -----------------------------------------------------------------------

    @waits_for_upstream
    def _wait_for_events(self, limit: float | None) -> list[int]:
        """The file descriptors with an event, waiting up to ``limit`` seconds (None: forever)."""
        return [fd for fd, _ in self._poller.poll(None if limit is None else math.ceil(limit * 1000))]

    def _listens_to(self, worker_id: int, awaited: list[int] | None) -> bool:
        return awaited is None or worker_id in awaited or worker_id in self._starting

    def _listen_to(self, awaited: list[int] | None) -> None:
        """Wait for responses from these workers only (None: all), and from workers still
        starting (their Ready ends the start-up timeout); deaths always show."""
        listening = self._listening
        for fd, (worker_id, _) in self._responding.items():
            wanted = self._listens_to(worker_id, awaited)
            if wanted != (fd in listening):
                if wanted:
                    listening.add(fd)
                    self._poller.modify(fd, select.POLLIN)
                else:
                    listening.discard(fd)
                    self._poller.modify(fd, 0)

    def receive(
        self, timeout: float | None, wake: int | None = None, awaited: list[int] | None = None
    ) -> list[tuple[int, Any]] | None:
        """Messages from the workers that spoke (possibly none: start-up messages are
        handled here), at most one per worker, or None when the file descriptor ``wake``
        became readable. Only workers in ``awaited`` (None: all) and workers still starting
        are listened to.

        Raises :class:`WorkerError` when a worker died, or when none spoke in time.
        """
        self._check_usable()
        # Frames read earlier go first, one per worker and call: decoding a whole read at
        # once would keep a burst of entries waiting long enough for the garbage collector
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
        self._listen_to(awaited)
        if wake is not None:
            self._poller.register(wake, select.POLLIN)
        try:
            # Any event counts: a closed pipe or an exited process shows as POLLHUP.
            ready = self._wait_for_events(limit)
        finally:
            if wake is not None:
                self._poller.unregister(wake)
        if not ready and more_to_start:
            self._start_next()
            return []
        if not ready:
            processes = self._resources.processes
            who = ", ".join(
                f"worker {w} (pid {p.pid})" for w, p in enumerate(processes) if self._listens_to(w, awaited)
            )
            raise WorkerError(
                f"{who} sent nothing within {limit:.1f}s (the timeout); a stage may be stuck. "
                "Raise MultiProcessingReadingService(timeout=...) if it is just slow."
            )
        if wake is not None and wake in ready:
            return None
        spoke: list[int] = []
        for fd in ready:
            if fd in self._responding:
                worker_id, reader = self._responding[fd]
                try:
                    self._queued[worker_id].extend(reader.read())
                except (EOFError, OSError):
                    raise self.death_error(worker_id) from None
                spoke.append(worker_id)
        messages = self._queued_messages(spoke)
        for fd in ready:
            if fd in self._sentinels and not any(w == self._sentinels[fd] for w, _ in messages):
                raise self.death_error(self._sentinels[fd])
        return messages

    def _queued_messages(self, workers: Iterable[int]) -> list[tuple[int, Any]]:
        """The next message from each of these workers' frames read so far (a Ready or a
        start-up failure is handled here: it ends the start, or raises)."""
        messages: list[tuple[int, Any]] = []
        for worker_id in workers:
            frames = self._queued[worker_id]
            if not frames:
                continue
            try:
                message = self._decode(worker_id, frames.popleft())
            except Exception as error:
                raise WorkerError(
                    f"an item from worker {worker_id} could not be unpickled in the main process "
                    f"({type(error).__name__}: {error}); its class must be importable here"
                ) from error
            if isinstance(message, Ready):
                self._ready(worker_id)  # what follows waits until the merge listens to it
            elif isinstance(message, Failure) and message.generation < 0:
                raise self.failure_error(message)
            else:
                self._delivered = True
                messages.append((worker_id, message))
        return messages

    def _ready(self, worker_id: int) -> None:
        """A worker finished starting (its start-up timeout ends)."""
        self._starting.discard(worker_id)

    def _decode(self, worker_id: int, data: memoryview) -> Any:
        message = pickle.loads(data)
        if isinstance(message, Chunk):
            return message.generation, self._decoders[worker_id].decode(message.payload, message.buffers)
        return message

    # --- errors --------------------------------------------------------------------------

    def death_error(self, worker_id: int) -> WorkerError:
        process = self._resources.processes[worker_id]
        process.join(1.0)
        code = process.exitcode
        if code is None:
            how = "stopped responding"
        elif code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = "unknown"
            how = f"was killed by signal {name} ({-code}; exit code {code})"
        else:
            how = f"exited with code {code}"
        return WorkerError(
            f"worker {worker_id} (pid {process.pid}) {how}. A worker that dies (killed, out of memory, "
            "a crash in native code, os._exit) ends the epoch; shut the loader down and start again."
        )

    @staticmethod
    def failure_error(failure: Failure) -> WorkerError:
        original: BaseException | None = None
        if failure.exception is not None:
            try:
                original = loads(failure.exception)
            except Exception:
                original = None  # the text below still says what happened
        where = "during start-up" if failure.generation < 0 else "in its pipeline"
        error = WorkerError(f"worker {failure.worker_id} raised {failure.type_name} {where}: {failure.message}")
        error.add_note(f"traceback in worker {failure.worker_id}:\n{failure.traceback}")
        error.__cause__ = original
        return error

    # --- end -----------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def _check_usable(self) -> None:
        """A pool closed by a failed start cannot serve another epoch: say so, never hang."""
        if self.closed:
            why = f" after {type(self._broken).__name__} while starting a worker" if self._broken else ""
            raise WorkerError(
                f"the worker processes were shut down{why}; call shutdown() on the loader and build a new one"
            ) from self._broken

    def close(self) -> None:
        """Terminate and join every worker, close pipes, release shared memory. Idempotent."""
        self._finalizer()
