"""The worker process: set up, then serve requests and send chunks until told to stop.

The loop blocks on its request pipe whenever it cannot produce (no credits, no epoch),
with a timeout only to notice that its parent died; it never sleeps to poll.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import select
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from conveyor.graph import SHARDING_PRIORITIES, apply_sharding
from conveyor.pipes.base import IterDataPipe
from conveyor.waiting import waits_for_upstream
from conveyor.worker_info import WorkerInfo, set_worker_info
from conveyor.workers.dispatch import FeedQueue, Interrupted
from conveyor.workers.protocol import Failure, Feed, Grant, Progress, Ready, StartEpoch, Terminate
from conveyor.workers.state_machine import ResetFn, WorkerStateMachine, failure_message
from conveyor.workers.transport import Encoder, ShmRing

InitFn = Callable[[IterDataPipe, WorkerInfo], IterDataPipe]

#: How often an idle worker checks that its parent is still alive.
PARENT_CHECK_S = 1.0


@dataclass(frozen=True)
class WorkerConfig:
    """What a worker needs to start; picklable for every start method."""

    worker_id: int
    num_workers: int
    graph: IterDataPipe
    ring_name: str | None
    init_fn: InitFn | None
    reset_fn: ResetFn | None
    parent_pid: int  # the main process (under forkserver it is not our parent)
    inherited_fds: tuple[int, ...] = ()  # main-side pipe ends a forked worker must close
    # Linux kills a child when the *thread* that started it ends: only safe to ask for that
    # when the workers were started by the main thread.
    die_with_parent: bool = True


@dataclass(frozen=True)
class PickledConfig:
    """A :class:`WorkerConfig` serialized in the main process, so that lambdas and
    ``__main__`` functions travel by value under ``spawn`` and ``forkserver``."""

    data: bytes


def worker_main(config: WorkerConfig | PickledConfig, requests: Connection, responses: Connection) -> None:
    """Entry point of a worker process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the main process to handle
    ring: ShmRing | None = None
    try:
        if isinstance(config, PickledConfig):
            from conveyor.serialization import loads

            config = loads(config.data)
        if config.die_with_parent:
            _die_with_parent()
        if not _alive(config.parent_pid):
            return  # the main process died before we could ask to die with it
        for fd in config.inherited_fds:
            os.close(fd)  # other workers' pipe ends: holding them would hide their EOFs
        graph = config.graph
        _one_torch_thread()
        _keep_large_allocations()
        info = WorkerInfo(config.num_workers, config.worker_id)
        set_worker_info(info)
        apply_sharding(graph, config.num_workers, config.worker_id, SHARDING_PRIORITIES.MULTIPROCESSING)
        if config.init_fn is not None:
            graph = config.init_fn(graph, info)
            if not isinstance(graph, IterDataPipe):
                raise TypeError(f"worker_init_fn must return an IterDataPipe, got {type(graph).__name__}")
        ring = ShmRing.attach(config.ring_name) if config.ring_name else None
        machine = WorkerStateMachine(graph, info, Encoder(ring), config.reset_fn)
        inbox = _Inbox(requests)
        if machine.feed is not None:
            _connect_feed(machine, inbox, responses, config.parent_pid)
    except BaseException as error:
        worker_id = config.worker_id if isinstance(config, WorkerConfig) else -1
        _send(responses, failure_message(-1, worker_id, error))
        return
    try:
        _send(responses, Ready(config.worker_id, os.getpid()))
        _serve(machine, inbox, responses, config.parent_pid)
    except (BrokenPipeError, EOFError, ConnectionResetError):
        pass  # the main process is gone or closed the pipes: nothing left to serve
    finally:
        machine.close()
        if ring is not None:
            ring.close()


class _Inbox:
    """The request pipe behind one poll object made once (``Connection.poll`` builds a
    selector per call, and the loop polls before every chunk)."""

    def __init__(self, requests: Connection):
        self._requests = requests
        self._poller = select.poll()
        self._poller.register(requests.fileno(), select.POLLIN)

    @waits_for_upstream
    def poll(self, timeout: float) -> bool:
        """Whether a request (or the pipe's end) is waiting, within ``timeout`` seconds."""
        return bool(self._poller.poll(timeout * 1000))

    def recv(self) -> Any:
        return pickle.loads(self._requests.recv_bytes())


def _serve(machine: WorkerStateMachine, requests: _Inbox, responses: Connection, parent_pid: int) -> None:
    while True:
        if machine.can_produce():
            while requests.poll(0):
                if not _handle(machine, requests.recv(), responses):
                    return
            if machine.can_produce():
                for message in machine.produce():
                    _send(responses, message)
            if machine.interruption is not None:
                request, machine.interruption = machine.interruption, None
                if not _handle(machine, request, responses):
                    return
            continue
        if not requests.poll(PARENT_CHECK_S):
            if not _alive(parent_pid):
                return
            continue
        if not _handle(machine, requests.recv(), responses):
            return


def _handle(machine: WorkerStateMachine, request: Any, responses: Connection) -> bool:
    """Apply one request; False when the loop must end."""
    if isinstance(request, Grant):
        machine.grant(request)
    elif isinstance(request, StartEpoch):
        for message in machine.start_epoch(request):
            _send(responses, message)
    elif isinstance(request, Feed):
        if machine.feed is not None:
            machine.feed.add(request)
    elif isinstance(request, Terminate):
        return False
    else:
        _send(responses, Failure(-1, machine.info.worker_id, "ProtocolError", f"unknown request {request!r}", "", None))
    return True


def _connect_feed(machine: WorkerStateMachine, requests: _Inbox, responses: Connection, parent_pid: int) -> None:
    """Dispatch mode: let the pipeline wait for fed items by serving requests meanwhile."""

    def wait(feed: FeedQueue) -> None:
        while not requests.poll(PARENT_CHECK_S):
            if not _alive(parent_pid):
                raise EOFError("the main process is gone")
        request = requests.recv()
        if isinstance(request, Feed):
            feed.add(request)
        elif isinstance(request, Grant):
            machine.grant(request)
        else:  # a new epoch or the end: leave the pipeline, the loop handles it
            machine.interruption = request
            raise Interrupted

    def report(feed: FeedQueue) -> None:
        pending = machine.flush()  # outputs of earlier items go first: the report promises
        if pending is not None:  # that nothing before ``position`` follows it
            _send(responses, pending)
        feed.reported = feed.taken
        _send(responses, Progress(feed.generation, feed.taken, feed.position))

    assert machine.feed is not None
    machine.feed.wait, machine.feed.report = wait, report


def _send(connection: Connection, message: Any) -> None:
    connection.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


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
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None)
        m_trim_threshold, m_mmap_threshold = -1, -3
        libc.mallopt(m_mmap_threshold, 32 * 1024 * 1024)
        libc.mallopt(m_trim_threshold, 256 * 1024 * 1024)
    except (OSError, AttributeError):
        return  # not glibc: its defaults stay, and so does correctness


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, owned by someone else
    return True


def _die_with_parent() -> None:
    """Ask Linux to kill this worker if the main process dies (no orphan on a crash)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):
        return  # the parent-pid check in the loop still ends an orphan within a second
