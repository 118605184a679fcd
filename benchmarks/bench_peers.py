"""conveyor against its peers, each with 2 worker processes, on issue 18's three workloads:
torch's ``DataLoader``, Grain (``MapDataset ... mp_prefetch``), torchdata.nodes
(``ParallelMapper(method="process")`` in a ``Loader``), and, for ``compute``, the bound
of two bare forked processes doing the work with no per-item messages.

    bash benchmarks/peer_envs.sh     # once: Grain's and torchdata.nodes' venvs
    python benchmarks/bench_peers.py [--workloads small,arrays,compute]
        [--loaders bare,conveyor,torch,grain,nodes] [--repeats 3] [--quick] [--require-peers]
        [--compute-us 200] [--save | --out PATH]

Workloads (:mod:`work.compute`; items unbatched, made in the workers):

- ``small``: 200,000 ints, ``f(i) = i + 1``;
- ``arrays``: 2,000 new 1 MiB int64 arrays (``np.full(131072, i)``);
- ``compute``: 20,000 items of a fixed numpy op (FFT filtering of a signal sized here
  for ~200 µs of CPU, the issue's item: ``--compute-us``; its cost is measured and
  printed), each giving ``(i, float)``.

Loaders, each with 2 worker processes, items unbatched:

- conveyor: ``DataLoader2(IterableWrapper(range(n)).sharding_filter().map(f),
  reading_service=MultiProcessingReadingService(num_workers=2))``, defaults otherwise
  (statistics on); ``shutdown()``.
- torch: ``DataLoader(dataset, batch_size=None, num_workers=2)`` over a map-style
  ``Dataset`` whose ``__getitem__(i)`` is ``f(i)`` (what a torch user writes; the default
  sequential sampler sends each index to a worker); ``batch_size=None`` makes every item
  go through ``default_convert`` (arrays become tensors, turned back into arrays with
  ``.numpy()``, zero-copy). Its workers end with the epoch; the iterator is then dropped.
- grain: ``MapDataset.source(range(n)).map(f).to_iter_dataset(ReadOptions(num_threads=0))
  .mp_prefetch(MultiprocessingOptions(num_workers=2))``; its iterator's ``close()``. Grain
  starts its workers with ``spawn`` whatever the default.
- nodes: ``Loader(ParallelMapper(IterableWrapper(range(n)), f, num_workers=2,
  method="process"))`` (torchdata 0.11, the default start method); it has no shutdown
  call: its workers are joined when the mapper's iterator is collected, so the run drops
  the loader and collects garbage.
- bare (``compute`` only): two processes forked from the run's, each computing every
  other item with no per-item message, each sending its tally in one message at the
  end; no first item.

conveyor, torch and the bare bound run under this interpreter; Grain and torchdata.nodes
under the venvs ``peer_envs.sh`` makes in ``benchmarks/.venvs``, which hold numpy at the
same version. A peer whose venv is missing is a row saying so (exit 2 instead with
``--require-peers``). How every run is measured and checked: :mod:`harness`.
"""

from __future__ import annotations

import argparse
import gc
import os
import pickle
import select
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from harness import cli
from harness.declare import Context, Epoch, Loader, Opened, RunError, Suite, Workload
from harness.results import Result
from work.compute import COMPUTE_SIZE, ITEM_FUNCTIONS, expected_checksum, size_children_for, tally_for

WORKERS = 2
#: Seconds the bare bound's workers may take to send their tallies.
BARE_TIMEOUT_S = 600.0
#: Issue 18's targets on conveyor's items/s against torch's, per workload.
TORCH_TARGETS = {"small": 30.0, "arrays": 20.0}
#: Issue 18's targets against the bare bound (compute): share of its items/s, CPU ratio.
BARE_RATE_TARGET, BARE_CPU_TARGET = 0.90, 1.10


# --- the loaders (in a run's process) ---------------------------------------------------------


def item_function(context: Context) -> Callable[[int], Any]:
    return ITEM_FUNCTIONS[context.workload.key]


