"""One run of ``bench_peers.py``: one loader, one workload, in a fresh process started by
the orchestrator with that loader's interpreter (conveyor, torch and the bare bound: the
orchestrator's own; Grain and torchdata.nodes: their venvs under ``benchmarks/.venvs``).

It imports only the standard library, numpy, :mod:`peers_work`, :mod:`child_processes` and
the one loader it runs (conveyor only in a conveyor run). It reads a small warm-up epoch
with a loader of its own (first-call costs: lazy imports, caches), then the timed epoch,
from the loader's creation to the end of its shutdown (its worker processes joined), and
prints one JSON line: wall time, time to the first item, its own CPU (with its reaped
children's) when the loader was created, what each epoch delivered (a
:class:`peers_work.Tally` summary, checked by the orchestrator) and the versions it ran.
It then leaves with ``os._exit``, so that interpreter teardown is not counted in the CPU
the orchestrator measures.

Every loader has 2 worker processes, items unbatched:

- conveyor: ``DataLoader2(IterableWrapper(range(n)).sharding_filter().map(f),
  reading_service=MultiProcessingReadingService(num_workers=2))``, defaults otherwise
  (statistics on); ``shutdown()``.
- torch: ``DataLoader(dataset, batch_size=None, num_workers=2)`` over a map-style
  ``Dataset`` whose ``__getitem__(i)`` is ``f(i)`` (what a torch user writes; the default
  sequential sampler sends each index to a worker); ``batch_size=None`` makes every item
  go through ``default_convert`` (arrays become tensors, turned back into arrays here with
  ``.numpy()``, zero-copy). Its workers end with the epoch; the iterator is then dropped.
- grain: ``MapDataset.source(range(n)).map(f).to_iter_dataset(ReadOptions(num_threads=0))
  .mp_prefetch(MultiprocessingOptions(num_workers=2))``; its iterator's ``close()``. Grain
  starts its workers with ``spawn`` whatever the default.
- nodes: ``Loader(ParallelMapper(IterableWrapper(range(n)), f, num_workers=2,
  method="process"))`` (torchdata 0.11, the default start method: ``fork`` here); it has
  no shutdown call: its workers are joined when the mapper's iterator is collected, so
  the run drops the loader and collects garbage.
- bare (``compute`` only): two processes forked from this one, each computing every
  other item with no per-item message, each sending its tally in one message at the
  end; no first item.

Any worker process still running after the shutdown is ended and counted as ``stray``.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import pickle
import select
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from child_processes import cpu_seconds, end_new_processes
from peers_work import ITEM_FUNCTIONS, WORKLOADS, Tally

LOADERS = ("conveyor", "torch", "grain", "nodes", "bare")
WORKERS = 2
#: Seconds the bare bound's workers may take to send their tallies.
BARE_TIMEOUT_S = 600.0

Opened = tuple[Iterable[Any], Callable[[], None]]


class RunError(RuntimeError):
    """The run cannot be made as asked (a loader that does not apply to the workload, a
    bare worker that failed). Printed as one line; the orchestrator reports the run failed."""


def open_conveyor(fn: Callable[[int], Any], n: int, workload: str) -> Opened:
    from conveyor import DataLoader2, MultiProcessingReadingService
    from conveyor.pipes import IterableWrapper

    service = MultiProcessingReadingService(num_workers=WORKERS)
    loader = DataLoader2(IterableWrapper(range(n)).sharding_filter().map(fn), reading_service=service)
    return loader, loader.shutdown


class _ItemsDataset:
    """The torch side's map-style dataset, without torch (``open_torch`` makes it a
    ``torch.utils.data.Dataset``): item ``i`` is ``fn(i)``."""

    def __init__(self, fn: Callable[[int], Any], n: int) -> None:
        self.fn, self.n = fn, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if not 0 <= i < self.n:
            raise IndexError(f"index {i} out of range({self.n})")
        return self.fn(i)


def _as_arrays(tensors: Iterable[Any]) -> Iterator[Any]:
    for tensor in tensors:
        yield tensor.numpy()


def open_torch(fn: Callable[[int], Any], n: int, workload: str) -> Opened:
    import torch.utils.data

    class ItemsDataset(_ItemsDataset, torch.utils.data.Dataset):
        """A map-style torch dataset: item ``i`` is ``fn(i)``."""

    loader = torch.utils.data.DataLoader(ItemsDataset(fn, n), batch_size=None, num_workers=WORKERS)
    # The iterator ends its workers when the epoch ends; nothing is left to shut down.
    return (_as_arrays(loader) if workload == "arrays" else loader), lambda: None


def open_grain(fn: Callable[[int], Any], n: int, workload: str) -> Opened:
    import grain

    dataset = (
        grain.MapDataset.source(range(n))
        .map(fn)
        .to_iter_dataset(grain.ReadOptions(num_threads=0))
        .mp_prefetch(grain.MultiprocessingOptions(num_workers=WORKERS))
    )
    iterator = iter(dataset)
    return iterator, iterator.close


def open_nodes(fn: Callable[[int], Any], n: int, workload: str) -> Opened:
    from torchdata.nodes import IterableWrapper, Loader, ParallelMapper

    holder = [Loader(ParallelMapper(IterableWrapper(range(n)), map_fn=fn, num_workers=WORKERS, method="process"))]

    def close() -> None:
        holder.clear()  # the mapper's iterator joins its workers when it is collected
        gc.collect()

    return holder[0], close


OPENERS = {"conveyor": open_conveyor, "torch": open_torch, "grain": open_grain, "nodes": open_nodes}


def loader_epoch(loader: str, workload: str, n: int, drop_one: bool) -> dict[str, Any]:
    """One epoch of ``n`` items from a new ``loader``, timed from its creation to the end
    of its shutdown. ``drop_one`` leaves the first item out of the tally (tests only)."""
    tally = Tally(workload, n)
    see = tally.see
    fn = ITEM_FUNCTIONS[workload]
    gc.collect()  # the previous epoch's garbage is not this one's work
    before = set(multiprocessing.active_children())
    close: Callable[[], None] | None = None
    first_s: float | None = None
    cpu_before = cpu_seconds()
    start = time.perf_counter()
    try:
        iterable, close = OPENERS[loader](fn, n, workload)
        iterator = iter(iterable)
        for item in iterator:
            first_s = time.perf_counter() - start
            if not drop_one:
                see(item)
            break
        for item in iterator:
            see(item)
        item = iterator = iterable = None
        shut, close = close, None
        shut()
        stray = end_new_processes(before)
        wall_s = time.perf_counter() - start
    finally:
        if close is not None:  # an error before the shutdown: still end the workers
            close()
        end_new_processes(before)
    return {"wall_s": wall_s, "first_s": first_s, "cpu_before_s": cpu_before, "stray": stray, "tally": tally.summary()}


def _bare_worker(fn: Callable[[int], Any], workload: str, n: int, index: int, out: int) -> None:
    """In a forked child: compute items ``index, index + 2, ...``, send one tally."""
    tally = Tally(workload, n)
    see = tally.see
    for i in range(index, n, WORKERS):
        see(fn(i))
    data = pickle.dumps(tally, protocol=pickle.HIGHEST_PROTOCOL)
    with os.fdopen(out, "wb") as pipe:
        pipe.write(data)


def bare_epoch(loader: str, workload: str, n: int, drop_one: bool) -> dict[str, Any]:
    """The bound: ``WORKERS`` forked processes share the items with no per-item message."""
    if workload != "compute":
        raise RunError(f"the bare bound runs the compute workload only, not {workload!r}")
    fn = ITEM_FUNCTIONS[workload]
    gc.collect()
    cpu_before = cpu_seconds()
    start = time.perf_counter()
    reads: dict[int, bytearray] = {}
    pids: list[int] = []
    received = False
    try:
        for index in range(WORKERS):
            read_end, write_end = os.pipe()
            pid = os.fork()
            if pid == 0:  # the worker: never returns into the caller's code
                code = 1
                try:
                    os.close(read_end)
                    _bare_worker(fn, workload, n, index, write_end)
                    code = 0
                except BaseException:
                    traceback.print_exc()
                finally:
                    os._exit(code)
            pids.append(pid)
            os.close(write_end)
            reads[read_end] = bytearray()
        deadline = time.monotonic() + BARE_TIMEOUT_S
        open_ends = set(reads)
        while open_ends:
            ready, _, _ = select.select(list(open_ends), [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise RunError(f"the bare workers sent no tally within {BARE_TIMEOUT_S:.0f} s")
            for fd in ready:
                chunk = os.read(fd, 1 << 20)
                if chunk:
                    reads[fd] += chunk
                else:
                    open_ends.discard(fd)
        received = True
    finally:
        for fd in reads:
            os.close(fd)
        if not received:  # a worker may still be computing: end it before waiting for it
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
        statuses = [os.waitpid(pid, 0)[1] for pid in pids]  # each has closed its pipe: it is ending
    wall_s = time.perf_counter() - start
    failed = [i for i, status in enumerate(statuses) if status != 0]
    if failed:
        raise RunError(f"bare worker(s) {failed} failed (wait status {[statuses[i] for i in failed]}); see stderr")
    tally = Tally(workload, n)
    for data in reads.values():
        tally.merge(pickle.loads(bytes(data)))
    if drop_one:
        first = next(i for i, c in enumerate(tally.counts) if c)
        tally.counts[first] -= 1
        tally.count -= 1
    return {"wall_s": wall_s, "first_s": None, "cpu_before_s": cpu_before, "stray": 0, "tally": tally.summary()}


def versions(loader: str) -> dict[str, str]:
    """The versions this run used: numpy, and the loader's packages."""
    found = {"python": sys.version.split()[0], "numpy": np.__version__}
    if loader == "conveyor":
        import conveyor

        found["conveyor"] = conveyor.__version__
    elif loader == "torch":
        import torch

        found["torch"] = torch.__version__
    elif loader == "grain":
        import grain

        found["grain"] = grain.__version__
    elif loader == "nodes":
        import torch
        import torchdata

        found["torchdata"] = torchdata.__version__
        found["torch"] = torch.__version__
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="One run of bench_peers.py (started by it).")
    parser.add_argument("--loader", choices=LOADERS, required=True)
    parser.add_argument("--workload", choices=WORKLOADS, required=True)
    parser.add_argument("--items", type=int, required=True)
    parser.add_argument("--warmup-items", type=int, required=True)
    parser.add_argument("--drop-one", action="store_true", help="tests only: leave one item out of the tally")
    options = parser.parse_args(argv)
    epoch = bare_epoch if options.loader == "bare" else loader_epoch
    found = versions(options.loader)  # imports the loader before the clock
    warmup = epoch(options.loader, options.workload, options.warmup_items, False)
    timed = epoch(options.loader, options.workload, options.items, options.drop_one)
    timed.update(loader=options.loader, workload=options.workload, items=options.items, versions=found)
    timed["warmup"] = {"items": options.warmup_items, "tally": warmup["tally"], "stray": warmup["stray"]}
    print(json.dumps(timed), flush=True)
    return 0


if __name__ == "__main__":
    try:
        code = main()
    except RunError as error:
        print(f"peers_runner: {error}", file=sys.stderr, flush=True)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown in the CPU the orchestrator measures
