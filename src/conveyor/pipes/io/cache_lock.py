"""Who makes a cached file: one process at a time, the others wait for it.

Workers and ranks that share a cache directory would otherwise all download (or
extract) the same missing file at once. Whoever makes the file holds an exclusive
``flock`` on ``<file>.conveyor-lock`` while it does; another process that needs the file
waits for the lock, then finds the file made. The kernel drops the lock of a process that
dies, so a crashed maker never blocks the others: the next one makes the file itself.

``flock`` has no timed wait, so a waiter retries a non-blocking lock with pauses growing
from 5 ms to 100 ms, until its ``timeout``. The lock file is removed by its holder before
it lets go; a waiter that then locks the removed file notices (its inode is no longer the
path's) and tries again.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

from conveyor.errors import CacheTimeoutError

LOCK_SUFFIX = ".conveyor-lock"
FIRST_PAUSE_S = 0.005
LONGEST_PAUSE_S = 0.1


def _lock_if_current(lock_path: str) -> int | None:
    """A descriptor holding the lock of ``lock_path`` as it is now, or None when another
    process holds it."""
    descriptor = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        return None
    try:
        current = os.path.samestat(os.fstat(descriptor), os.stat(lock_path))
    except FileNotFoundError:
        current = False
    if current:
        return descriptor
    os.close(descriptor)  # its holder removed it as we locked it: lock the path's new file
    return _lock_if_current(lock_path)


@contextmanager
def making(path: str, timeout: float, where: str) -> Iterator[None]:
    """Hold the right to make ``path`` for the ``with`` block, waiting up to ``timeout``
    seconds while another process holds it (see the module)."""
    lock_path = path + LOCK_SUFFIX
    os.makedirs(os.path.dirname(os.path.abspath(lock_path)), exist_ok=True)
    deadline = time.monotonic() + timeout
    pause = FIRST_PAUSE_S
    while (descriptor := _lock_if_current(lock_path)) is None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise CacheTimeoutError(
                f"{where}: waited {timeout:g} s for another process to finish making {path!r} (it holds "
                f"{lock_path!r}); pass a longer end_caching(timeout=...) if making it takes longer"
            )
        time.sleep(min(pause, left))
        pause = min(2 * pause, LONGEST_PAUSE_S)
    try:
        yield
    finally:
        os.unlink(lock_path)
        os.close(descriptor)