def open_conveyor(context: Context) -> Opened:
    from conveyor import DataLoader2, MultiProcessingReadingService
    from conveyor.pipes import IterableWrapper

    pipe = IterableWrapper(range(context.items)).sharding_filter().map(item_function(context))
    loader = DataLoader2(pipe, reading_service=MultiProcessingReadingService(num_workers=WORKERS))
    return Opened(loader, loader.shutdown)


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


def open_torch(context: Context) -> Opened:
    import torch.utils.data

    class ItemsDataset(_ItemsDataset, torch.utils.data.Dataset):
        """A map-style torch dataset: item ``i`` is ``fn(i)``."""

    dataset = ItemsDataset(item_function(context), context.items)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=WORKERS)
    # The iterator ends its workers when the epoch ends; nothing is left to shut down.
    return Opened(_as_arrays(loader) if context.workload.key == "arrays" else loader, lambda: None)


def open_grain(context: Context) -> Opened:
    import grain

    dataset = (
        grain.MapDataset.source(range(context.items))
        .map(item_function(context))
        .to_iter_dataset(grain.ReadOptions(num_threads=0))
        .mp_prefetch(grain.MultiprocessingOptions(num_workers=WORKERS))
    )
    iterator = iter(dataset)
    return Opened(iterator, iterator.close)


def open_nodes(context: Context) -> Opened:
    from torchdata.nodes import IterableWrapper, Loader, ParallelMapper

    mapper = ParallelMapper(
        IterableWrapper(range(context.items)), map_fn=item_function(context), num_workers=WORKERS, method="process"
    )
    holder = [Loader(mapper)]

    def close() -> None:
        holder.clear()  # the mapper's iterator joins its workers when it is collected
        gc.collect()

    return Opened(holder[0], close)


def _bare_worker(context: Context, index: int, out: int) -> None:
    """In a forked child: compute items ``index, index + 2, ...``, send one tally."""
    tally = tally_for(context.workload.key, context.items)
    see, fn = tally.see, item_function(context)
    for i in range(index, context.items, WORKERS):
        see(fn(i))
    data = pickle.dumps(tally, protocol=pickle.HIGHEST_PROTOCOL)
    with os.fdopen(out, "wb") as pipe:
        pipe.write(data)


def bare_epoch(context: Context) -> Epoch:
    """The bound: ``WORKERS`` forked processes share the items with no per-item message."""
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
                    _bare_worker(context, index, write_end)
                    code = 0
                except BaseException:  # whatever it was, the parent sees the exit status
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
    tally = tally_for(context.workload.key, context.items)
    for data in reads.values():
        tally.merge(pickle.loads(bytes(data)))
    return Epoch(wall_s, None, tally)


# --- the workloads --------------------------------------------------------------------------


def tally(context: Context) -> Any:
    return tally_for(context.workload.key, context.items)


def checksum(context: Context) -> float | int:
    """The checksum of an epoch; ``compute``'s computes every item here, which measures
    the op's cost: printed."""
    key, n = context.workload.key, context.items
    size = context.settings.get("compute_size", COMPUTE_SIZE)
    started = time.process_time()
    found = expected_checksum(key, n, size)
    if key == "compute" and not context.warmup:
        op_us = (time.process_time() - started) / n * 1e6
        print(
            f"compute op: {op_us:,.1f} µs of CPU per item ({size:,} samples), measured over {n:,} items "
            f"in this process (numpy {np.__version__})"
        )
    return found


