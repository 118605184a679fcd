"""The bare bounds of ``bench_peers.py``: the workers' work with no loader.

Two processes forked from the run's own share the items, and as little crosses back to
the run's process as the workload allows; the harness measures them as any loader's
(the CPU and the summed PSS of the whole process tree):

- :func:`tally_epoch` (``compute``): each worker computes every other item and counts
  it itself, then sends its tally in one message at the end; no first item.
- :func:`shared_epoch` (``arrays``, ``images``): each worker writes its items into
  :data:`SLOTS` slots of its own in an anonymous shared mapping made before the fork.
  A slot holds a batch of :data:`work.compute.BATCH` images, or :data:`ARRAY_CHUNK`
  arrays; worker ``w`` fills the slots of chunks ``w, w + 2, ...``. One byte down a pipe
  says which slot is full; the run's process reads its items from the shared memory
  (each counted and checked as a loader's items are, a batch as one item) and sends one
  byte back: the slot may be filled again. How an item gets into its slot: ``copy``
  makes it the ordinary way (:func:`work.compute.image`, ``np.full``) and copies it once
  into its place (for a batch, that copy is the stacking); ``fill`` writes it in place
  (:func:`work.compute.fill_image`, :func:`work.compute.fill_array`).

Standard library and numpy only: it runs in a run's process, under this interpreter.
"""

from __future__ import annotations

import math
import mmap
import os
import pickle
import select
import signal
import time
import traceback
from collections.abc import Callable

import numpy as np

from conveyor.tools.bench.harness.declare import Context, Epoch, RunError
from conveyor.tools.bench.harness.tally import Tally
from work.compute import (
    ARRAY_ELEMENTS,
    BATCH,
    FILL_FUNCTIONS,
    IMAGE_SHAPE,
    ITEM_FUNCTIONS,
    tally_for,
)

WORKERS = 2
#: Seconds the bare workers may go without the run's process hearing from them.
BARE_TIMEOUT_S = 600.0
#: Slots per worker: one being filled while the run's process reads the other.
SLOTS = 2
#: ``arrays``' items per slot: 4 MiB, what conveyor's workers may have in flight at once.
ARRAY_CHUNK = 4
#: How a shared-memory bound puts an item in its slot.
HOWS = ("copy", "fill")


def _fork(work: Callable[[], None]) -> int:
    """Fork a worker that runs ``work`` and exits: status 0, or 1 after printing what it raised."""
    pid = os.fork()
    if pid == 0:  # the worker: never returns into the caller's code
        code = 1
        try:
            work()
            code = 0
        except BaseException:  # whatever it was, the parent sees the exit status
            traceback.print_exc()
        finally:
            os._exit(code)
    return pid


def _end(pids: list[int], finished: bool) -> None:
    """Wait for the workers (killed first if the epoch did not finish); a failed one fails the run."""
    if not finished:  # a worker may still be working: end it before waiting for it
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
    statuses = [os.waitpid(pid, 0)[1] for pid in pids]
    failed = [i for i, status in enumerate(statuses) if status != 0]
    if failed and finished:
        raise RunError(f"bare worker(s) {failed} failed (wait status {[statuses[i] for i in failed]}); see stderr")


def _wait(fds: list[int], deadline: float) -> list[int]:
    ready, _, _ = select.select(fds, [], [], max(0.0, deadline - time.monotonic()))
    if not ready:
        raise RunError(f"the bare workers sent nothing for {BARE_TIMEOUT_S:.0f} s")
    return ready


# --- compute: each worker's tally at the end --------------------------------------------------


def _tally_worker(context: Context, index: int, out: int) -> None:
    """Compute items ``index, index + 2, ...``, send one tally."""
    tally = tally_for(context.workload.key, context.items)
    see, fn = tally.see, ITEM_FUNCTIONS[context.workload.key]
    for i in range(index, context.items, WORKERS):
        see(fn(i))
    data = pickle.dumps(tally, protocol=pickle.HIGHEST_PROTOCOL)
    with os.fdopen(out, "wb") as pipe:
        pipe.write(data)


def tally_epoch(context: Context) -> Epoch:
    """The bound of ``compute``: the workers share the items with no per-item message."""
    start = time.perf_counter()
    reads: dict[int, bytearray] = {}
    pids: list[int] = []
    received = False
    try:
        for index in range(WORKERS):
            read_end, write_end = os.pipe()
            pids.append(_fork(lambda index=index, write_end=write_end: _tally_worker(context, index, write_end)))
            os.close(write_end)
            reads[read_end] = bytearray()
        deadline = time.monotonic() + BARE_TIMEOUT_S
        open_ends = set(reads)
        while open_ends:
            for fd in _wait(list(open_ends), deadline):
                chunk = os.read(fd, 1 << 20)
                if chunk:
                    reads[fd] += chunk
                else:
                    open_ends.discard(fd)
        received = True
    finally:
        for fd in reads:
            os.close(fd)
        _end(pids, received)
    wall_s = time.perf_counter() - start
    tally = tally_for(context.workload.key, context.items)
    for data in reads.values():
        tally.merge(pickle.loads(bytes(data)))
    return Epoch(wall_s, None, tally)


