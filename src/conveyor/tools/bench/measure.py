"""One checked, timed run of one loader on one workload.

What a run measures, and why:

- **wall**: from the loader's creation to its last item *and its shutdown* (workers
  joined). Start-up and shutdown are part of what a loader costs an epoch.
- **first item**: from the loader's creation to its first item: start-up latency (and
  the time to the last item, before the shutdown, to estimate longer runs from short ones).
- **CPU**: user + system CPU of this process and of its joined children over the run
  (``getrusage(RUSAGE_SELF)`` + ``getrusage(RUSAGE_CHILDREN)``): the whole machine cost,
  on both sides of the process boundary. Children count once they are joined, which
  every loader does at shutdown.
- **check**: the workload's check of the items (see ``workloads``); a run whose items
  are wrong raises :class:`~conveyor.tools.bench.errors.CheckFailed` instead of counting, and
  so does a loader that leaves worker processes running after its shutdown (they are
  then ended here, so that no run leaves processes behind).
"""

from __future__ import annotations

import gc
import math
import multiprocessing
import resource
import time
from typing import Any, NamedTuple

from conveyor.tools.bench.errors import CheckFailed
from conveyor.tools.bench.loaders import Loader, Session
from conveyor.tools.bench.workloads import Prepared

#: Seconds to wait for a stray worker process at each step (join, terminate, kill).
STRAY_JOIN_S = 5.0


class Run(NamedTuple):
    """One run's numbers; ``items`` counts samples (the demo's images, not its batches)."""

    wall_s: float
    first_s: float
    last_s: float  # creation to the last item, before the shutdown
    cpu_s: float
    items: int
    fingerprint: str


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and of its joined children so far."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def end_new_processes(before: set[Any]) -> int:
    """Join (then terminate, then kill) the child processes started since ``before`` was
    taken that are still running; return how many there were. ``active_children()`` also
    reaps the children that have exited, so that their CPU time is counted."""
    stray = [p for p in multiprocessing.active_children() if p not in before]
    for process in stray:
        process.join(STRAY_JOIN_S)
    for process in stray:
        if process.is_alive():
            process.terminate()
            process.join(STRAY_JOIN_S)
    for process in stray:
        if process.is_alive():
            process.kill()
            process.join()
    return len(stray)


def measure_once(loader: Loader, prepared: Prepared, workers: int) -> Run:
    """Build ``loader`` over ``prepared`` with ``workers`` workers, read one epoch, shut it
    down, and check the items; raises :class:`CheckFailed` when they are wrong (any error
    of the loader itself propagates). The loader is shut down on every path."""
    check = prepared.checker(loader.key)  # before the clock: it may precompute expected items
    wanted = check.positions
    gc.collect()  # the previous run's garbage is not this run's work
    before = set(multiprocessing.active_children())
    problems: list[str] = []
    session: Session | None = None
    closed = False
    count, first_s, item = 0, math.nan, None
    cpu_start = cpu_seconds()
    start = time.perf_counter()
    try:
        session = loader.open(prepared, workers)
        iterator: Any = iter(session)
        for item in iterator:  # the first item alone, to time it
            first_s = time.perf_counter() - start
            count = 1
            if 0 in wanted:
                check.inspect(0, item)
            break
        for count, item in enumerate(iterator, 2):  # the last item stays in `item`: checked after shutdown
            if count - 1 in wanted:
                check.inspect(count - 1, item)
        last_s = time.perf_counter() - start
        iterator = None
        closed = True  # not retried below if it raises: the stray processes are ended instead
        session.close()
        stray = end_new_processes(before)
        wall_s = time.perf_counter() - start
    finally:
        iterator = None
        try:
            if session is not None and not closed:
                session.close()
        finally:
            end_new_processes(before)
    cpu_s = cpu_seconds() - cpu_start
    if stray:
        problems.append(f"{stray} worker process(es) still running after shutdown")
    verdict = check.finish(count, item)
    del item
    problems.extend(verdict.problems)
    if problems:
        raise CheckFailed("; ".join(problems))
    return Run(wall_s, first_s, last_s, cpu_s, verdict.items, verdict.fingerprint)
