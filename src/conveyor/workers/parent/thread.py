"""One thread worker (``worker_type="thread"``) and the main thread's ends of its channels.

A :class:`ThreadWorker` is what :class:`~conveyor.workers.parent.pool.WorkerPool` needs of a worker,
as a :class:`~conveyor.workers.parent.process.WorkerProcess` is for a worker process: the
descriptors it polls (responses, and a *sentinel* that becomes readable when the thread
has ended), requests written without blocking, credits on a pipe of their own (the pool
writes the same records to it), and a bounded stop. The thread runs the worker processes'
own body (:func:`~conveyor.workers.child.event_loop.run_worker`: sharding, ``worker_init_fn``,
the state machine, the loop) on a deep copy of the graph (each worker shards and seeds its
own, as a forked process does), over :mod:`conveyor.workers.transport.thread_channels`: items reach
the merge as the objects the pipeline made, states as snapshots.

What differs from a worker process, and why:

* :func:`~conveyor.get_worker_info` is per thread: each thread worker sees its own id.
* The global RNGs (``random``, numpy's, torch's) are the process's: shared with the user
  and every other thread, so a thread worker leaves them alone (a worker process seeds
  them per worker and epoch). Conveyor's random ops draw from keyed streams of their own
  and are unaffected: output stays identical to worker processes'.
* Process-wide settings are left alone: torch's thread count, glibc's allocation
  thresholds, signal handlers.
* A thread cannot be killed. :func:`stop_threads` closes every worker's requests (its cue
  to exit at its next look, within one chunk: a few milliseconds) and waits
  :data:`EXIT_ON_EOF_S` in all; a thread still inside a user call then is left to end on
  its own, holding only its own graph copy and pass: the main thread's ends are closed,
  so its next send fails and it ends. It is a daemon thread: the interpreter's exit does
  not wait for it.
"""

from __future__ import annotations

import contextlib
import copy
import os
import pickle
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from conveyor.core.worker_info import WorkerInfo, set_thread_worker_info
from conveyor.workers.child.event_loop import Channels, WorkerConfig, report_start_failure, run_worker
from conveyor.workers.transport.protocol import Feed, StartEpoch
from conveyor.workers.transport.remote_errors import MAX_MESSAGE_CHARS
from conveyor.workers.transport.thread_channels import HandOff, RequestQueue, ResponseQueue

#: Shutdown: how long thread workers get, in all, to end after their requests close.
EXIT_ON_EOF_S = 0.5


