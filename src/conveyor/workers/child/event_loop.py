"""The worker process: set up, then serve requests and send chunks until told to stop.

The loop blocks on its request pipe whenever it cannot produce (no credits, no epoch); it
never sleeps to poll. EOF on the request pipe (the main process closed it, or died) ends
the loop. The lifeline (:mod:`conveyor.workers.child.lifeline`) ends the process when the main
process dies, whatever the pipeline is doing (a stage stuck in a long call would never
look at the requests, and one that holds the GIL lets no thread of ours run).

:func:`run_worker`, the set-up and the loop, is also the body of a thread worker
(:mod:`conveyor.workers.parent.thread`), over the channels it has in place of pipes.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import os
import pickle
import select
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from conveyor.core.base import IterDataPipe
from conveyor.core.graph import SHARDING_PRIORITIES, apply_sharding
from conveyor.core.shared_arrays import install_allocator
from conveyor.core.stage_marks import waits_for_upstream
from conveyor.core.worker_info import WorkerInfo, set_worker_info
from conveyor.workers.child.dispatch import FeedQueue, Interrupted
from conveyor.workers.child.lifeline import die_with_parent, lifeline_cut, process_exists, watch_lifeline
from conveyor.workers.child.state_machine import ResetFn, WorkerStateMachine, failure_message
from conveyor.workers.transport.codec import EncodedFrame, Encoder
from conveyor.workers.transport.frame import message_parts
from conveyor.workers.transport.framing import write_frame
from conveyor.workers.transport.libc import LIBC
from conveyor.workers.transport.protocol import (
    CREDIT_RECORD,
    Failure,
    Feed,
    Progress,
    Ready,
    StartEpoch,
    count_credits,
)
from conveyor.workers.transport.shared_memory import WorkerEnds

if TYPE_CHECKING:
    from conveyor.workers.transport.thread_channels import HandOff

InitFn = Callable[[IterDataPipe, WorkerInfo], IterDataPipe]

#: How long an idle worker waits for a request before looking again (its lifeline, not
#: this, notices a dead parent: this only bounds each wait).
IDLE_WAIT_S = 1.0


@dataclass(frozen=True)
class WorkerConfig:
    """What a worker needs to start; picklable for every start method."""

    worker_id: int
    num_workers: int
    graph: IterDataPipe
    init_fn: InitFn | None
    reset_fn: ResetFn | None
    parent_pid: int  # the main process (under forkserver it is not our parent)
    inherited_fds: tuple[int, ...] = ()  # main-side pipe ends a forked worker must close
    # Linux kills a child when the *thread* that started it ends: only safe to ask for that
    # when the workers were started by the main thread (the lifeline covers every case).
    die_with_parent: bool = True


@dataclass(frozen=True)
class PickledConfig:
    """A :class:`WorkerConfig` serialized in the main process, so that lambdas and
    ``__main__`` functions travel by value under ``spawn`` and ``forkserver``."""

    data: bytes


def worker_main(
    config: WorkerConfig | PickledConfig,
    requests: Connection,
    credits: Connection,
    responses: Connection,
    shared_memory: WorkerEnds | None = None,
    lifeline: Any = None,
) -> None:
    """Entry point of a worker process; ``shared_memory`` holds its ring's and spill
    channel's descriptors, ``lifeline`` the read end of the pipe that tells it the main
    process died."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the main process to handle
    if hasattr(signal, "pthread_sigmask"):
        # The main process started this one with SIGINT blocked, so that a Ctrl-C during
        # the start-up before this point waited (process._sigint_held); ignored now, it
        # may pass (a pending one is dropped), as it would for what this process starts.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    # Forked from inside a pull that statistics were timing, this thread would go on with
    # the main process's trace function: not this process's, whoever set it.
    sys.settrace(None)
    sys.setprofile(None)
    send = FrameSender(responses.fileno())
    try:
        if lifeline is not None:  # first: unpickling the graph runs user code, which may hold the GIL
            watch_lifeline(lifeline.fd)
        if isinstance(config, PickledConfig):
            from conveyor.core.serialization import loads

            config = loads(config.data)
        assert isinstance(config, WorkerConfig)
        for fd in config.inherited_fds:
            os.close(fd)  # the main process's pipe ends: holding them would hide EOFs
        if config.die_with_parent:
            die_with_parent()
        gone = lifeline_cut(lifeline.fd) if lifeline is not None else not process_exists(config.parent_pid)
        if gone:
            return  # the main process died while we started
        _one_torch_thread()
        _keep_large_allocations()
        set_worker_info(WorkerInfo(config.num_workers, config.worker_id))
        send.worker_id = config.worker_id
    except BaseException as error:
        report_start_failure(send, config.worker_id if isinstance(config, WorkerConfig) else -1, error)
        return
    open_encoder = shared_memory.open if shared_memory is not None else functools.partial(Encoder, None)
    run_worker(config, open_encoder, Channels(requests.fileno(), credits.fileno(), lambda: _receive(requests), send))
    # Served: exit now, as a forked worker always does. Under spawn and forkserver the
    # interpreter's teardown (every module, every object) took ~70 ms a worker, and
    # shutdown() waits for it.
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed or broken stream: nothing to flush
            stream.flush()
    os._exit(0)


