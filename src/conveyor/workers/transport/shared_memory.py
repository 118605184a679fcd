"""How much shared memory a pool's rings take, what backs it, and each worker's ends.

**Budget.** ``MultiProcessingReadingService(shared_memory_budget=...)`` is the bytes all
of a loader's rings may take together, split evenly between the workers (0: no rings).
The default is :data:`RING_BYTES` per worker, capped at :data:`RING_SHARE` (one eighth)
of the memory that actually backs the rings: the smallest memory limit among this
process's cgroups (v2 ``memory.max``, v1 ``memory.limit_in_bytes``), and the system's
``MemAvailable``. A ring's pages are reserved before they are first written (the first
1 MiB when it is made, more as its worker needs them, up to its share of the budget) and
then cannot be swapped out or reclaimed while the loader lives; they sit beside what the
rest of the process needs (the model, the batches the user keeps, the workers' own
items), so they take a modest share: an eighth leaves room for all that, and still gives
each of 8 workers 8 MiB (four chunks of 2 MiB in flight) under a 512 MiB limit.
``/dev/shm``'s size does not bound rings made with ``memfd_create``, so it is not
consulted, except for the ``/dev/shm`` files used where ``memfd_create`` is missing. A
budget larger than half the backing memory is cut to that half: under a memory cgroup
the kernel answers a reservation beyond the limit with its OOM killer, not with an error.

**Fallback.** A ring whose first pages cannot be reserved
(:class:`~conveyor.errors.SharedMemoryError`) is tried again at half the size, down to
:data:`MIN_RING`; later workers start from the size that worked. When no ring can be
had, or the budget had to be cut, the loader warns once
(:class:`~conveyor.errors.SharedMemoryWarning`, naming the cause) and large buffers
travel in files of their own or, where that fails too, through the pipes. A worker whose
ring cannot grow keeps it at the size it has.

**Ends.** For each worker, :meth:`SharedMemory.open` makes its ring and its spill channel
(:mod:`conveyor.workers.transport.spill`): :class:`MainEnds` keeps the main process's side and
builds the worker's :class:`WorkerEnds`, which the worker opens into its encoder.
"""

from __future__ import annotations

import contextlib
import os
import socket
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from conveyor.errors import SharedMemoryError, SharedMemoryWarning
from conveyor.workers.transport.codec import Decoder, Encoder
from conveyor.workers.transport.ring import PAGE, ShmRing
from conveyor.workers.transport.shared_files import SHM_DIR, Fallocate, FdHandle, format_bytes, has_memfd
from conveyor.workers.transport.spill import SpillReceiver, SpillSender, spill_channel

#: Default ring bytes per worker (within the share below).
RING_BYTES = 64 * 1024 * 1024
#: By default all of a loader's rings take at most this fraction of the backing memory.
RING_SHARE = 8
#: Smaller rings are not worth having: buffers then travel in files of their own.
MIN_RING = 1024 * 1024
#: Cgroup v1 writes "no limit" as a huge number (PAGE_COUNTER_MAX pages): at least this.
_NO_LIMIT = 1 << 60
_SLOWER = "large buffers travel in a shared file each or, where that fails too, through pipes (up to ~5x slower)"


@dataclass(frozen=True)
class Backing:
    """The memory that backs shared memory here: ``bytes``, and where that figure comes from."""

    bytes: int
    source: str


def memory_backing(root: Path = Path("/"), memfd: bool | None = None) -> Backing:
    """The smallest of this process's cgroup memory limits and ``MemAvailable`` (and, for
    ``/dev/shm`` files, that filesystem's free space); ``root`` is where ``/proc`` and
    ``/sys`` are looked up (tests give a fake tree)."""
    candidates = [_mem_available(root), *_cgroup_limits(root)]
    if not (has_memfd() if memfd is None else memfd):
        with contextlib.suppress(OSError):
            stats = os.statvfs(root / SHM_DIR.lstrip("/"))
            candidates.append(Backing(stats.f_bavail * stats.f_frsize, f"{SHM_DIR}'s free space"))
    return min((c for c in candidates if c is not None), key=lambda c: c.bytes)


