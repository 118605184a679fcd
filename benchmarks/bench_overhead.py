"""What a loader adds to the work: conveyor's ``DataLoader2`` with its statistics on (the
default) and off, against torch's ``DataLoader``, torchdata 0.7.1's ``DataLoader2`` and no
loader at all, in the calling process and through 2 worker processes.

    python benchmarks/bench_overhead.py [--workloads trivial,small,demo,demo-in-process]
        [--loaders conveyor,conveyor-nostats,torch,...] [--repeats 5] [--quick] [--save | --out PATH]
    python benchmarks/bench_overhead.py --sample-cost EPOCHS   # what sampling costs the demo, pull by pull

Workloads:

- ``trivial``: 200,000 ints, ``map(add_one)``, read in the loader's process: each loader's
  own per-item cost, and the worst case for statistics (counting an item costs tens of
  nanoseconds per stage, the item a few hundred).
- ``small``: 200,000 ints, ``sharding_filter().map(identity)``, through 2 worker processes.
- ``demo``, ``demo-in-process``: the ``conveyor demo`` graph (shard files, shard shuffle,
  decode, item shuffle buffer, per-item random augmentation, batches of 64, collation)
  over 4,096 generated images in 16 shards, through 2 workers and in the loader's process.

Loaders: ``conveyor`` (statistics on) and ``conveyor-nostats`` (``collect_stats=False``),
whose runs alternate, each first in every other repeat; ``torch``: ``DataLoader(dataset,
batch_size=None)`` over an ``IterableDataset`` doing the same work per worker (for the demo:
the same shard order, item shuffle and keyed augmentation), as many workers; and on
``trivial`` only: ``torch-batch1`` (``batch_size=1``, torch's default, each item a 1-element
tensor), ``torchdata`` (torchdata 0.7.1's ``DataLoader2``, when it can be imported) and
``none``, the bare ``map(add_one, range(N))``: the floor every loader adds its cost to.

Every item is checked (ids once; the demo's labels against its files). How every run is
measured: :mod:`harness`. ``--sample-cost`` instead times every pull of one in-process demo
loader over EPOCHS epochs and sets the sampled pulls (the traced ones) against the median
pull, in the same epochs: the statistics' cost where noise between runs cannot enter.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from conveyor.tools.bench.harness import cli
from conveyor.tools.bench.harness.declare import Context, Loader, Opened, Slot, Suite, Workload
from conveyor.tools.bench.harness.results import Metric, Result
from conveyor.tools.bench.harness.tally import Tally

WORKERS = 2
#: The demo graph's defaults (``build_pipeline``), for torch's side.
DEMO_BATCH, DEMO_SHUFFLE_BUFFER = 64, 1024
#: The demo's dataset: shards of images, full and --quick.
SHARDS, PER_SHARD, QUICK_SHARDS, QUICK_PER_SHARD = 16, 256, 4, 64
#: The demo's warm-up dataset: shards of images.
WARM_DEMO = (2, 32)
#: The seed of the torch side's augmentation generators (one per item, keyed by its index).
AUGMENT_SEED = 20240601


def add_one(x: int) -> int:
    return x + 1


def identity(x: int) -> int:
    return x


class IntTally(Tally):
    """Ints (torch's ``batch_size=1`` makes each a 1-element tensor) naming their ids:
    ``offset`` more than the id."""

    def __init__(self, n: int, offset: int) -> None:
        super().__init__(n)
        self.offset = offset

    def see(self, item: Any) -> None:
        self.count += 1
        if type(item) is not int:
            shape = getattr(item, "shape", None)
            if shape != (1,):
                return self.wrong(item, "an int")
            item = int(item.item())
        self.id(item - self.offset)
        return None


class DemoTally(Tally):
    """The demo's batches ``(images, labels, index)``: float32 3x32x32 images, each label
    its image's in the files; ids from the index column."""

    def __init__(self, n: int, labels: np.ndarray) -> None:
        super().__init__(n)
        self.labels = labels

    def see(self, batch: Any) -> None:
        self.count += 1
        if not isinstance(batch, tuple | list) or len(batch) != 3:
            return self.wrong(batch, "(images, labels, index)")
        images, labels, index = (np.asarray(part) for part in batch)
        if images.dtype != np.float32 or images.shape != (len(index), 3, 32, 32) or not 0 < len(index) <= DEMO_BATCH:
            return self.wrong(f"{images.dtype} {images.shape}", "a batch of float32 3x32x32 images")
        inside = (index >= 0) & (index < self.n)
        if not np.array_equal(labels[inside], self.labels[index[inside]]):
            self.wrong(f"batch {self.count}", "labels matching their images'")
        self.ids(index.tolist())
        return None


def demo_dir(context: Context) -> str:
    return context.settings["demo_warm" if context.warmup else "demo_data"]


def demo_labels(data_dir: str, n: int) -> np.ndarray:
    labels = np.full(n, -1, dtype=np.int64)
    for path in sorted(Path(data_dir).glob("*.npz")):
        with np.load(path) as data:
            labels[data["index"]] = data["labels"]
    return labels


def tally(context: Context) -> Tally:
    key = context.workload.key
    if key.startswith("demo"):
        return DemoTally(context.items, demo_labels(demo_dir(context), context.items))
    return IntTally(context.items, 1 if key == "trivial" else 0)


def workers_of(context: Context) -> int:
    return WORKERS if context.workload.key in ("small", "demo") else 0


def conveyor_pipe(context: Context) -> Any:
    from conveyor.pipes import IterableWrapper

    key = context.workload.key
    if key == "trivial":
        return IterableWrapper(range(context.items)).map(add_one)
    if key == "small":
        return IterableWrapper(range(context.items)).sharding_filter().map(identity)
    from conveyor.tools.demo import build_pipeline

    return build_pipeline(demo_dir(context), DEMO_BATCH, DEMO_SHUFFLE_BUFFER)


def open_conveyor(collect_stats: bool) -> Callable[[Context], Opened]:
    def open_(context: Context) -> Opened:
        from conveyor import DataLoader2, InProcessReadingService, MultiProcessingReadingService

        workers = workers_of(context)
        service = MultiProcessingReadingService(workers) if workers else InProcessReadingService()
        loader = DataLoader2(conveyor_pipe(context), reading_service=service, collect_stats=collect_stats)
        return Opened(loader, loader.shutdown)

    return open_


def augment_keyed(item: Any) -> Any:
    """The demo's ``augment`` with a generator keyed by the item's dataset index: the same
    per-item cost as conveyor's ``random_map`` (a fresh Philox generator per item)."""
    from conveyor.tools.demo import augment

    return augment(item, np.random.Generator(np.random.Philox(key=[AUGMENT_SEED, int(item[2])])))


def buffer_shuffle(items: Iterator[Any], size: int, rng: random.Random) -> Iterator[Any]:
    """Shuffle within a buffer of ``size`` items, as the shuffle pipes do (fill the buffer,
    then hand out a random slot and refill it)."""
    buffer: list[Any] = []
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        slot = rng.randrange(size)
        yield buffer[slot]
        buffer[slot] = item
    rng.shuffle(buffer)
    yield from buffer


def torch_dataset(context: Context) -> Any:
    from torch.utils.data import IterableDataset, default_collate, get_worker_info

    key, n = context.workload.key, context.items
    offset = 1 if key == "trivial" else 0
    files = sorted(str(path) for path in Path(demo_dir(context)).glob("*.npz")) if key.startswith("demo") else []

    class Work(IterableDataset):
        """This worker's share of the workload's items: ints, or the demo's batches (each
        worker shuffles the shard list alike and keeps every ``num_workers``-th shard)."""

        def __iter__(self) -> Iterator[Any]:
            info = get_worker_info()
            worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
            if not files:
                return iter(range(worker + offset, n + offset, workers))
            return self.demo(worker, workers)

        def demo(self, worker: int, workers: int) -> Iterator[Any]:
            from conveyor.tools.demo import load_shard

            shards = list(files)
            random.Random(AUGMENT_SEED).shuffle(shards)  # the same order in every worker
            items = (item for path in shards[worker::workers] for item in load_shard(path))
            batch: list[Any] = []
            for item in buffer_shuffle(items, DEMO_SHUFFLE_BUFFER, random.Random(AUGMENT_SEED * 1009 + worker)):
                batch.append(augment_keyed(item))
                if len(batch) == DEMO_BATCH:
                    yield default_collate(batch)
                    batch = []
            if batch:
                yield default_collate(batch)

    return Work()


def open_torch(batch_size: int | None) -> Callable[[Context], Opened]:
    def open_(context: Context) -> Opened:
        from torch.utils.data import DataLoader

        loader = DataLoader(torch_dataset(context), batch_size=batch_size, num_workers=workers_of(context))
        return Opened(loader, lambda: None)  # its iterator ends its workers with the epoch

    return open_


def open_torchdata(context: Context) -> Opened:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchdata announces its deprecation
        from torchdata.dataloader2 import DataLoader2
        from torchdata.datapipes.iter import IterableWrapper
    loader = DataLoader2(IterableWrapper(range(context.items)).map(add_one))
    return Opened(loader, loader.shutdown)


def open_none(context: Context) -> Opened:
    return Opened(map(add_one, range(context.items)), lambda: None)


def schedule(workloads: Sequence[Workload], loaders: Sequence[Loader], repeats: int) -> Iterator[Slot]:
    """Per workload, each repeat runs every loader once; conveyor with statistics on and
    off swap places every other repeat, so that neither always follows the other."""
    for workload in workloads:
        for repeat in range(repeats):
            order = list(loaders)
            keys = [loader.key for loader in order]
            if repeat % 2 and "conveyor" in keys and "conveyor-nostats" in keys:
                a, b = keys.index("conveyor"), keys.index("conveyor-nostats")
                order[a], order[b] = order[b], order[a]
            for loader in order:
                if loader.runs(workload.key):
                    yield Slot(repeat, workload, loader)


@contextlib.contextmanager
def prepare(options: argparse.Namespace, settings: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The demo's dataset, generated in a temporary directory removed at the end."""
    if not any(key.startswith("demo") for key in options.workloads):
        yield {}
        return
    from conveyor.tools.demo import prepare_dataset

    with tempfile.TemporaryDirectory(prefix="bench_overhead-") as tmp:
        shards, per_shard = (QUICK_SHARDS, QUICK_PER_SHARD) if options.quick else (SHARDS, PER_SHARD)
        prepare_dataset(Path(tmp) / "timed", shards, per_shard)
        prepare_dataset(Path(tmp) / "warm", *WARM_DEMO)
        yield {"demo_data": str(Path(tmp) / "timed"), "demo_warm": str(Path(tmp) / "warm")}


def derive(result: Result) -> None:
    """Statistics' cost: conveyor's wall time and CPU with them over without, per workload,
    from each repeat's pair of runs (back to back: a slow phase of the machine moves both)."""
    for entry in result.entries:
        off = result.entry(entry.workload, "conveyor-nostats")
        if entry.loader != "conveyor" or entry.status != "ok" or off is None or off.status != "ok":
            continue
        for metric, key in (("wall_s", "stats_wall_pct"), ("cpu_us_per_item", "stats_cpu_pct")):
            on_values, off_values = entry.metrics[metric].values, off.metrics[metric].values
            if len(on_values) == len(off_values):  # no failed run: the i-th of each is repeat i's
                entry.metrics[key] = Metric.of([(a / b - 1) * 100 for a, b in zip(on_values, off_values, strict=True)])


def sample_cost(data_dir: Path, epochs: int) -> str:
    """What sampling costs the in-process demo, measured pull by pull (CPU time), on one
    loader over ``epochs`` epochs (its sampling schedule runs on across them, as in
    training): the sampled pulls (the profiler's traced ones) against the median pull, and
    what they add to an epoch. Noise between runs does not enter: both kinds of pull are
    timed in the same epochs."""
    import conveyor.observe.pull_profiler as pull_profiler
    from conveyor import DataLoader2
    from conveyor.tools.demo import build_pipeline

    sampled: list[float] = []
    untraced_pull = pull_profiler.PullProfiler.pull

    def timed_pull(self: Any, *args: Any) -> Any:
        started = time.process_time()
        try:
            return untraced_pull(self, *args)
        finally:
            sampled.append(time.process_time() - started)

    pulls: list[float] = []
    pull_profiler.PullProfiler.pull = timed_pull  # type: ignore[method-assign]
    loader = DataLoader2(build_pipeline(data_dir), collect_stats=True)
    try:
        for _ in range(epochs):
            iterator = iter(loader)
            while True:
                started = time.process_time()
                try:
                    next(iterator)
                except StopIteration:
                    break
                pulls.append(time.process_time() - started)
    finally:
        loader.shutdown()
        pull_profiler.PullProfiler.pull = untraced_pull  # type: ignore[method-assign]
    typical = statistics.median(pulls)
    added = sum(sampled) - typical * len(sampled)  # what the samples took beyond ordinary pulls
    return (
        f"demo, in-process, one loader, {epochs} epochs of {len(pulls) // epochs} batches: {len(sampled)} sampled "
        f"pulls ({len(sampled) / epochs:.1f} per epoch), {statistics.median(sampled) * 1e3:.1f} ms each (median; "
        f"max {max(sampled) * 1e3:.1f}) against {typical * 1e3:.1f} ms for a pull (median of all); the samples "
        f"added {added * 1e3:.0f} ms to {sum(pulls):.2f} s of pulls: {added / sum(pulls):+.2%}"
    )


def demo_warmup(items: int) -> int:
    """The warm-up dataset's images."""
    return WARM_DEMO[0] * WARM_DEMO[1]


DEMO = "images (generated 3x32x32) through the conveyor demo graph, batches of 64"
WORKLOADS = (
    Workload("trivial", 200_000, 2_000, "ints, map(add_one), in the loader's process", tally),
    Workload("small", 200_000, 2_000, "ints, sharding_filter().map(identity), 2 workers", tally),
    Workload(
        "demo",
        SHARDS * PER_SHARD,
        QUICK_SHARDS * QUICK_PER_SHARD,
        DEMO + ", 2 workers",
        tally,
        unit="images",
        warmup=demo_warmup,
    ),
    Workload(
        "demo-in-process",
        SHARDS * PER_SHARD,
        QUICK_SHARDS * QUICK_PER_SHARD,
        DEMO + ", in the loader's process",
        tally,
        unit="images",
        warmup=demo_warmup,
    ),
)
LOADERS = (
    Loader("conveyor", "conveyor DataLoader2", open_conveyor(collect_stats=True), packages=("conveyor",)),
    Loader("conveyor-nostats", "conveyor DataLoader2, statistics off", open_conveyor(False), packages=("conveyor",)),
    Loader("torch", "torch DataLoader (batch_size=None)", open_torch(None), packages=("torch",), needs=("torch",)),
    Loader(
        "torch-batch1",
        "torch DataLoader (batch_size=1)",
        open_torch(1),
        workloads=("trivial",),
        packages=("torch",),
        needs=("torch",),
    ),
    Loader(
        "torchdata",
        "torchdata 0.7 DataLoader2",
        open_torchdata,
        workloads=("trivial",),
        packages=("torchdata",),
        needs=("torchdata",),
    ),
    Loader("none", "no loader: map(add_one, range(N)) (floor)", open_none, workloads=("trivial",)),
)
SUITE = Suite(
    name="overhead",
    title="What a loader adds to the work, and what conveyor's statistics cost",
    path=str(Path(__file__).resolve()),
    workloads=WORKLOADS,
    loaders=LOADERS,
    columns=("items_per_s", "cpu_us_per_item", "first_item_ms", "stats_wall_pct", "stats_cpu_pct"),
    metrics={
        "stats_wall_pct": ("statistics' cost, wall", "Δ%"),
        "stats_cpu_pct": ("statistics' cost, CPU", "Δ%"),
    },
    repeats=5,
    prepare=prepare,
    schedule=schedule,
    derive=derive,
)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--sample-cost"]:
        from conveyor.tools.demo import prepare_dataset

        with tempfile.TemporaryDirectory(prefix="bench_overhead-") as tmp:
            prepare_dataset(Path(tmp), SHARDS, PER_SHARD)
            print(sample_cost(Path(tmp), int(args[1])))
        return 0
    return cli.main(SUITE, args, " ".join((__doc__ or "").split("\n\n", 1)[0].split()))


if __name__ == "__main__":
    sys.exit(main())