@dataclass(frozen=True)
class Channels:
    """How a worker talks to the main process: the descriptors it polls for requests and
    for credits, how it takes the request waiting, and how it sends a response."""

    request_fd: int
    credit_fd: int
    receive: Callable[[], Any]
    send: Callable[[Any], None]


def run_worker(
    config: WorkerConfig,
    open_encoder: Callable[[], Encoder | HandOff],
    channels: Channels,
    thread_worker: bool = False,
) -> bool:
    """Set up the worker's graph (sharding, ``worker_init_fn``) and serve requests until
    the main process closes them: the body of a worker process and of a thread worker. A
    failure to set up is sent as a start-up :class:`Failure` (and False returned)."""
    encoder: Encoder | HandOff | None = None
    try:
        graph = config.graph
        info = WorkerInfo(config.num_workers, config.worker_id)
        apply_sharding(graph, config.num_workers, config.worker_id, SHARDING_PRIORITIES.MULTIPROCESSING)
        if config.init_fn is not None:
            graph = config.init_fn(graph, info)
            if not isinstance(graph, IterDataPipe):
                raise TypeError(f"worker_init_fn must return an IterDataPipe, got {type(graph).__name__}")
        encoder = open_encoder()
        if isinstance(encoder, Encoder):  # a worker process: big arrays it makes go in its ring
            install_allocator(encoder.allocate)
        # An init function that seeds the global RNGs by a scheme of its own says how, for
        # each epoch: seed_epoch(base_seed, worker_id) (conveyor.DataLoader: torch's scheme).
        machine = WorkerStateMachine(
            graph,
            info,
            encoder,
            config.reset_fn,
            thread_worker=thread_worker,
            seed_epoch=getattr(config.init_fn, "seed_epoch", None),
        )
        inbox = Inbox(channels.request_fd, channels.credit_fd, channels.receive, machine)
        if machine.feeds:
            _connect_feeds(machine, inbox, channels.send)
    except BaseException as error:
        report_start_failure(channels.send, config.worker_id, error)
        install_allocator(None)
        if encoder is not None:
            encoder.close()
        return False
    try:
        channels.send(Ready(config.worker_id, os.getpid()))
        _serve(machine, inbox, channels.send)
    except (BrokenPipeError, EOFError, ConnectionResetError, OSError):
        pass  # the main process is gone or closed the pipes: nothing left to serve
    finally:
        machine.close()
        install_allocator(None)
        encoder.close()
    return True


def report_start_failure(send: Callable[[Any], None], worker_id: int, error: BaseException) -> None:
    """Tell the main process that the worker could not start, and why."""
    # The main process may have closed the pool already (another worker failed first):
    # then there is no one left to tell.
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        send(failure_message(-1, worker_id, error))


class Inbox:
    """A worker's two inbound channels behind one poll object made once (``Connection.poll``
    builds a selector per call, and the loop polls before every chunk): requests, and
    the credits that the main process writes as raw records (see
    :data:`~conveyor.workers.transport.protocol.CREDIT_RECORD`). Credits are handed to the state
    machine as soon as a poll sees them; requests wait for :meth:`recv`."""

    def __init__(self, request_fd: int, credit_fd: int, receive: Callable[[], Any], machine: WorkerStateMachine):
        self._receive = receive
        self._credit_fd = credit_fd
        self._machine = machine
        self._partial = b""  # the start of a record a read split (never, with atomic writes)
        self._poller = select.poll()
        self._poller.register(request_fd, select.POLLIN)
        self._poller.register(credit_fd, select.POLLIN)

    @waits_for_upstream
    def _wait(self, timeout: float) -> list[tuple[int, int]]:
        return self._poller.poll(timeout * 1000)

    def poll(self, timeout: float) -> Arrival:
        """Wait up to ``timeout`` seconds for a request or credits."""
        arrival = Arrival.NOTHING
        for fd, _ in self._wait(timeout):
            if fd == self._credit_fd:
                self._take_credits()
                arrival = Arrival.CREDITS if arrival is Arrival.NOTHING else arrival
            else:
                arrival = Arrival.REQUEST  # a request, or the pipe's end: recv() tells
        return arrival

    def _take_credits(self) -> None:
        data = os.read(self._credit_fd, CREDIT_RECORD.size * 1024)
        if not data:
            raise EOFError("the main process closed the credit pipe")
        data = self._partial + data
        whole = len(data) - len(data) % CREDIT_RECORD.size
        self._partial = data[whole:]
        credits = count_credits(data[:whole], self._machine.generation)
        if credits:
            self._machine.grant(credits)

    def recv(self) -> Any:
        """The request waiting (raises EOFError when the main process closed them)."""
        return self._receive()


