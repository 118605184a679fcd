"""One worker process and the main process's ends of its pipes: start, write, stop.

A :class:`WorkerProcess` owns, in the main process, four pipe ends and its shared memory
(:class:`~conveyor.workers.transport.shared_memory.MainEnds`: its ring and spill channel):

* ``requests`` (write end, non-blocking): epoch starts and dispatched items, in
  ``multiprocessing.Connection`` framing. Writes never block: what the pipe does not take
  waits in :attr:`WorkerProcess.outgoing` and goes when the pipe has room
  (:meth:`flush`), so the one thread that drives the pool never waits on a busy worker,
  and the pipe has one writer. Closing it is the worker's cue to exit (EOF).
* ``credits`` (write end, non-blocking): flow-control records (see :mod:`.protocol`).
* ``responses`` (read end): the worker's frames.
* ``lifeline`` (write end, never written): its end closes when this process dies (however
  it dies), and that ends the worker, whatever it runs and whichever thread or start
  method made it (:mod:`conveyor.workers.child.lifeline`).

:func:`stop_all` ends workers against one deadline: EOF, then ``SIGTERM``, then ``SIGKILL``.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import signal
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from conveyor.core.serialization import dumps
from conveyor.errors import WorkerError
from conveyor.workers.child.event_loop import PickledConfig, WorkerConfig, worker_main
from conveyor.workers.child.lifeline import LifelineHandle
from conveyor.workers.transport.framing import FrameReader
from conveyor.workers.transport.shared_memory import MainEnds

#: ``multiprocessing.Connection`` framing of a request (the worker reads with ``recv_bytes``).
_HEADER = struct.Struct("!i")
_LARGEST_REQUEST = 0x7FFFFFFF

#: The main process's ends of every live worker's pipes, of every pool: a forked worker
#: closes them all (holding another worker's lifeline would keep that worker alive after
#: the main process died, and a request pipe, hide its EOF).
_PARENT_FDS: set[int] = set()

#: Shutdown: how long workers get to exit on EOF, then after SIGTERM, then after SIGKILL.
EXIT_ON_EOF_S = 0.5
EXIT_ON_TERM_S = 0.5
EXIT_ON_KILL_S = 1.0


@dataclass
class ChildEnds:
    """The ends a worker process receives (closed in the main process once it started)."""

    requests: Any
    credits: Any
    responses: Any
    lifeline: int


class WorkerProcess:
    """One worker: its process and the main process's ends of its pipes."""

    #: What the pool says after how it died.
    death_advice = (
        "A worker that dies (killed, out of memory, a crash in native code, os._exit) ends the epoch "
        "(unless MultiProcessingReadingService(max_worker_restarts=n) may replace it); shut the loader down "
        "and start again, or resume from its last state_dict()."
    )

    def __init__(self, worker_id: int, ctx: Any, shared_memory: MainEnds) -> None:
        self.worker_id = worker_id
        self.shared_memory = shared_memory
        self.process: Any = None
        self.exitcode: int | None = None  # once stop_all ended it
        self.outgoing: deque[memoryview] = deque()  # request bytes the pipe has not taken yet
        request_reader, self._requests = ctx.Pipe(duplex=False)
        credit_reader, self._credits = ctx.Pipe(duplex=False)
        self._responses, response_writer = ctx.Pipe(duplex=False)
        lifeline_reader, self._lifeline = os.pipe()
        self.child_ends = ChildEnds(request_reader, credit_reader, response_writer, lifeline_reader)
        os.set_blocking(self._requests.fileno(), False)
        os.set_blocking(self._credits.fileno(), False)
        self.frames = FrameReader(self._responses.fileno())
        self._own_fds = self.parent_fds()
        _PARENT_FDS.update(self._own_fds)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def label(self) -> str:
        """How errors name this worker."""
        return f"worker {self.worker_id} (pid {self.process.pid})"

    @property
    def sentinel(self) -> int:
        """Readable once the process has ended."""
        return self.process.sentinel

    @property
    def request_fd(self) -> int:
        return self._requests.fileno()

    @property
    def credit_fd(self) -> int:
        return self._credits.fileno()

    @property
    def response_fd(self) -> int:
        return self._responses.fileno()

    def parent_fds(self) -> list[int]:
        """The main process's ends of this worker's pipes (and of its spill channel)."""
        return [self.request_fd, self.credit_fd, self.response_fd, self._lifeline, *self.shared_memory.main_fds()]

    @staticmethod
    def inherited_under_fork() -> tuple[int, ...]:
        """What a worker forked now must close: every live worker's main-process ends."""
        return tuple(_PARENT_FDS)

    def start(self, ctx: Any, config: WorkerConfig, fork: bool) -> None:
        """Start the process (under ``fork``, from a frozen heap: the child's collector would
        otherwise touch, and so copy, every inherited object)."""
        ends = self.child_ends
        process = ctx.Process(
            target=worker_main,
            # fork shares the graph as it is; other start methods get it pickled by value
            args=(
                config if fork else PickledConfig(dumps(config)),
                ends.requests,
                ends.credits,
                ends.responses,
                self.shared_memory.for_worker(),
                LifelineHandle(ends.lifeline),
            ),
            name=f"conveyor-worker-{self.worker_id}",
            daemon=True,
        )
        freeze = fork and threading.current_thread() is threading.main_thread()
        if not fork:
            # Started on first use inside process.start(), the resource tracker unblocks
            # SIGINT after its own start (it blocks and then unblocks, rather than
            # restoring the mask), so the child that follows would boot unguarded.
            from multiprocessing import resource_tracker

            resource_tracker.ensure_running()
        with _sigint_held():
            if freeze:  # gc.freeze is process-wide: only the main thread may call it
                gc.freeze()
            try:
                process.start()
            finally:
                if freeze:
                    gc.unfreeze()
                self._close_child_ends()
            self.process = process  # before a held Ctrl-C is let through: the pool can end it

    def _close_child_ends(self) -> None:
        ends = self.child_ends
        for connection in (ends.requests, ends.credits, ends.responses):
            connection.close()
        with contextlib.suppress(OSError):
            os.close(ends.lifeline)
        self.shared_memory.handed_over()

    # --- requests ------------------------------------------------------------------------

    def queue(self, message: Any) -> bool:
        """Queue ``message`` for the worker and write what the pipe takes now; whether all
        of it went."""
        body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        if len(body) > _LARGEST_REQUEST:
            raise WorkerError(f"a request to worker {self.worker_id} is larger than 2 GiB; dispatch smaller items")
        self.outgoing.append(memoryview(_HEADER.pack(len(body)) + body))
        return self.flush()

    def flush(self) -> bool:
        """Write queued request bytes without blocking; whether all went. A dead worker's
        pipe refuses them: its death shows through its process sentinel."""
        outgoing = self.outgoing
        while outgoing:
            try:
                written = os.write(self.request_fd, outgoing[0])
            except BlockingIOError:
                return False
            except (BrokenPipeError, OSError, ValueError):
                outgoing.clear()
                return True
            if written == len(outgoing[0]):
                outgoing.popleft()
            else:
                outgoing[0] = outgoing[0][written:]
        return True

    # --- responses -----------------------------------------------------------------------

    @property
    def decode(self) -> Callable[[memoryview], Any]:
        """Reads one of this worker's frames: a :class:`~conveyor.workers.transport.protocol.Chunk`
        (its buffers taken from this worker's shared memory) or another message."""
        return self.shared_memory.decoder.decode_frame

    # --- end -----------------------------------------------------------------------------

    def close_requests(self) -> None:
        """The worker's cue to exit: EOF on its request pipe; its output is no longer read
        (a worker blocked writing to us gets EPIPE and exits)."""
        self.outgoing.clear()
        _PARENT_FDS.difference_update(self._own_fds[:3])  # before the numbers can be reused
        for connection in (self._responses, self._requests, self._credits):
            connection.close()

    def release(self) -> None:
        """After the process ended: the lifeline and the shared memory."""
        _PARENT_FDS.difference_update(self._own_fds)
        with contextlib.suppress(OSError):
            os.close(self._lifeline)
        self.shared_memory.close()

    def describe_death(self) -> str:
        """How the process ended, for an error message."""
        process = self.process
        process.join(1.0)
        code = process.exitcode
        if code is None:
            return "stopped responding"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = "unknown"
            return f"was killed by signal {name} ({-code}; exit code {code})"
        return f"exited with code {code}"


