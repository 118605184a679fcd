"""Shared files: anonymous shared memory, reserved before it is used, mapped without a
descriptor, and handed to a worker as a descriptor.

The pieces the worker's page ring (:mod:`conveyor.workers.transport.ring`) and its spill files
(:mod:`conveyor.workers.transport.spill`) are made of. A shared file is a ``memfd_create`` file, or
where that is missing a ``/dev/shm`` file that no name outlives (``O_TMPFILE``, or unlinked
the moment it is made), so a killed process leaves nothing behind. Its memory is reserved
(:func:`reserve`) before any page of it is written: a file the system cannot back fails
with :class:`~conveyor.errors.SharedMemoryError` there, never with ``SIGBUS`` in the
middle of a write.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import mmap
import os
import secrets
import sys
from collections.abc import Callable
from multiprocessing import reduction
from typing import Any

import numpy as np

from conveyor.errors import SharedMemoryError
from conveyor.workers.transport.libc import LIBC as _LIBC

SHM_DIR = "/dev/shm"
SHM_PREFIX = "conveyor-"

#: ``fallocate(fd, offset, length)``: how memory is reserved (tests inject a failing one).
Fallocate = Callable[[int, int, int], None]
#: ``memfd_create`` where the system has it (tests clear it to exercise the /dev/shm file).
memfd_create: Callable[[str], int] | None = getattr(os, "memfd_create", None)
_ZEROS = bytes(1 << 20)


def has_memfd() -> bool:
    """Whether shared files come from ``memfd_create`` (bounded by the memory limit only),
    not ``/dev/shm`` files (bounded by that filesystem's size too)."""
    return memfd_create is not None


def anonymous_shared_file(label: str) -> int:
    """A descriptor of shared memory that no path names (``label`` shows in /proc only)."""
    if memfd_create is not None:
        return memfd_create(label)  # close-on-exec, like every descriptor Python makes
    unnamed = getattr(os, "O_TMPFILE", None)
    if unnamed is not None:
        try:  # a file with no name at any instant: a process killed here leaves nothing
            return os.open(SHM_DIR, unnamed | os.O_RDWR, 0o600)
        except OSError as error:
            if error.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                raise
    path = os.path.join(SHM_DIR, f"{SHM_PREFIX}{os.getpid()}-{label}-{secrets.token_hex(4)}")
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.unlink(path)  # named for an instant (a process killed in it leaves the file)
    return fd


def describe_os_error(error: OSError) -> str:
    """``"ENOSPC: No space left on device"``: an error as one short phrase."""
    name = errno.errorcode.get(error.errno or 0, "error")
    return f"{name}: {error.strerror or error}"


def reserve(fd: int, size: int, fallocate: Fallocate | None = None, offset: int = 0) -> None:
    """Back ``size`` bytes of shared file ``fd`` from ``offset`` on with memory now (the
    file grows to cover them), or raise :class:`SharedMemoryError`.

    ``posix_fallocate`` where the system has it; where it is missing or unsupported, the
    bytes are written as zeros, which allocates them just as well. Either way a refusal is
    an error here, not a ``SIGBUS`` when a page is first touched through a mapping. (Under
    a memory cgroup the kernel may answer a reservation beyond the limit with its OOM
    killer instead: that is why ring budgets stay a small share of the limit.)
    """
    fallocate = fallocate if fallocate is not None else getattr(os, "posix_fallocate", None)
    try:
        if fallocate is None:
            _write_zeros(fd, size, offset)
            return
        try:
            fallocate(fd, offset, size)
        except OSError as error:
            if error.errno not in (errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            _write_zeros(fd, size, offset)
    except OSError as error:
        raised = SharedMemoryError(
            f"{format_bytes(size)} of shared memory could not be reserved ({describe_os_error(error)})"
        )
        raised.errno = error.errno
        raise raised from error


def _write_zeros(fd: int, size: int, offset: int) -> None:
    end = offset + size
    while offset < end:
        offset += os.pwrite(fd, memoryview(_ZEROS)[: min(len(_ZEROS), end - offset)], offset)


def format_bytes(count: int) -> str:
    """``"64 MiB"``, ``"1.5 GiB"``, ``"300 B"``: a size for messages."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.3g} {unit}"
    return f"{count} B"


def map_file(fd: int, length: int) -> np.ndarray:
    """The first ``length`` bytes of shared file ``fd`` as a writable uint8 array that owns
    its mapping (unmapped when the array and every view of it are gone) and holds no
    descriptor: ``mmap.mmap`` keeps a duplicate of ``fd`` open as long as it maps (before
    Python 3.13's ``trackfd=False``), so a user keeping many spilled arrays would run out
    of descriptors. Forked children do not inherit the mapping (``MADV_DONTFORK``)."""
    if _LIBC is not None and sys.version_info < (3, 13):
        address = _LIBC.mmap(None, length, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
        if address is None or address == _MAP_FAILED:
            error = ctypes.get_errno()
            raise OSError(error, os.strerror(error))
        pages = _pages_type(length).from_address(address)  # unmaps itself when collected
        if hasattr(mmap, "MADV_DONTFORK"):
            _LIBC.madvise(address, length, mmap.MADV_DONTFORK)
        # typeshed gives ctypes arrays the buffer protocol from Python 3.12 on.
        return np.frombuffer(pages, dtype=np.uint8, count=length)  # type: ignore[call-overload]
    # Python 3.13+ can map without keeping a descriptor; elsewhere one is kept per mapping.
    extra = {"trackfd": False} if sys.version_info >= (3, 13) else {}
    mapping = mmap.mmap(fd, length, **extra)
    if hasattr(mmap, "MADV_DONTFORK"):
        mapping.madvise(mmap.MADV_DONTFORK)
    return np.frombuffer(mapping, dtype=np.uint8, count=length)


_MAP_FAILED = ctypes.c_void_p(-1).value


def _unmap(pages: Any, addressof: Any = ctypes.addressof, sizeof: Any = ctypes.sizeof) -> None:
    # Everything bound at definition: this may run while the interpreter tears modules down.
    pages._munmap(addressof(pages), sizeof(pages))


@functools.lru_cache(maxsize=64)
def _pages_type(length: int) -> type[ctypes.Array[ctypes.c_uint8]]:
    """A ctypes byte array type of ``length`` whose instances unmap their memory when
    collected (one type per length: items of a workload mostly share a few sizes)."""
    return type("SharedPages", (ctypes.c_uint8 * length,), {"__del__": _unmap, "_munmap": _LIBC.munmap})


class FdHandle:
    """A descriptor on its way to a worker (its ring, its spill channel): inherited as is
    under ``fork``, passed along with the process's arguments under ``spawn`` and
    ``forkserver``."""

    __slots__ = ("fd",)

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild_handle, (reduction.DupFd(self.fd),)


def _rebuild_handle(duplicate: Any) -> FdHandle:
    return FdHandle(duplicate.detach())