def warmup(items: int) -> int:
    return max(8, items // 50)


WORKLOADS = (
    Workload("small", 200_000, 4_000, "ints, f(i) = i + 1", tally, checksum, warmup=warmup),
    Workload(
        "arrays",
        2_000,
        40,
        "new 1 MiB int64 arrays, np.full(131072, i), made in the worker",
        tally,
        checksum,
        warmup=warmup,
    ),
    Workload(
        "compute",
        20_000,
        400,
        "(i, x): x from numpy work sized for ~200 µs per item, in the worker",
        tally,
        checksum,
        warmup=warmup,
    ),
)
LOADERS = (  # the order of the runs in each round
    Loader("bare", "bare bound: 2 forked processes", epoch=bare_epoch, workloads=("compute",)),
    Loader("conveyor", "conveyor DataLoader2", open_conveyor, packages=("conveyor",)),
    Loader("torch", "torch DataLoader", open_torch, packages=("torch",), needs=("torch",)),
    Loader("grain", "Grain mp_prefetch", open_grain, venv="grain", packages=("grain",)),
    Loader("nodes", "torchdata.nodes ParallelMapper", open_nodes, venv="nodes", packages=("torchdata", "torch")),
)


# --- the orchestrator's side ----------------------------------------------------------------


def non_negative(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--compute-us",
        type=non_negative,
        default=200.0,
        help="size compute's op for this many µs of CPU per item here (issue 18's ~200); 0: keep "
        "PEERS_COMPUTE_SIZE, or 6,144 samples",
    )


def settings(options: argparse.Namespace) -> dict[str, Any]:
    """Size compute's signal for ``--compute-us`` here; every run gets the size through
    ``PEERS_COMPUTE_SIZE`` (in this process's environment, which they inherit: Grain's
    spawned workers import the op afresh)."""
    if "compute" not in options.workloads or not options.compute_us:
        return {"workers": WORKERS, "compute_size": COMPUTE_SIZE}
    size, seconds = size_children_for(options.compute_us)
    print(
        f"compute op sized for ~{options.compute_us:,.0f} µs: {size:,} samples, "
        f"{seconds * 1e6:,.1f} µs per call measured here"
    )
    return {"workers": WORKERS, "compute_size": size, "op_us": round(seconds * 1e6, 1)}


def notes(result: Result) -> list[str]:
    """conveyor against the bare bound, and issue 18's targets this run measured, each held
    or missed (reported, never asserted)."""
    lines = []
    rate, cpu = "items_per_s", "cpu_us_per_item"
    conveyor, bare = result.median("compute", "conveyor", rate), result.median("compute", "bare", rate)
    conveyor_cpu, bare_cpu = result.median("compute", "conveyor", cpu), result.median("compute", "bare", cpu)
    if "compute" in result.workloads:
        if conveyor and bare and conveyor_cpu and bare_cpu:
            share, ratio = conveyor / bare, conveyor_cpu / bare_cpu
            lines.append(
                f"conveyor vs the bare bound: {share:.1%} of its items/s (conveyor {conveyor:,.0f}, bare "
                f"{bare:,.0f} items/s; medians); CPU per item {ratio:.2f}x the bare work's ({conveyor_cpu:,.1f} "
                f"vs {bare_cpu:,.1f} µs)"
            )
        else:
            lines.append("conveyor vs the bare bound: not measured (a row failed or was not run)")
    for workload, goal in TORCH_TARGETS.items():
        ours, theirs = result.median(workload, "conveyor", rate), result.median(workload, "torch", rate)
        if ours and theirs:
            held = "held" if ours / theirs >= goal else "missed"
            lines.append(f"target: {workload}: conveyor items/s >= {goal:g}x torch's: {ours / theirs:.2f}x, {held}")
    if conveyor and bare and conveyor_cpu and bare_cpu:
        share, ratio = conveyor / bare, conveyor_cpu / bare_cpu
        held_rate = "held" if share >= BARE_RATE_TARGET else "missed"
        held_cpu = "held" if ratio <= BARE_CPU_TARGET else "missed"
        lines.append(
            f"target: compute: conveyor items/s >= {BARE_RATE_TARGET:.0%} of the bare bound's: {share:.1%}, {held_rate}"
        )
        lines.append(
            f"target: compute: conveyor CPU per item <= {BARE_CPU_TARGET:g}x the bare work's: {ratio:.2f}x, {held_cpu}"
        )
    return lines


SUITE = Suite(
    name="peers",
    title="conveyor against its peers, 2 worker processes each",
    path=str(Path(__file__).resolve()),
    workloads=WORKLOADS,
    loaders=LOADERS,
    spread=("items_per_s", "cpu_us_per_item"),
    arguments=arguments,
    settings=settings,
    notes=notes,
)


def main(argv: list[str] | None = None) -> int:
    return cli.main(SUITE, argv, " ".join((__doc__ or "").split("\n\n", 1)[0].split()))


if __name__ == "__main__":
    sys.exit(main())