def _receive(requests: Connection) -> Any:
    return pickle.loads(requests.recv_bytes())


class Arrival(enum.Enum):
    """What :meth:`Inbox.poll` saw."""

    NOTHING = "nothing"
    CREDITS = "credits"  # only credits, already granted
    REQUEST = "request"  # a request waits (credits may have come too)


def _serve(machine: WorkerStateMachine, inbox: Inbox, send: Callable[[Any], None]) -> None:
    while True:
        if machine.can_produce():
            while inbox.poll(0) is Arrival.REQUEST:
                if not _handle(machine, inbox.recv(), send):
                    return
            if machine.can_produce():
                for message in machine.produce():
                    send(message)
            if machine.interruption is not None:
                request, machine.interruption = machine.interruption, None
                if not _handle(machine, request, send):
                    return
            continue
        arrival = inbox.poll(IDLE_WAIT_S)
        if arrival is Arrival.NOTHING:
            machine.idle()  # a second without work: free what is kept for reuse
        elif arrival is Arrival.REQUEST and not _handle(machine, inbox.recv(), send):
            return


def _handle(machine: WorkerStateMachine, request: Any, send: Callable[[Any], None]) -> bool:
    """Apply one request; False when the loop must end."""
    if isinstance(request, StartEpoch):
        for message in machine.start_epoch(request):
            send(message)
    elif isinstance(request, Feed):
        if request.channel < len(machine.feeds):
            machine.feeds[request.channel].add(request)
    else:
        send(Failure(-1, machine.info.worker_id, "ProtocolError", f"unknown request {request!r}", "", None))
    return True


def _connect_feeds(machine: WorkerStateMachine, inbox: Inbox, send: Callable[[Any], None]) -> None:
    """Dispatch mode: let the pipeline wait for fed items by serving requests meanwhile."""

    def wait(feed: FeedQueue) -> None:
        while (arrival := inbox.poll(IDLE_WAIT_S)) is Arrival.NOTHING:
            pass  # a dead main process ends this process through the watchdog
        if arrival is Arrival.CREDITS:
            return  # granted: the pipeline may go on to send what it has
        request = inbox.recv()
        if isinstance(request, Feed):
            if request.channel < len(machine.feeds):
                machine.feeds[request.channel].add(request)  # this channel's, or another's
        else:  # a new epoch or the end: leave the pipeline, the loop handles it
            machine.interruption = request
            raise Interrupted

    def report(feed: FeedQueue) -> None:
        pending = machine.flush()  # outputs of earlier items go first: the report promises
        if pending is not None:  # that nothing before ``position`` follows it
            send(pending)
        feed.reported = feed.taken
        send(Progress(feed.generation, feed.taken, feed.position, feed.channel))

    for feed in machine.feeds:
        feed.wait, feed.report = wait, report


class FrameSender:
    """Writes a worker process's responses to its response pipe, one frame each: a
    chunk's frame as the encoder laid it out, any other message pickled whole (see
    :mod:`conveyor.workers.transport.frame`)."""

    def __init__(self, fd: int):
        self._fd = fd
        self.worker_id = -1  # until the worker's configuration is read

    def __call__(self, message: Any) -> None:
        if type(message) is EncodedFrame:
            write_frame(self._fd, *message.parts)
        else:
            write_frame(self._fd, *message_parts(message, self.worker_id))


def _one_torch_thread() -> None:
    """Workers run side by side: torch's intra-op threads in each would fight for the same
    cores (torch's own DataLoader workers do the same)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


def _keep_large_allocations() -> None:
    """Let glibc reuse freed large blocks instead of unmapping them.

    A worker builds item after item of the same size; by default each block over the
    (dynamic) mmap threshold is a fresh mapping, so every item pays a page fault per 4 KiB
    and the kernel's zeroing. Whether it does depends on what the main process freed
    before it forked: fixing the thresholds makes workers fast every time.
    """
    mallopt = getattr(LIBC, "mallopt", None)  # resolved in the main process, before the fork
    if mallopt is None:
        return  # not glibc: its defaults stay, and so does correctness
    m_trim_threshold, m_mmap_threshold = -1, -3
    mallopt(m_mmap_threshold, 32 * 1024 * 1024)
    mallopt(m_trim_threshold, 256 * 1024 * 1024)
