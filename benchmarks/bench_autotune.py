"""Autotuning against hand-picked configurations (conveyor issue 17, section 5).

    python benchmarks/bench_autotune.py [--workloads small,numpy,images] [--loaders w0,w1,...]
        [--epochs 3] [--repeats 3] [--quick] [--save | --out PATH]

The contract: ``MultiProcessingReadingService(num_workers="auto", worker_prefetch_cnt="auto",
main_prefetch_cnt="auto")`` reaches, with no user input, within 10% of the throughput of
the best hand-picked configuration, and is never worse than today's default, on three
workloads:

- ``small``: ``IterableWrapper(range(N)).sharding_filter().map(identity)``: what moving an
  item costs, nothing else;
- ``numpy``: the same over 1 MiB uint8 arrays (``np.full(1 << 20, i % 251)``);
- ``images``: the JPEG pipeline of ``bench_real_data.py`` (:mod:`work.images`; WebDataset
  shards of 256x256 JPEGs, decoded, cropped to 224x224, batches of 32 as tensors).

The configurations (the loaders): ``w0``, today's default (``MultiProcessingReadingService()``,
reading in the calling process); ``w1``, ``w2`` (what most users type) and, for numpy and
images, ``w3`` (one more than a 2-core machine's cores; for the small ints every worker
count costs several times the in-process run's time), prefetch counts at their defaults;
``w2-deep`` (small: ``worker_prefetch_cnt=64, main_prefetch_cnt=1024``) or ``w2-shallow``
(numpy: 4 and 4; images: 2 and 2); and ``auto``, all three values ``"auto"``.

A run reads ``--epochs`` epochs with one loader, timed from its creation to the end of
its last epoch and its shutdown (the probe and any trial epoch included); every epoch is
checked (every item once and in order, its content). Each run records its workers per
epoch and, for ``auto``, ``stats().tuning``. How every run is measured: :mod:`harness`.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from conveyor.tools.bench.harness import cli
from conveyor.tools.bench.harness.declare import Context, Loader, Opened, Suite, Workload
from conveyor.tools.bench.harness.results import Metric, Result
from conveyor.tools.bench.harness.tally import Tally

MIB = 1 << 20
#: images: shards of images per epoch, full and --quick.
SHARDS, PER_SHARD, QUICK_SHARDS, QUICK_PER_SHARD = 12, 96, 4, 32
#: The contract: auto within this share of the best hand-picked configuration's items/s.
WITHIN = 0.10
#: The most workers any configuration may use (the images' partial batches: one per worker).
MAX_WORKERS = 4
AUTO = {"num_workers": "auto", "worker_prefetch_cnt": "auto", "main_prefetch_cnt": "auto"}
CONFIGS: dict[str, dict[str, Any]] = {
    "w0": {},
    "w1": {"num_workers": 1},
    "w2": {"num_workers": 2},
    "w3": {"num_workers": 3},
    "w2-deep": {"num_workers": 2, "worker_prefetch_cnt": 64, "main_prefetch_cnt": 1024},
    "w2-shallow": {"num_workers": 2, "worker_prefetch_cnt": 4, "main_prefetch_cnt": 4},
    "auto": AUTO,
}
#: The images' batches are larger: their shallow setting is shallower.
SHALLOW_IMAGES = {"num_workers": 2, "worker_prefetch_cnt": 2, "main_prefetch_cnt": 2}


def identity(i: int) -> int:
    return i


def numpy_mib(i: int) -> np.ndarray:
    """1 MiB whose every byte is ``i % 251``."""
    return np.full(MIB, i % 251, dtype=np.uint8)


class OrderedTally(Tally):
    """small and numpy: the epoch's items in order, item ``p`` being ``p``'s (an int, or an
    array whose first and last bytes are ``p % 251``)."""

    def __init__(self, n: int, times: int, arrays: bool) -> None:
        super().__init__(n, times)
        self.arrays = arrays

    def see(self, item: Any) -> None:
        position = self.count % self.n
        self.count += 1
        if self.arrays:
            value = position % 251
            ok = item.shape == (MIB,) and item.dtype == np.uint8 and item[0] == value and item[-1] == value
        else:
            ok = type(item) is int and item == position
        if not ok:
            return self.wrong(item if not self.arrays else f"{item.dtype} {item.shape}", f"item {position}, in order")
        self.id(position)
        return None


def images_of(context: Context) -> dict[str, Any]:
    import json

    return json.loads(Path(context.settings["images"]).read_text())


def tally(context: Context) -> Tally:
    times = 1 if context.warmup else context.settings["epochs"]
    if context.workload.key != "images":
        return OrderedTally(context.items, times, context.workload.key == "numpy")
    from work import images

    return images.ImageTally(context.items, np.load(images_of(context)["fingerprints"]), MAX_WORKERS, times)


def pipeline(context: Context) -> Any:
    from conveyor.pipes import IterableWrapper

    key = context.workload.key
    if key == "images":
        from work import images

        shards = images_of(context)["shards"]
        return images.image_pipeline(shards[:1] if context.warmup else shards)
    fn = identity if key == "small" else numpy_mib
    return IterableWrapper(range(context.items)).sharding_filter().map(fn)


def open_config(context: Context) -> Opened:
    """The configuration's loader over ``--epochs`` epochs (one for a warm-up), each
    epoch's time and worker count recorded."""
    from conveyor import DataLoader2, MultiProcessingReadingService

    assert context.loader is not None
    key = context.loader.key
    arguments = SHALLOW_IMAGES if key == "w2-shallow" and context.workload.key == "images" else CONFIGS[key]
    loader = DataLoader2(pipeline(context), reading_service=MultiProcessingReadingService(**arguments))
    epochs = 1 if context.warmup else context.settings["epochs"]
    seconds: list[float] = []
    workers: list[int] = []
    found: dict[str, Any] = {}

    def items() -> Iterator[Any]:
        for _ in range(epochs):
            began = time.perf_counter()
            epoch = iter(loader)
            workers.append(int(loader.reading_service.num_workers))  # type: ignore[attr-defined]
            yield from epoch
            seconds.append(time.perf_counter() - began)

    def close() -> None:
        found["tuning"] = loader.stats().tuning  # before the shutdown ends the pool
        loader.shutdown()

    def extra() -> Mapping[str, Any]:
        per_epoch = context.items / seconds[-1] if seconds else None
        return {**found, "last_epoch_items_per_s": per_epoch, "epoch_s": seconds, "workers": workers}

    return Opened(items(), close, extra)