class ThreadWorker:
    """One thread worker: its thread and the main thread's ends of its channels."""

    #: What the pool says after how it ended.
    death_advice = (
        "A thread worker ends only when it fails to start or its pipeline raises a BaseException that is "
        "not an Exception (sys.exit(), KeyboardInterrupt): that ends the epoch; shut the loader down and "
        "start again, or resume from its last state_dict()."
    )

    def __init__(self, worker_id: int) -> None:
        self.worker_id = worker_id
        self.requests = RequestQueue()
        self.frames = ResponseQueue()  # what the pool reads, as a worker process's frames
        self._credit_reader, self._credits = os.pipe()
        os.set_blocking(self._credits, False)
        self._sentinel, self._sentinel_writer = os.pipe()
        self.thread: threading.Thread | None = None
        self.ended_by: str | None = None  # what ended the thread, when not the pool's close
        self.failed_to_start = False

    @property
    def pid(self) -> int:
        """The process the thread runs in: this one."""
        return os.getpid()

    @property
    def label(self) -> str:
        """How errors name this worker."""
        return f"thread worker {self.worker_id}"

    @property
    def response_fd(self) -> int:
        return self.frames.fd

    @property
    def credit_fd(self) -> int:
        return self._credits

    @property
    def sentinel(self) -> int:
        """Readable once the thread has ended."""
        return self._sentinel

    def start(self, config: WorkerConfig) -> None:
        """Start the thread (a daemon: the interpreter's exit does not wait for it)."""
        thread = threading.Thread(
            target=_thread_main, args=(config, self), name=f"conveyor-thread-worker-{self.worker_id}", daemon=True
        )
        thread.start()
        self.thread = thread

    # --- requests ------------------------------------------------------------------------

    def queue(self, message: Any) -> bool:
        """Hand ``message`` to the worker (never blocks; always all of it). States go as
        snapshots, as a worker process gets them pickled: an epoch's start (the worker's
        pass may change the resume state it opens from, which the main thread keeps), and
        each dispatched item's upstream state (the dispatcher's pass goes on); dispatched
        items go as they are."""
        if isinstance(message, StartEpoch):
            message = _snapshot(message)
        elif isinstance(message, Feed) and message.entries:
            states = _snapshot([state for _, _, state in message.entries])
            entries = [
                (item, position, state) for (item, position, _), state in zip(message.entries, states, strict=True)
            ]
            message = Feed(message.generation, entries, message.end, message.channel)
        self.requests.put(message)
        return True

    def flush(self) -> bool:
        """Nothing is ever held back."""
        return True

    # --- responses -----------------------------------------------------------------------

    @staticmethod
    def decode(message: Any) -> Any:
        """A message as the merge reads it: as it was sent (nothing was encoded)."""
        return message

    def describe_death(self) -> str:
        """How the thread ended, for an error message."""
        if self.ended_by:
            return f"ended: {self.ended_by} escaped its pipeline"
        return "ended when it failed to start" if self.failed_to_start else "ended"

    # --- end -----------------------------------------------------------------------------

    def close_requests(self) -> None:
        """The worker's cue to end, at its next look."""
        self.requests.close()

    def release(self) -> None:
        """The main thread's ends: responses are no longer read, credits no longer written."""
        self.requests.close()
        self.frames.close()
        for fd in (self._credits, self._sentinel):
            with contextlib.suppress(OSError):
                os.close(fd)


def _snapshot(value: Any) -> Any:
    """A deep copy of plain data (states, seeds): pickled, as a worker process receives it."""
    return pickle.loads(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


def _thread_main(config: WorkerConfig, worker: ThreadWorker) -> None:
    """The thread's body: its own copy of the graph, then the worker processes' body."""
    send = worker.frames.send
    try:
        try:
            set_thread_worker_info(WorkerInfo(config.num_workers, config.worker_id))
            config = replace(config, graph=copy.deepcopy(config.graph))
        except Exception as error:  # a graph that does not copy: the pool raises it
            worker.failed_to_start = True
            report_start_failure(send, config.worker_id, error)
            return
        channels = Channels(worker.requests.fd, worker._credit_reader, worker.requests.recv, send)
        worker.failed_to_start = not run_worker(config, HandOff, channels, thread_worker=True)
    except BaseException as error:  # the pool raises it as this worker's end (death_error)
        worker.ended_by = f"{type(error).__name__}: {error}"[:MAX_MESSAGE_CHARS]
    finally:
        set_thread_worker_info(None)
        worker.requests.close_worker_end()
        worker.frames.close_worker_end()
        with contextlib.suppress(OSError):
            os.close(worker._credit_reader)
        with contextlib.suppress(OSError):
            os.write(worker._sentinel_writer, b"\0")
        with contextlib.suppress(OSError):
            os.close(worker._sentinel_writer)


def stop_threads(workers: Sequence[ThreadWorker]) -> None:
    """End every thread worker within :data:`EXIT_ON_EOF_S` in all: close their requests
    (each ends at its next look), wait for them against one deadline, then close the main
    thread's ends. A thread still inside a user call is left to end on its own."""
    for worker in workers:
        worker.close_requests()
    deadline = time.monotonic() + EXIT_ON_EOF_S
    current = threading.current_thread()
    for worker in workers:
        if worker.thread is not None and worker.thread is not current:
            worker.thread.join(max(0.0, deadline - time.monotonic()))
    for worker in workers:
        worker.release()
