"""conveyor against its peers, each with 2 worker processes, on issue 18's three workloads
and batched images: torch's ``DataLoader``, Grain (``MapDataset ... mp_prefetch``),
torchdata.nodes (``ParallelMapper(method="process")`` in a ``Loader``), and bounds with
no loader: two bare forked processes doing the work.

    bash benchmarks/peer_envs.sh     # once: Grain's and torchdata.nodes' venvs
    python benchmarks/bench_peers.py [--workloads small,arrays,compute,images]
        [--loaders bare,bare-copy,bare-fill,conveyor,conveyor-shared,conveyor-dl,torch,grain,nodes]
        [--repeats 3] [--quick] [--require-peers] [--compute-us 200] [--save | --out PATH]

Workloads (:mod:`work.compute`; made in the workers):

- ``small``: 200,000 ints, ``f(i) = i + 1``;
- ``arrays``: 2,000 new 1 MiB int64 arrays (``np.full(131072, i)``);
- ``compute``: 20,000 items of a fixed numpy op (FFT filtering of a signal sized here
  for ~200 µs of CPU, the issue's item: ``--compute-us``; its cost is measured and
  printed), each giving ``(i, float)``;
- ``images``: 38,400 new 224x224x3 uint8 images (``np.full`` with ``i % 251``, the first
  pixel holding ``i``), in batches of 64 stacked in the workers: each batch a
  ``(64, 224, 224, 3)`` array (a tensor for the ``DataLoader`` rows). So many, because
  each costs the bounds so little that with a few thousand a run's setup (the forks,
  the first touch of their shared slots) would weigh on their CPU per item.

Loaders, each with 2 worker processes, items unbatched but for ``images``:

- conveyor: ``DataLoader2(IterableWrapper(range(n)).sharding_filter().map(f),
  reading_service=MultiProcessingReadingService(num_workers=2))``, defaults otherwise
  (statistics on), ``.batch(64).collate()`` after the map for ``images``; ``shutdown()``.
- conveyor-shared (``arrays``): the same, ``f`` making its array with
  ``conveyor.shared_empty`` and filling it in place; unavailable while conveyor has none.
- conveyor-dl (``images``): ``conveyor.DataLoader(dataset, batch_size=64,
  num_workers=2)`` over a map-style dataset whose ``__getitem__(i)`` is the image as a
  tensor (``torch.from_numpy``); ``shutdown()``.
- torch: ``DataLoader(dataset, batch_size=None, num_workers=2)`` over a map-style
  dataset whose ``__getitem__(i)`` is ``f(i)`` (what a torch user writes; the default
  sequential sampler sends each index to a worker); ``batch_size=None`` makes every item
  go through ``default_convert`` (arrays become tensors, turned back into arrays with
  ``.numpy()``, zero-copy). ``images``: conveyor-dl's call and dataset (torch's
  collation stacks a batch into shared memory in the worker). Its workers end with the
  epoch; the iterator is then dropped.
- grain: ``MapDataset.source(range(n)).map(f).to_iter_dataset(ReadOptions(num_threads=0))
  .mp_prefetch(MultiprocessingOptions(num_workers=2))``, with ``.batch(64)`` before
  ``mp_prefetch`` for ``images`` (which makes Grain stack each batch into shared memory);
  its iterator's ``close()``. Grain starts its workers with ``spawn`` whatever the default.
- nodes: ``Loader(ParallelMapper(IterableWrapper(range(n)), f, num_workers=2,
  method="process"))`` (torchdata 0.11, the default start method); for ``images``, a
  ``Batcher(..., 64)`` of the indices before the mapper, whose function stacks a batch
  (torchdata.nodes' way of reading a map-style dataset). It has no shutdown call: its
  workers are joined when the mapper's iterator is collected, so the run drops the loader
  and collects garbage.
- bare (``compute``): two processes forked from the run's, each computing every other
  item with no per-item message, each sending its tally in one message at the end; no
  first item.
- bare-copy, bare-fill (``arrays``, ``images``): two forked processes put the items in
  slots of a shared mapping that the run's process reads (and checks) there, a byte down
  a pipe per slot each way (:mod:`work.bare`): bare-copy makes each item as the loaders
  do and copies it once into its place (for ``images``, the copy that stacks the batch:
  a batch made in place in shared memory); bare-fill writes it in place.

conveyor, torch and the bounds run under this interpreter; Grain and torchdata.nodes
under the venvs ``peer_envs.sh`` makes in ``benchmarks/.venvs``, which hold numpy at the
same version. A peer whose venv is missing is a row saying so (exit 2 instead with
``--require-peers``). How every run is measured and checked: :mod:`harness`. The
targets (:mod:`work.peer_targets`) are printed under the tables, each held or missed.
"""

from __future__ import annotations

import argparse
import functools
import gc
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from conveyor.tools.bench.harness import cli
from conveyor.tools.bench.harness.declare import Context, Loader, Opened, Suite, Workload
from work import bare
from work.compute import (
    ARRAY_ELEMENTS,
    BATCH,
    COMPUTE_SIZE,
    ITEM_FUNCTIONS,
    expected_checksum,
    size_children_for,
    stack_images,
    tally_for,
)
from work.peer_targets import targets