@contextlib.contextmanager
def prepare(options: argparse.Namespace, settings: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The image workload's shards (untimed), in a temporary directory removed at the end."""
    if "images" not in options.workloads:
        yield {}
        return
    import json

    from work import images

    with tempfile.TemporaryDirectory(prefix="bench_autotune-") as tmp:
        shards, per_shard = (QUICK_SHARDS, QUICK_PER_SHARD) if options.quick else (SHARDS, PER_SHARD)
        paths, prints = images.write_shards(Path(tmp), shards, per_shard)
        manifest = Path(tmp) / "images.json"
        manifest.write_text(json.dumps({"shards": paths, "fingerprints": prints, "per_shard": per_shard}))
        yield {"images": str(manifest)}


def epochs(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--epochs", type=epochs, default=3, help="epochs per run (3)")


def settings(options: argparse.Namespace) -> dict[str, Any]:
    return {"epochs": options.epochs}


def derive(result: Result) -> None:
    """Each configuration's items/s (all epochs, and the last) over the best hand-picked one's."""
    for workload in result.workloads:
        entries = [e for e in result.entries if e.workload == workload and e.status == "ok"]
        picked = [e for e in entries if e.loader != "auto"]
        for metric, key in (("items_per_s", "vs_best"), ("last_epoch_items_per_s", "vs_best_last")):
            ranked = [e for e in picked if metric in e.metrics]
            if not ranked:
                continue
            best = max(ranked, key=lambda e: e.metrics[metric].median).metrics[metric].median
            for entry in entries:
                if metric in entry.metrics:
                    entry.metrics[key] = Metric(entry.metrics[metric].median / best)


def notes(result: Result) -> list[str]:
    """Whether auto met the contract per workload, and what it chose in each run."""
    lines = []
    for workload in result.workloads:
        auto, default = result.entry(workload, "auto"), result.entry(workload, "w0")
        if auto is None or default is None or auto.status != "ok" or default.status != "ok":
            lines.append(f"{workload}: not judged (auto or the default did not run)")
            continue
        ratio, last = auto.metrics["vs_best"].median, auto.metrics["vs_best_last"].median
        to_default = auto.metrics["items_per_s"].median / default.metrics["items_per_s"].median
        lines.append(
            f"{workload}: auto is {ratio:.3f}x the best hand-picked configuration over all epochs "
            f"({'within' if ratio >= 1 - WITHIN else 'NOT within'} {WITHIN:.0%}), {last:.3f}x over the last; "
            f"{to_default:.3f}x today's default ({'not worse' if to_default >= 1 else 'WORSE'})"
        )
        for index, run in enumerate(auto.details, 1):
            tuning = run.get("tuning") or {}
            lines.append(
                f"{workload}, auto run {index}: workers by epoch {run.get('workers')}; chose num_workers="
                f"{tuning.get('num_workers')}, worker_prefetch_cnt={tuning.get('worker_prefetch_cnt')}, "
                f"main_prefetch_cnt={tuning.get('main_prefetch_cnt')}; why: {tuning.get('why', '')}"
            )
    return lines


WORKLOADS = (
    Workload("small", 400_000, 20_000, "ints per epoch, identity", tally, warmup=lambda n: min(n, 1_000)),
    Workload("numpy", 8_000, 300, "1 MiB uint8 arrays per epoch", tally, warmup=lambda n: min(n, 20)),
    Workload(
        "images",
        SHARDS * PER_SHARD,
        QUICK_SHARDS * QUICK_PER_SHARD,
        "JPEGs per epoch, decoded and cropped, in batches of 32",
        tally,
        unit="images",
        warmup=lambda n: PER_SHARD if n == SHARDS * PER_SHARD else QUICK_PER_SHARD,
    ),
)
LOADERS = (
    Loader("w0", "num_workers=0: today's default", open_config, packages=("conveyor",)),
    Loader("w1", "num_workers=1", open_config, packages=("conveyor",)),
    Loader("w2", "num_workers=2 (what most users type)", open_config, packages=("conveyor",)),
    Loader("w3", "num_workers=3", open_config, workloads=("numpy", "images"), packages=("conveyor",)),
    Loader("w2-deep", "num_workers=2, prefetch 64 / 1024", open_config, workloads=("small",), packages=("conveyor",)),
    Loader(
        "w2-shallow",
        "num_workers=2, prefetch 4 / 4 (images: 2 / 2)",
        open_config,
        workloads=("numpy", "images"),
        packages=("conveyor",),
    ),
    Loader("auto", 'all three "auto"', open_config, packages=("conveyor",)),
)
SUITE = Suite(
    name="autotune",
    title="Autotuning against hand-picked configurations",
    path=str(Path(__file__).resolve()),
    workloads=WORKLOADS,
    loaders=LOADERS,
    subject="auto",
    columns=("items_per_s", "last_epoch_items_per_s", "cpu_us_per_item", "vs_best", "vs_best_last"),
    metrics={
        "last_epoch_items_per_s": ("items/s, last epoch", "items/s"),
        "vs_best": ("vs the best hand-picked", "x"),
        "vs_best_last": ("vs the best, last epoch", "x"),
    },
    arguments=arguments,
    settings=settings,
    prepare=prepare,
    derive=derive,
    notes=notes,
)


def main(argv: list[str] | None = None) -> int:
    return cli.main(SUITE, argv, " ".join((__doc__ or "").split("\n\n", 1)[0].split()))


if __name__ == "__main__":
    sys.exit(main())