# --- arrays, images: slots in shared memory ---------------------------------------------------


def _slot_layout(key: str) -> tuple[int, tuple[int, ...], np.dtype]:
    """Items per slot, an item's shape and its dtype."""
    if key == "images":
        return BATCH, IMAGE_SHAPE, np.dtype(np.uint8)
    if key == "arrays":
        return ARRAY_CHUNK, (ARRAY_ELEMENTS,), np.dtype(np.int64)
    raise RunError(f"no shared-memory bound for the {key} workload")


def _shared_worker(context: Context, index: int, slots: list[np.ndarray], ready: int, free: int, how: str) -> None:
    """Fill slots with items of chunks ``index, index + 2, ...``, one byte each on ``ready``;
    wait for a byte on ``free`` when every slot is full."""
    key, n = context.workload.key, context.items
    make, fill = ITEM_FUNCTIONS[key], FILL_FUNCTIONS[key]
    per = len(slots[0])
    idle = list(range(len(slots)))
    for chunk in range(index, -(-n // per), WORKERS):
        if not idle:
            idle.extend(os.read(free, len(slots)))  # blocks until the run's process has read one
            if not idle:
                raise RunError(f"bare worker {index}: the run's process closed its pipe")
        slot = idle.pop(0)
        out = slots[slot]
        first = chunk * per
        if how == "copy":
            for j, i in enumerate(range(first, min(n, first + per))):
                out[j] = make(i)
        else:
            for j, i in enumerate(range(first, min(n, first + per))):
                fill(i, out[j])
        os.write(ready, bytes((slot,)))


def shared_epoch(context: Context, how: str) -> Epoch:
    """The bound of ``arrays`` and ``images``: the workers put their items in shared memory
    (``how``: ``copy`` or ``fill``) and the run's process reads them there."""
    key, n = context.workload.key, context.items
    per, shape, dtype = _slot_layout(key)
    elements = per * math.prod(shape)
    slot_bytes = elements * dtype.itemsize
    tally: Tally = tally_for(key, n)
    see = tally.see
    start = time.perf_counter()
    buffer = mmap.mmap(-1, WORKERS * SLOTS * slot_bytes)  # anonymous, shared with the forked workers
    slots = [
        [
            np.frombuffer(buffer, dtype, elements, (w * SLOTS + s) * slot_bytes).reshape(per, *shape)
            for s in range(SLOTS)
        ]
        for w in range(WORKERS)
    ]
    readies: dict[int, int] = {}  # ready pipe's read end -> worker
    frees: list[int] = []  # the write end of each worker's free pipe
    kept: list[int] = []  # the read ends of the free pipes, open till the end: a late byte never fails
    pids: list[int] = []
    first_s: float | None = None
    finished = False
    try:
        for w in range(WORKERS):
            ready_read, ready_write = os.pipe()
            free_read, free_write = os.pipe()
            kept.append(free_read)
            frees.append(free_write)

            def work(w: int = w, ready: int = ready_write, free: int = free_read) -> None:
                _shared_worker(context, w, slots[w], ready, free, how)

            pids.append(_fork(work))
            os.close(ready_write)
            readies[ready_read] = w
        next_chunk = list(range(WORKERS))
        deadline = time.monotonic() + BARE_TIMEOUT_S
        open_ends = set(readies)
        while open_ends:
            for fd in _wait(list(open_ends), deadline):
                data = os.read(fd, 64)
                if not data:
                    open_ends.discard(fd)
                    continue
                w = readies[fd]
                for slot in data:
                    count = min(per, n - next_chunk[w] * per)
                    next_chunk[w] += WORKERS
                    view = slots[w][slot][:count]
                    if key == "images":
                        see(view)
                    else:
                        for item in view:
                            see(item)
                    if first_s is None:
                        first_s = time.perf_counter() - start
                    os.write(frees[w], bytes((slot,)))
                deadline = time.monotonic() + BARE_TIMEOUT_S
        finished = True
    finally:
        for fd in (*readies, *frees, *kept):
            os.close(fd)
        _end(pids, finished)
    return Epoch(time.perf_counter() - start, first_s, tally)