WORKERS = 2


# --- the loaders (in a run's process) ---------------------------------------------------------


def item_function(context: Context) -> Callable[[int], Any]:
    return ITEM_FUNCTIONS[context.workload.key]


def shared_array(i: int) -> np.ndarray:
    """``arrays``' item made where conveyor's worker sends it from: ``shared_empty``, filled in place."""
    from conveyor import shared_empty

    out = shared_empty((ARRAY_ELEMENTS,), np.int64)
    out.fill(i)
    return out


def open_conveyor(context: Context, fn: Callable[[int], Any] | None = None) -> Opened:
    from conveyor import DataLoader2, MultiProcessingReadingService
    from conveyor.pipes import IterableWrapper

    pipe = IterableWrapper(range(context.items)).sharding_filter().map(fn or item_function(context))
    if context.workload.key == "images":
        pipe = pipe.batch(BATCH).collate()
    loader = DataLoader2(pipe, reading_service=MultiProcessingReadingService(num_workers=WORKERS))
    return Opened(loader, loader.shutdown)


def _as_arrays(tensors: Iterable[Any]) -> Iterator[Any]:
    for tensor in tensors:
        yield tensor.numpy()


def open_dataloader(context: Context, conveyor: bool) -> Opened:
    """``images``: conveyor's or torch's ``DataLoader``, the same call over the same dataset."""
    if conveyor:
        from conveyor import DataLoader
    else:
        from torch.utils.data import DataLoader
    from work.torch_items import ItemsDataset, image_tensor

    loader = DataLoader(ItemsDataset(image_tensor, context.items), batch_size=BATCH, num_workers=WORKERS)
    # torch's iterator ends its workers when the epoch ends; nothing is left to shut down.
    return Opened(loader, loader.shutdown if conveyor else lambda: None)


def open_torch(context: Context) -> Opened:
    if context.workload.key == "images":
        return open_dataloader(context, conveyor=False)
    import torch.utils.data

    from work.torch_items import ItemsDataset

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
    )
    if context.workload.key == "images":  # the batch in the workers: Grain stacks it into shared memory
        dataset = dataset.batch(BATCH)
    iterator = iter(dataset.mp_prefetch(grain.MultiprocessingOptions(num_workers=WORKERS)))
    return Opened(iterator, iterator.close)


def open_nodes(context: Context) -> Opened:
    from torchdata.nodes import Batcher, IterableWrapper, Loader, ParallelMapper

    source, fn = IterableWrapper(range(context.items)), item_function(context)
    if context.workload.key == "images":  # batches of indices, each stacked in a worker
        source, fn = Batcher(source, batch_size=BATCH, drop_last=False), stack_images
    mapper = ParallelMapper(source, map_fn=fn, num_workers=WORKERS, method="process")
    holder = [Loader(mapper)]

    def close() -> None:
        holder.clear()  # the mapper's iterator joins its workers when it is collected
        gc.collect()

    return Opened(holder[0], close)


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


def batches_warmup(items: int) -> int:
    """Two batches per worker at least, so that every worker has stacked a batch before the timed epoch."""
    return min(items, max(2 * WORKERS * BATCH, items // 50))


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
    Workload(
        "images",
        38_400,
        320,
        "new 224x224x3 uint8 images (np.full), made in the worker, in batches of 64 stacked there",
        tally,
        checksum,
        warmup=batches_warmup,
    ),
)
BULK = ("arrays", "images")
LOADERS = (  # the order of the runs in each round
    Loader("bare", "bare bound: 2 forked processes", epoch=bare.tally_epoch, workloads=("compute",)),
    Loader(
        "bare-copy",
        "bare bound: made, one copy into shared memory",
        epoch=functools.partial(bare.shared_epoch, how="copy"),
        workloads=BULK,
    ),
    Loader(
        "bare-fill",
        "bare bound: filled in place in shared memory",
        epoch=functools.partial(bare.shared_epoch, how="fill"),
        workloads=BULK,
    ),
    Loader("conveyor", "conveyor DataLoader2", open_conveyor, packages=("conveyor",)),
    Loader(
        "conveyor-shared",
        "conveyor DataLoader2, shared_empty",
        functools.partial(open_conveyor, fn=shared_array),
        workloads=("arrays",),
        packages=("conveyor",),
        needs=("conveyor:shared_empty",),
    ),
    Loader(
        "conveyor-dl",
        "conveyor.DataLoader",
        functools.partial(open_dataloader, conveyor=True),
        workloads=("images",),
        packages=("conveyor", "torch"),
        needs=("torch",),
    ),
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


SUITE = Suite(
    name="peers",
    title="conveyor against its peers, 2 worker processes each",
    path=str(Path(__file__).resolve()),
    workloads=WORKLOADS,
    loaders=LOADERS,
    spread=("items_per_s", "cpu_us_per_item"),
    arguments=arguments,
    settings=settings,
    notes=targets,
)


def main(argv: list[str] | None = None) -> int:
    return cli.main(SUITE, argv, " ".join((__doc__ or "").split("\n\n", 1)[0].split()))


if __name__ == "__main__":
    sys.exit(main())