def _read_text(path: Path) -> str:
    """A small file of ``/proc`` or ``/sys``, whole, as ASCII text (``Path.read_text``
    costs ~5x more: a text stream, an encoding lookup; seven of these run before each
    pool's first worker starts). Raises OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("ascii", "replace")


def _mem_available(root: Path) -> Backing:
    fields: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in _read_text(root / "proc/meminfo").splitlines():
            name, _, value = line.partition(":")
            parts = value.split()
            if parts and parts[0].isdigit():
                fields[name] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    for name in ("MemAvailable", "MemTotal"):  # MemAvailable since Linux 3.14
        if name in fields:
            return Backing(fields[name], f"{name} {format_bytes(fields[name])}")
    return Backing(_NO_LIMIT, "no known memory size")


def _cgroup_limits(root: Path) -> list[Backing]:
    """The memory limits set on this process's cgroup and every cgroup above it."""
    try:
        memberships = _read_text(root / "proc/self/cgroup").splitlines()
    except OSError:
        return []
    mounts = _cgroup_mounts(root)
    limits: list[Backing] = []
    for line in memberships:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers and "cgroup2" in mounts:
            limits += _limits_along(root, mounts["cgroup2"], path, "memory.max", "cgroup v2 memory.max")
        elif "memory" in controllers.split(",") and "memory" in mounts:
            limits += _limits_along(root, mounts["memory"], path, "memory.limit_in_bytes", "cgroup v1 memory limit")
    return limits


def _cgroup_mounts(root: Path) -> dict[str, tuple[str, str]]:
    """``{"cgroup2" | "memory": (mount point, the cgroup path mounted there)}``."""
    mounts: dict[str, tuple[str, str]] = {}
    with contextlib.suppress(OSError):
        for line in _read_text(root / "proc/self/mountinfo").splitlines():
            fields = line.split()
            if "-" not in fields:
                continue
            dash = fields.index("-")
            fstype, options = fields[dash + 1], fields[dash + 3] if len(fields) > dash + 3 else ""
            if fstype == "cgroup2":
                mounts.setdefault("cgroup2", (fields[4], fields[3]))
            elif fstype == "cgroup" and "memory" in options.split(","):
                mounts.setdefault("memory", (fields[4], fields[3]))
    if not mounts:  # no mountinfo: the usual places
        mounts = {"cgroup2": ("/sys/fs/cgroup", "/"), "memory": ("/sys/fs/cgroup/memory", "/")}
    return mounts


def _limits_along(root: Path, mount: tuple[str, str], path: str, name: str, label: str) -> list[Backing]:
    """The limits in file ``name`` from the process's cgroup directory up to the mount's top."""
    point, mounted = mount
    top = root / point.lstrip("/")
    inside = path.rstrip("/") + "/"
    mounted = mounted.rstrip("/") + "/"
    parts = [p for p in inside[len(mounted) :].split("/") if p not in ("", ".", "..")]
    if not inside.startswith(mounted):
        parts = []
    if not (top.joinpath(*parts)).is_dir():
        parts = []  # a cgroup namespace seen from outside it: the mount's top is ours
    limits: list[Backing] = []
    while True:
        with contextlib.suppress(OSError, ValueError):
            text = _read_text(top.joinpath(*parts, name)).strip()
            if text != "max" and int(text) < _NO_LIMIT:
                limits.append(Backing(int(text), f"{label} {format_bytes(int(text))}"))
        if not parts:
            return limits
        parts.pop()


@dataclass(frozen=True)
class RingPlan:
    """Each worker's ring size (0: none), and why it is less than asked ('' if it is not)."""

    capacity: int
    cut: str


