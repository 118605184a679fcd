"""conveyor against the loaders people use on real data formats: JPEG shards in WebDataset
tars, a Parquet table, and objects on an S3-protocol server that answers slowly; and
conveyor's thread workers against its worker processes on the JPEGs.

    python benchmarks/bench_real_data.py [--workloads images,parquet,s3,startup]
        [--loaders conveyor,conveyor-threads,...] [--repeats 3] [--quick] [--save | --out PATH]

Workloads (2 workers wherever workers apply; the data is written to a temporary
directory before the runs, untimed, and removed at the end):

- ``images``: 64 WebDataset shards of 256 JPEGs (16,384 images, 256x256 RGB, quality 90,
  ~40 KB each; :mod:`work.images`), read into batches of 32 ``(image, label, index)``
  samples: each image decoded with Pillow and cropped to 224x224 at a corner drawn from
  its index (the same function in every loader), delivered as three torch tensors. Every
  loader gives each worker every other shard.

  - ``conveyor``: ``IterableWrapper(shards).sharding_filter().open_files(mode="b")
    .load_from_tar().webdataset().map(...).batch(32).collate(to_tensor=True)`` through
    ``DataLoader2`` with ``MultiProcessingReadingService(num_workers=2)``;
    ``conveyor-threads``: the same with ``worker_type="thread"``;
  - ``webdataset``: ``WebDataset(shards, shardshuffle=False).map(...).batched(32)`` in
    ``WebLoader(..., batch_size=None, num_workers=2)`` (torch's ``DataLoader``);
  - ``torch``: ``DataLoader(..., batch_size=32, num_workers=2)`` over an
    ``IterableDataset`` that reads its worker's shards with ``tarfile``;
  - bounds, no loader, each checking its own batches: ``bound``, a torch worker's work
    in 2 forked processes (what 2 cores give at most); ``bound-threads``, the same in 2
    threads of the run's process (what the GIL leaves of them); ``bound-graph``,
    conveyor's graph itself in 2 threads (the thread workers' work without the loader);
    ``none``, the work in the run's thread alone (its first item is one batch's work).

- ``startup``: the same loaders over the shard paths alone (nothing read or decoded):
  their first item is the loader's start-up.
- ``parquet``: a Parquet file of ~1.57 M rows (``id`` int64, ``x = id / 2`` float64,
  ``label = id % 10`` int64, ``name = f"row{id}"`` string) in 12 row groups, read as
  batches of 1,024 rows, each a dict of column -> tensor (``name``: a list of str).
  ``conveyor``: ``IterableWrapper([path]).load_parquet(batch_rows=1024)`` (split between
  the workers by row group) and a ``map`` of the numeric columns to tensors, 2 workers;
  ``hf``: Hugging Face ``Dataset.from_parquet(path, cache_dir=...)`` (its Arrow cache built
  before the runs, untimed) ``.to_iterable_dataset(num_shards=12)`` in torch's
  ``DataLoader(batch_size=1024, num_workers=2)``; offline, every cache in the temporary
  directory.
- ``s3``: 400 objects of 16 KiB on moto's S3 server (``python -m moto.server`` on
  127.0.0.1, started for the benchmark and stopped at its end), each read with s3fs
  (``cat_file``) after a 50 ms ``time.sleep`` in the reading thread, where a slow network
  would keep it waiting. ``conveyor``: ``threadpool_map(read, max_workers=16)``;
  ``conveyor-map``: its ``map(read)``; ``bound``: the same reads through
  ``concurrent.futures.ThreadPoolExecutor(max_workers=16).map``, no loader; all in the
  run's process. The server's CPU over each run is a metric of its own.

Every batch of every epoch is checked: each item exactly once, full batches but for at
most one per worker, and the content: each label its index's and each crop's
fingerprint the written one; ``x``, ``label`` and ``name`` against the ids; each object's
bytes. How every run is measured: :mod:`harness`. The targets (conveyor at least 1.5x
the items/s and at most 0.7x the CPU per item of webdataset and torch on ``images``; 2x
Hugging Face's items/s on ``parquet``; ``threadpool_map`` 10x ``map``'s items/s on ``s3``;
thread workers against worker processes: the first batch 10x sooner, a third of the peak
RSS, 0.9x the items/s) are reported with whether each held; nothing asserts them.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from conveyor.tools.bench.harness import cli
from conveyor.tools.bench.harness.declare import Context, Epoch, Loader, Opened, Suite, Workload
from conveyor.tools.bench.harness.results import Result
from conveyor.tools.bench.harness.tally import Tally
from work import images
from work.parquet import ROW_BATCH, RowTally, as_tensors, write_table
from work.s3 import (
    LATENCY_S,
    OBJECT_BYTES,
    THREADS,
    ObjectTally,
    process_cpu_seconds,
    put_objects,
    read_object,
    s3_server,
)

WORKERS = 2
#: images: shards of images, full and --quick.
SHARDS, PER_SHARD, QUICK_SHARDS, QUICK_PER_SHARD = 64, 256, 4, 20
#: parquet: row groups of batches of rows (the group's batches: full, --quick).
ROW_GROUPS, GROUP_BATCHES, QUICK_GROUP_BATCHES = 12, 128, 1
#: s3: objects (full, --quick).
OBJECTS, QUICK_OBJECTS = 400, 32


# --- the data (written by the orchestrator) ---------------------------------------------------


@contextlib.contextmanager
def prepare(options: argparse.Namespace, settings: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The selected workloads' data, in a temporary directory removed at the end, and
    moto's server when ``s3`` runs: ``{"manifest": path}`` for every run."""
    keys, quick = options.workloads, options.quick
    with tempfile.TemporaryDirectory(prefix="bench_real_data-") as tmp, contextlib.ExitStack() as stack:
        root = Path(tmp)
        # Hugging Face: nothing from the network, nothing in the home directory (the runs inherit these).
        os.environ.update({"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(root / "hf")})
        started = time.perf_counter()
        manifest: dict[str, Any] = {}
        if "images" in keys or "startup" in keys:
            shards, per_shard = (QUICK_SHARDS, QUICK_PER_SHARD) if quick else (SHARDS, PER_SHARD)
            manifest["shards"], manifest["fingerprints"] = images.write_shards(root, shards, per_shard, WORKERS)
            manifest["per_shard"] = per_shard
        if "parquet" in keys:
            import datasets

            group_rows = ROW_BATCH * (QUICK_GROUP_BATCHES if quick else GROUP_BATCHES)
            manifest["hf_cache"] = str(root / "hf" / "datasets")
            manifest["parquet"] = {
                "warm": write_table(root / "warm.parquet", WORKERS, 2 * ROW_BATCH),
                "timed": write_table(root / "rows.parquet", ROW_GROUPS, group_rows),
            }
            datasets.disable_progress_bars()
            for part in manifest["parquet"].values():  # a run loads the cache, as a user's second run would
                datasets.Dataset.from_parquet(part["sources"][0], cache_dir=manifest["hf_cache"])
        if "s3" in keys:
            endpoint, pid = stack.enter_context(s3_server())
            urls = put_objects(endpoint, QUICK_OBJECTS if quick else OBJECTS)
            manifest.update(endpoint=endpoint, server_pid=pid, objects=urls)
        print(f"data written in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        path = root / "manifest.json"
        path.write_text(json.dumps(manifest))
        yield {"manifest": str(path)}


@functools.cache
def manifest_of(path: str) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


# --- what a run reads -------------------------------------------------------------------------


def shards_of(context: Context) -> list[str]:
    """The shards an epoch reads: the first of each worker for a warm-up, else all."""
    manifest = manifest_of(context.settings["manifest"])
    return manifest["shards"][:WORKERS] if context.warmup else manifest["shards"]


def paths_of(context: Context) -> list[str]:
    """The shard paths alone (the startup workload), as many as the epoch's items."""
    return manifest_of(context.settings["manifest"])["shards"][: context.items]


def parquet_part(context: Context) -> dict[str, Any]:
    return manifest_of(context.settings["manifest"])["parquet"]["warm" if context.warmup else "timed"]


def objects_of(context: Context) -> list[str]:
    return manifest_of(context.settings["manifest"])["objects"][: context.items]


def conveyor_opened(pipe: Any, workers: int, worker_type: str = "process") -> Opened:
    from conveyor import DataLoader2, MultiProcessingReadingService

    service = MultiProcessingReadingService(num_workers=workers, worker_type=worker_type) if workers else None
    loader = DataLoader2(pipe, reading_service=service)
    return Opened(loader, loader.shutdown)


def wds_sample(sample: dict[str, Any]) -> tuple[np.ndarray, int, int]:
    """A sample of the webdataset package: fields are bytes."""
    return images.crop_item(sample["__key__"], sample["jpg"], sample["cls"])


def timed_server(opened: Opened, context: Context) -> Opened:
    """``opened``, reporting the CPU the S3 server used over the epoch, per object."""
    pid = manifest_of(context.settings["manifest"])["server_pid"]
    before = process_cpu_seconds(pid)

    def extra() -> Mapping[str, float]:
        return {"server_cpu_us_per_item": (process_cpu_seconds(pid) - before) / context.items * 1e6}

    return Opened(opened.items, opened.close, extra)


def open_conveyor(worker_type: str) -> Any:
    def open_(context: Context) -> Opened:
        from conveyor.pipes import IterableWrapper

        key = context.workload.key
        if key == "images":
            return conveyor_opened(images.image_pipeline(shards_of(context)), WORKERS, worker_type)
        if key == "startup":
            return conveyor_opened(IterableWrapper(paths_of(context)).sharding_filter(), WORKERS, worker_type)
        if key == "parquet":
            pipe = IterableWrapper(parquet_part(context)["sources"]).load_parquet(batch_rows=ROW_BATCH).map(as_tensors)
            return conveyor_opened(pipe, WORKERS)
        read = functools.partial(read_object, manifest_of(context.settings["manifest"])["endpoint"])
        pipe = IterableWrapper(objects_of(context)).threadpool_map(read, max_workers=THREADS)
        return timed_server(conveyor_opened(pipe, 0), context)

    return open_


def open_conveyor_map(context: Context) -> Opened:
    from conveyor.pipes import IterableWrapper

    read = functools.partial(read_object, manifest_of(context.settings["manifest"])["endpoint"])
    return timed_server(conveyor_opened(IterableWrapper(objects_of(context)).map(read), 0), context)


def open_webdataset(context: Context) -> Opened:
    import webdataset as wds

    dataset = wds.WebDataset(shards_of(context), shardshuffle=False).map(wds_sample).batched(images.IMAGE_BATCH)
    return Opened(wds.WebLoader(dataset, batch_size=None, num_workers=WORKERS), lambda: None)


def open_torch(context: Context) -> Opened:
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info

    class TarShardImages(IterableDataset):
        """Each worker reads every ``num_workers``-th shard, from its worker id on."""

        def __init__(self, shards: Sequence[str]):
            self.shards = list(shards)

        def __iter__(self) -> Iterator[tuple[np.ndarray, int, int]]:
            info = get_worker_info()
            return images.shard_items(self.shards if info is None else self.shards[info.id :: info.num_workers])

    if context.workload.key == "startup":
        return Opened(DataLoader(paths_of(context), batch_size=None, num_workers=WORKERS), lambda: None)
    loader = DataLoader(TarShardImages(shards_of(context)), batch_size=images.IMAGE_BATCH, num_workers=WORKERS)
    return Opened(loader, lambda: None)  # its iterator ends its workers with the epoch


def open_hf(context: Context) -> Opened:
    import datasets
    from torch.utils.data import DataLoader

    part = parquet_part(context)
    table = datasets.Dataset.from_parquet(
        part["sources"][0], cache_dir=manifest_of(context.settings["manifest"])["hf_cache"]
    )
    stream = table.to_iterable_dataset(num_shards=part["groups"])
    return Opened(DataLoader(stream, batch_size=ROW_BATCH, num_workers=WORKERS), lambda: None)


def open_none(context: Context) -> Opened:
    return Opened(images.collated(images.shard_items(shards_of(context))), lambda: None)


def _expected_prints(context: Context) -> np.ndarray:
    return np.load(manifest_of(context.settings["manifest"])["fingerprints"])


def _shares(context: Context) -> list[list[str]]:
    shards = shards_of(context)
    return [shards[worker::WORKERS] for worker in range(WORKERS)]


def bound_processes(context: Context) -> Epoch:
    """The images' bound: a torch worker's work on its shards in 2 forked processes."""
    prints = manifest_of(context.settings["manifest"])["fingerprints"]
    wall_s, first_s, tally = images.bound_in_processes(_shares(context), prints, context.items)
    return Epoch(wall_s, first_s, tally)


def bound_threads(graph: bool) -> Any:
    """The images' work in 2 plain threads of the run's process: a torch worker's, or
    conveyor's graph over every other shard (``graph``)."""

    def epoch(context: Context) -> Epoch:
        prints = manifest_of(context.settings["manifest"])["fingerprints"]
        wall_s, first_s, tally = images.bound_in_threads(_shares(context), prints, context.items, graph)
        return Epoch(wall_s, first_s, tally)

    return epoch


def bound(context: Context) -> Epoch:
    """What the machine gives for a workload's work with no loader."""
    return bound_processes(context) if context.workload.key == "images" else bound_executor(context)


def bound_executor(context: Context) -> Epoch:
    """The objects' bound: the reads through a plain thread pool, no loader."""
    read = functools.partial(read_object, manifest_of(context.settings["manifest"])["endpoint"])
    pid = manifest_of(context.settings["manifest"])["server_pid"]
    tally = ObjectTally(context.items)
    server = process_cpu_seconds(pid)
    start, first = time.perf_counter(), None
    with ThreadPoolExecutor(max_workers=THREADS) as executor:
        for blob in executor.map(read, objects_of(context)):
            first = first if first is not None else time.perf_counter() - start
            tally.see(blob)
    extra = {"server_cpu_us_per_item": (process_cpu_seconds(pid) - server) / context.items * 1e6}
    return Epoch(time.perf_counter() - start, first, tally, extra=extra)


# --- the checks -------------------------------------------------------------------------------


class PathTally(Tally):
    """The shard paths alone: each names its shard's number."""

    def see(self, path: Any) -> None:
        self.count += 1
        if not isinstance(path, str) or not Path(path).name.startswith("shard-"):
            self.wrong(path, "a shard's path")
            return
        self.id(int(Path(path).stem.removeprefix("shard-")))


def tally(context: Context) -> Tally:
    key, n = context.workload.key, context.items
    if key == "images":
        return images.ImageTally(n, _expected_prints(context), WORKERS)
    return {"parquet": RowTally, "s3": ObjectTally, "startup": PathTally}[key](n)


def image_warmup(items: int) -> int:
    """The first shard of each worker."""
    return WORKERS * (PER_SHARD if items == SHARDS * PER_SHARD else QUICK_PER_SHARD)


WORKLOADS = (
    Workload(
        "images",
        SHARDS * PER_SHARD,
        QUICK_SHARDS * QUICK_PER_SHARD,
        "WebDataset JPEGs -> batches of 32 decoded 224x224 crops",
        tally,
        unit="images",
        warmup=image_warmup,
    ),
    Workload(
        "startup",
        SHARDS,
        QUICK_SHARDS,
        "shard paths alone: the loader's start-up",
        tally,
        unit="paths",
        warmup=lambda items: min(items, WORKERS * 2),
    ),
    Workload(
        "parquet",
        ROW_GROUPS * GROUP_BATCHES * ROW_BATCH,
        ROW_GROUPS * QUICK_GROUP_BATCHES * ROW_BATCH,
        "Parquet rows -> batches of 1,024 as columns",
        tally,
        unit="rows",
        warmup=lambda items: 2 * WORKERS * ROW_BATCH,
    ),
    Workload(
        "s3",
        OBJECTS,
        QUICK_OBJECTS,
        f"S3 objects of {OBJECT_BYTES // 1024} KiB, {LATENCY_S * 1000:.0f} ms per read",
        tally,
        unit="objects",
        warmup=lambda items: min(items, THREADS),
    ),
)
LOADERS = (
    Loader("conveyor", "conveyor", open_conveyor("process"), packages=("conveyor", "torch")),
    Loader(
        "conveyor-threads",
        "conveyor, thread workers",
        open_conveyor("thread"),
        workloads=("images", "startup"),
        packages=("conveyor", "torch"),
    ),
    Loader(
        "webdataset", "webdataset WebLoader", open_webdataset, workloads=("images",), packages=("webdataset", "torch")
    ),
    Loader("torch", "torch DataLoader", open_torch, workloads=("images", "startup"), packages=("torch",)),
    Loader(
        "hf",
        "Hugging Face datasets + torch DataLoader",
        open_hf,
        workloads=("parquet",),
        packages=("datasets", "pyarrow", "torch"),
    ),
    Loader(
        "conveyor-map", "conveyor map (no threads)", open_conveyor_map, workloads=("s3",), packages=("conveyor", "s3fs")
    ),
    Loader("bound", "no loader: the work alone (bound)", epoch=bound, workloads=("images", "s3"), packages=("torch",)),
    Loader(
        "bound-threads",
        "no loader: the work in 2 threads (bound)",
        epoch=bound_threads(graph=False),
        workloads=("images",),
        packages=("torch",),
    ),
    Loader(
        "bound-graph",
        "no loader: conveyor's graph in 2 threads (bound)",
        epoch=bound_threads(graph=True),
        workloads=("images",),
        packages=("conveyor", "torch"),
    ),
    Loader("none", "no loader: the work in the run's thread", open_none, workloads=("images",), packages=("torch",)),
)


# --- the targets ------------------------------------------------------------------------------


def held(what: str, value: float, goal: float, at_least: bool = True) -> str:
    """A target's line: what it asks, what this run measured, and whether it held."""
    ok = value >= goal if at_least else value <= goal
    return f"target: {what} {'>=' if at_least else '<='} {goal:.3g}x: {value:.3f}x, {'held' if ok else 'missed'}"


def notes(result: Result) -> list[str]:
    """The targets this run measured, each held or not, and the bounds behind them."""
    lines: list[str] = []

    def ratio(workload: str, ours: str, theirs: str, metric: str = "items_per_s") -> float | None:
        a, b = result.median(workload, ours, metric), result.median(workload, theirs, metric)
        return a / b if a and b else None

    cpu = "cpu_us_per_item"
    for peer in ("webdataset", "torch"):
        rate, cost = ratio("images", "conveyor", peer), ratio("images", "conveyor", peer, cpu)
        if rate and cost:
            lines.append(held(f"images: conveyor's items/s over {peer}'s", rate, 1.5))
            lines.append(held(f"images: conveyor's CPU per item over {peer}'s", cost, 0.7, at_least=False))
    for loader in ("conveyor", "webdataset", "torch"):
        rate, cost = ratio("images", loader, "bound"), ratio("images", loader, "bound", cpu)
        if rate and cost:
            lines.append(f"images: {loader} makes {rate:.0%} of the bound's items/s at {cost:.0%} of its CPU per item")
    if rate := ratio("parquet", "conveyor", "hf"):
        lines.append(held("parquet: conveyor's items/s over Hugging Face's", rate, 2))
    if rate := ratio("s3", "conveyor", "conveyor-map"):
        lines.append(held("s3: threadpool_map's items/s over map's", rate, 10))
    threads, processes = "conveyor-threads", "conveyor"
    if sooner := ratio("images", processes, threads, "first_item_ms"):
        lines.append(
            held("images: how much sooner thread workers' first batch comes than worker processes'", sooner, 10)
        )
    if memory := ratio("images", threads, processes, "peak_rss_mib"):
        lines.append(held("images: thread workers' peak RSS over worker processes'", memory, 1 / 3, at_least=False))
    if rate := ratio("images", threads, processes):
        lines.append(held("images: thread workers' items/s over worker processes'", rate, 0.9))
    for loader in ("conveyor", "conveyor-map", "bound"):
        if server := result.median("s3", loader, "server_cpu_us_per_item"):
            lines.append(
                f"s3: the server used {server:,.1f} µs of CPU per object under {loader} (not in the CPU column)"
            )
    return lines


SUITE = Suite(
    name="real_data",
    title="conveyor on real data formats, against webdataset, torch and Hugging Face",
    path=str(Path(__file__).resolve()),
    workloads=WORKLOADS,
    loaders=LOADERS,
    columns=("items_per_s", "cpu_us_per_item", "first_item_ms", "peak_pss_mib", "peak_rss_mib"),
    metrics={"server_cpu_us_per_item": ("S3 server CPU µs/item", "µs/item")},
    default_workloads=("images", "parquet", "s3"),
    prepare=prepare,
    notes=notes,
)


def main(argv: list[str] | None = None) -> int:
    return cli.main(SUITE, argv, " ".join((__doc__ or "").split("\n\n", 1)[0].split()))


if __name__ == "__main__":
    sys.exit(main())
