"""The C library functions conveyor calls through ``ctypes``, resolved once, on import.

conveyor is imported in the main process before any worker is forked, so a forked worker
finds these already resolved: resolving them in a worker (``CDLL``, a symbol lookup, a
function object) cost 0.2-0.3 ms of its start-up, before its first item, against ~0.02 ms
in the main process, whose memory is not yet copied on write.

:data:`LIBC` is None where there is no usable C library of the kind these need (not
Linux, or no glibc-like symbols); every caller has a way without it.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any


def _load() -> Any:
    """The C library with the signatures conveyor uses (``mmap``, ``munmap``, ``madvise``;
    ``prctl`` and ``mallopt`` are looked up once, where they exist), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        int_ = ctypes.c_int
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, int_, int_, int_, ctypes.c_int64]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, int_]
    except (OSError, AttributeError):
        return None  # no usable libc: each caller's fallback
    for optional in ("prctl", "mallopt"):  # looked up now: a worker only calls them
        try:
            getattr(libc, optional)
        except AttributeError:
            setattr(libc, optional, None)
    return libc


LIBC = _load()