@contextlib.contextmanager
def _sigint_held() -> Iterator[None]:
    """Hold ``SIGINT`` (Ctrl-C, which a terminal sends the whole process group) blocked in
    this thread while it starts a worker process, and let it through after.

    A new process inherits the signal mask of the thread that made it, through ``exec``
    too: under spawn and forkserver, Python's start-up and multiprocessing's bootstrap
    (unpickling, importing the main module) run before the worker's first line can ignore
    ``SIGINT``, and each child a Ctrl-C reached there printed a ``KeyboardInterrupt``
    traceback. Blocked from the start, the signal waits in the child until
    :func:`~conveyor.workers.child.event_loop.worker_main` ignores it (which drops it). A mask
    is no handler: this process's own handling is untouched, and a Ctrl-C that arrives
    while the start runs is delivered to it when the start returns (the pool then ends
    the process it just made). The start is quick, except a first forkserver's import of
    the main module, and under spawn a pickled graph larger than the pipe's buffer,
    which waits for the child's bootstrap to read it.
    """
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def stop_all(workers: Sequence[WorkerProcess]) -> None:
    """End every worker within about two seconds, whatever it is running: EOF on its
    requests (it exits when it next looks), then ``SIGTERM``, then ``SIGKILL``, against one
    deadline; then release what each held."""
    for worker in workers:
        worker.close_requests()
    started = [w.process for w in workers if w.process is not None]
    deadline = time.monotonic()
    for grace, escalate in ((EXIT_ON_EOF_S, None), (EXIT_ON_TERM_S, "terminate"), (EXIT_ON_KILL_S, "kill")):
        alive = [p for p in started if p.exitcode is None]
        if not alive:
            break
        if escalate is not None:
            for process in alive:
                with contextlib.suppress(OSError):
                    getattr(process, escalate)()
        deadline += grace
        for process in alive:
            process.join(max(0.0, deadline - time.monotonic()))
    for worker in workers:
        worker.release()
        if worker.process is not None and worker.process.exitcode is not None:
            worker.exitcode = worker.process.exitcode
            worker.process.close()  # its sentinel pipes go now, not when the pool is collected