def plan_rings(num_workers: int, budget: int | None, backing: Backing) -> RingPlan:
    """Split ``budget`` (None: the default, see the module docstring) between
    ``num_workers`` rings within ``backing``."""
    workers = max(1, num_workers)
    cut = ""
    if budget is None:
        total = min(RING_BYTES * workers, backing.bytes // RING_SHARE)
        if total < MIN_RING * workers:
            cut = f"1/{RING_SHARE} of the memory backing them ({backing.source}) leaves under 1 MiB per worker"
    else:
        total = budget
        if budget > backing.bytes // 2:
            total = backing.bytes // 2
            cut = f"shared_memory_budget={budget} is over half of the memory backing it ({backing.source})"
    capacity = total // workers // PAGE * PAGE
    return RingPlan(capacity if capacity >= MIN_RING else 0, cut)


class SharedMemory:
    """A pool's shared memory: ring sizing, each worker's ring and spill channel, and the
    loader's one warning when large buffers must take a slower path."""

    def __init__(
        self, num_workers: int, budget: int | None, root: Path = Path("/"), fallocate: Fallocate | None = None
    ):
        self._fallocate = fallocate  # how rings are reserved (tests inject failures)
        if budget == 0:
            self._plan = RingPlan(0, "")
        elif not has_memfd() and not os.access(root / SHM_DIR.lstrip("/"), os.W_OK):
            self._plan = RingPlan(0, f"this system has neither memfd_create nor a writable {SHM_DIR}")
        else:
            self._plan = plan_rings(num_workers, budget, memory_backing(root))
        self._capacity = self._plan.capacity
        self._warned = False
        if self._plan.cut and self._capacity:
            self.warn(
                f"worker rings are cut to {format_bytes(self._capacity)} each ({self._plan.cut}); "
                "buffers that miss them travel in a shared file each, more slowly"
            )
        elif self._plan.cut:
            self.warn(f"no shared memory for worker rings ({self._plan.cut}); {_SLOWER}")

    @property
    def ring_capacity(self) -> int:
        """The ring size the next worker is given (0: none)."""
        return self._capacity

    def warn(self, what: str) -> None:
        """Warn, once per loader, that large buffers take a slower path: ``what`` says
        which and why."""
        if self._warned:
            return
        self._warned = True
        warnings.warn(
            f"conveyor: {what}. Lower shared_memory_budget or raise the container's memory limit.",
            SharedMemoryWarning,
            stacklevel=2,
        )

    def piped(self, cause: str) -> None:
        """A worker sent a large buffer through its pipe because of ``cause``."""
        self.warn(f"large buffers go through pipes, up to ~5x slower: {cause}")

    def create_ring(self, worker_id: int) -> ShmRing | None:
        """Worker ``worker_id``'s ring at the planned size, or the largest smaller one that
        can be reserved; None (after the one warning) when none can."""
        first_error: SharedMemoryError | None = None
        while self._capacity >= MIN_RING:
            try:
                return ShmRing.create(self._capacity, tag=str(worker_id), fallocate=self._fallocate)
            except SharedMemoryError as error:
                first_error = first_error or error
                self._capacity //= 2
        self._capacity = 0
        if first_error is not None:
            self.warn(f"no shared memory for worker rings: {first_error}; {_SLOWER}")
        return None

    def open(self, worker_id: int) -> MainEnds:
        """Worker ``worker_id``'s ring and spill channel; the caller owns the result."""
        ring = self.create_ring(worker_id)
        try:
            channel = spill_channel()
        except OSError as error:
            channel = None
            self.warn(f"no descriptor channel for worker {worker_id} ({error}); {_SLOWER}")
        return MainEnds(worker_id, ring, channel, self.piped)


class MainEnds:
    """The main process's side of one worker's shared memory: its ring, its spill
    channel, the decoder over them; :meth:`for_worker` is what the worker is started with."""

    def __init__(
        self,
        worker_id: int,
        ring: ShmRing | None,
        channel: tuple[socket.socket, socket.socket] | None,
        notice: Callable[[str], None],
    ):
        self.ring = ring
        self._main_channel: socket.socket | None
        self._worker_channel: socket.socket | None
        self._main_channel, self._worker_channel = channel if channel is not None else (None, None)
        receiver = SpillReceiver(self._main_channel, worker_id) if self._main_channel is not None else None
        self._receiver = receiver
        self.decoder = Decoder(ring, receiver, notice, worker_id)

    def for_worker(self) -> WorkerEnds:
        """The descriptors to start the worker with (before :meth:`handed_over`)."""
        return WorkerEnds(
            self.ring.handle() if self.ring is not None else None,
            FdHandle(self._worker_channel.fileno()) if self._worker_channel is not None else None,
        )

    def main_fds(self) -> tuple[int, ...]:
        """Descriptors of the main process's side that stay open while the worker runs (a
        forked worker closes its inherited copies)."""
        return (self._main_channel.fileno(),) if self._main_channel is not None else ()

    def handed_over(self) -> None:
        """The worker has its own copies: close the main process's copies of its ends."""
        if self.ring is not None:
            self.ring.handed_over()
        worker, self._worker_channel = self._worker_channel, None
        if worker is not None:
            worker.close()

    def close(self) -> None:
        """Release everything (leased and spilled arrays the user holds stay valid)."""
        self.handed_over()
        if self.ring is not None:
            self.ring.close()
        if self._receiver is not None:
            self._receiver.close()


@dataclass(frozen=True)
class WorkerEnds:
    """What a worker is started with: its ring's and its spill channel's descriptors
    (either may be None: no ring, or no way to pass descriptors)."""

    ring: FdHandle | None
    channel: FdHandle | None

    def open(self) -> Encoder:
        """In the worker: map the ring, wrap the channel, and return the encoder over them
        (:meth:`Encoder.close` releases them)."""
        ring = ShmRing.attach(self.ring.fd) if self.ring is not None else None
        spill = SpillSender(socket.socket(fileno=self.channel.fd)) if self.channel is not None else None
        return Encoder(ring, spill)
