"""Autotuning against hand-picked configurations (conveyor issue 17, section 5).

The contract: ``MultiProcessingReadingService(num_workers="auto", worker_prefetch_cnt="auto",
main_prefetch_cnt="auto")`` reaches, with no user input, within 10% of the throughput of
the best hand-picked configuration, and is never worse than today's default, on three
workloads:

- ``small``: ``IterableWrapper(range(N)).sharding_filter().map(identity)`` (``conveyor
  bench``'s "small"): what moving an item costs, nothing else.
- ``numpy``: the same over ``numpy_mib`` (1 MiB uint8 arrays, ``conveyor bench``'s "numpy").
- ``images``: ``image_pipeline()`` of ``benchmarks/bench_real_data.py`` (WebDataset shards
  of 256x256 JPEGs, decoded, cropped to 224x224, batches of 32 as tensors) over shards
  written by its ``write_shards`` before the runs (untimed).

The configurations, each run in a fresh process: hand-picked ``num_workers`` 0 (which is
today's default, built as ``MultiProcessingReadingService()``), 1, 2 (what most users
type) and, for numpy and images, 3 (one more than this machine's 2 cores; for the small
ints every worker count costs several times the in-process run's time), prefetch counts
at their defaults; one other prefetch setting with 2 workers (deep for the small items,
shallow for the large ones); and ``"auto"`` for all three values.

A run: a tiny untimed in-process warm-up of the same pipeline (imports, first calls),
then one loader reading ``--epochs`` epochs, timed from its creation to the end of the
last epoch *and its shutdown* (workers joined). Items/s over all epochs (the probe and
any trial epoch included), and over the last epoch alone (``iter()`` to the last item);
CPU is user + system of the run's process and its joined children over that span. Every
epoch is checked: every item once, in order, and its content (small: every int; numpy:
each array's shape and its first and last byte; images: each batch's labels and each
crop's fingerprint, with ``bench_real_data.ImageCheck``). For the auto runs the worker
count of each epoch and ``stats().tuning`` are recorded and printed. The tables give
medians over ``--repeats`` runs, which alternate between the configurations.

    python benchmarks/bench_autotune.py [--repeats R] [--epochs E] [--workloads small,numpy,images] [--quick]

Timings are never asserted anywhere; a run whose items are wrong fails its row (and the
exit code is 1).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.pipes import IterableWrapper
from conveyor.tools.bench.measure import cpu_seconds, end_new_processes
from conveyor.tools.bench.workloads import MIB, identity, numpy_mib

WORKLOADS = ("small", "numpy", "images")
#: Items per epoch (images: shards x images per shard), by default and with --quick.
SMALL_ITEMS, QUICK_SMALL_ITEMS = 400_000, 20_000
NUMPY_ITEMS, QUICK_NUMPY_ITEMS = 8_000, 300
SHARDS, PER_SHARD = 12, 96
QUICK_SHARDS, QUICK_PER_SHARD = 4, 32
#: The contract: auto within this share of the best hand-picked configuration's items/s.
WITHIN = 0.10
RUN_TIMEOUT_S = 300.0
AUTO = {"num_workers": "auto", "worker_prefetch_cnt": "auto", "main_prefetch_cnt": "auto"}


# --- the configurations -------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """One way to build the reading service: its key on a child's command line, its label
    in the table, its arguments, and whether it is a hand-picked one (auto is not)."""

    key: str
    label: str
    arguments: dict[str, Any]
    hand_picked: bool = True

    def service(self) -> MultiProcessingReadingService:
        return MultiProcessingReadingService(**self.arguments)


DEFAULT = Config("default", "num_workers=0: today's default, MultiProcessingReadingService()", {})
#: The other prefetch setting, per workload: deep for cheap small items, shallow for large ones.
VARIANTS = {
    "small": Config(
        "n2-deep",
        "num_workers=2, worker_prefetch_cnt=64, main_prefetch_cnt=1024",
        {"num_workers": 2, "worker_prefetch_cnt": 64, "main_prefetch_cnt": 1024},
    ),
    "numpy": Config(
        "n2-shallow",
        "num_workers=2, worker_prefetch_cnt=4, main_prefetch_cnt=4",
        {"num_workers": 2, "worker_prefetch_cnt": 4, "main_prefetch_cnt": 4},
    ),
    "images": Config(
        "n2-shallow",
        "num_workers=2, worker_prefetch_cnt=2, main_prefetch_cnt=2",
        {"num_workers": 2, "worker_prefetch_cnt": 2, "main_prefetch_cnt": 2},
    ),
}


#: The workloads where 3 workers (one more than this machine's cores) are tried: not the
#: small ints, where each worker count costs several times the in-process run's time.
THREE_WORKERS = ("numpy", "images")


def configs(workload: str) -> list[Config]:
    """``workload``'s configurations in the order runs alternate between them, auto last."""
    three = [Config("n3", "num_workers=3", {"num_workers": 3})] if workload in THREE_WORKERS else []
    return [
        DEFAULT,
        Config("n1", "num_workers=1", {"num_workers": 1}),
        Config("n2", "num_workers=2 (what most users type)", {"num_workers": 2}),
        *three,
        VARIANTS[workload],
        Config("auto", 'all three "auto"', AUTO, hand_picked=False),
    ]


# --- the workloads (in a child) -------------------------------------------------------------


def images_module() -> Any:
    """``benchmarks/bench_real_data.py`` (imported on demand: it imports torch)."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    import bench_real_data

    return bench_real_data


@dataclass
class Workload:
    """A workload in a child: its pipeline, and a fresh check of one epoch."""

    items: int  # per epoch (images: samples, not batches)
    pipeline: Callable[[], Any]
    epoch_check: Callable[[], EpochCheck]
    warm_up: Callable[[], Any]


class EpochCheck:
    """One epoch's check: :meth:`read` consumes the epoch's items (the consumer of the
    run, so it stays cheap), :meth:`problems` says what was wrong."""

    def read(self, items: Iterable[Any]) -> None:
        raise NotImplementedError

    def problems(self) -> list[str]:
        raise NotImplementedError


class IntsCheck(EpochCheck):
    """small: the epoch's items are exactly ``0 .. n-1`` in order (compared as one list)."""

    def __init__(self, expected: list[int]):
        self.expected = expected
        self.got: list[Any] = []

    def read(self, items: Iterable[Any]) -> None:
        self.got = list(items)

    def problems(self) -> list[str]:
        got, self.got = self.got, []
        if got == self.expected:
            return []
        if len(got) != len(self.expected):
            return [f"{len(got)} items, expected {len(self.expected)}"]
        if all(type(x) is int for x in got) and sorted(got) == self.expected:
            return ["every item once, but out of order"]
        wrong = next(i for i, (a, b) in enumerate(zip(got, self.expected, strict=True)) if a != b)
        return [f"item {wrong} is {got[wrong]!r}, expected {self.expected[wrong]}"]


class ArraysCheck(EpochCheck):
    """numpy: item ``p`` is a 1 MiB uint8 array whose first and last bytes are ``p % 251``;
    with the count, every item once (in order)."""

    def __init__(self, n: int):
        self.n = n
        self.count = 0
        self.wrong: list[str] = []

    def read(self, items: Iterable[Any]) -> None:
        count = 0
        for count, item in enumerate(items, 1):
            value = (count - 1) % 251
            if item.shape != (MIB,) or item.dtype != np.uint8 or item[0] != value or item[-1] != value:
                self.wrong.append(f"item {count - 1}: {item.dtype} {item.shape} {item[0]}..{item[-1]}")
        self.count = count

    def problems(self) -> list[str]:
        found = self.wrong[:3]
        if self.count != self.n:
            found.append(f"{self.count} items, expected {self.n}")
        return found


class BatchesCheck(EpochCheck):
    """images: ``bench_real_data.ImageCheck`` over every batch (labels, crop fingerprints,
    every image once, full batches)."""

    def __init__(self, make: Callable[[], Any]):
        self.check = make()

    def read(self, items: Iterable[Any]) -> None:
        for batch in items:
            self.check.see(batch)

    def problems(self) -> list[str]:
        try:
            self.check.finish()
        except Exception as error:  # CheckFailed, with what was wrong
            return [str(error)]
        return []


def range_pipeline(n: int, fn: Callable[[int], Any]) -> Any:
    return IterableWrapper(range(n)).sharding_filter().map(fn)


def make_workload(name: str, items: int, data: str) -> Workload:
    """``name``'s pipeline of ``items`` items per epoch; ``data``: the images' manifest."""
    if name == "small":
        expected = list(range(items))
        return Workload(
            items,
            lambda: range_pipeline(items, identity),
            lambda: IntsCheck(expected),
            lambda: range_pipeline(100, identity),
        )
    if name == "numpy":
        return Workload(
            items,
            lambda: range_pipeline(items, numpy_mib),
            lambda: ArraysCheck(items),
            lambda: range_pipeline(20, numpy_mib),
        )
    images = images_module()
    manifest = json.loads(Path(data).read_text())
    shards, prints = manifest["shards"], manifest["fingerprints"]
    expected = np.load(prints)
    count = manifest["items"]
    return Workload(
        count,
        lambda: images.image_pipeline(shards),
        lambda: BatchesCheck(lambda: images.ImageCheck(count, expected)),
        lambda: images.image_pipeline(shards[:1]).header(1),
    )


def child(workload_name: str, config_key: str, items: int, epochs: int, data: str) -> dict[str, Any]:
    """One run: the warm-up, then the timed loader over ``epochs`` epochs, checked."""
    workload = make_workload(workload_name, items, data)
    config = next(c for c in configs(workload_name) if c.key == config_key)
    warm = DataLoader2(workload.warm_up())
    for _ in warm:
        pass
    warm.shutdown()
    checks = [workload.epoch_check() for _ in range(epochs)]  # before the clock (the expected list)
    pipe = workload.pipeline()
    gc.collect()
    before = set(multiprocessing.active_children())
    epoch_s: list[float] = []
    workers: list[int] = []
    cpu, start = cpu_seconds(), time.perf_counter()
    loader = DataLoader2(pipe, reading_service=config.service())
    try:
        for check in checks:
            began = time.perf_counter()
            epoch = iter(loader)
            workers.append(int(loader.reading_service.num_workers))  # type: ignore[attr-defined]
            check.read(epoch)
            epoch_s.append(time.perf_counter() - began)
        tuning = loader.stats().tuning
        loader.shutdown()
        stray = end_new_processes(before)
        wall_s, cpu_s = time.perf_counter() - start, cpu_seconds() - cpu
    finally:
        loader.shutdown()
        end_new_processes(before)
    problems = [f"epoch {e}: {p}" for e, check in enumerate(checks) for p in check.problems()]
    if stray:
        problems.append(f"{stray} worker process(es) still running after the shutdown")
    return {
        "items": workload.items * epochs,
        "epoch_items": workload.items,
        "wall_s": wall_s,
        "cpu_s": cpu_s,
        "epoch_s": epoch_s,
        "workers": workers,
        "tuning": tuning,
        "problems": problems,
    }


# --- the parent -----------------------------------------------------------------------------


@dataclass
class Row:
    """One configuration of one workload: its runs, and the runs that failed."""

    config: Config
    runs: list[dict[str, Any]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def median(self, what: Callable[[dict[str, Any]], float]) -> float:
        return statistics.median(what(run) for run in self.runs) if self.runs else float("nan")

    @property
    def rate(self) -> float:
        """Items/s over all epochs: each run's items over its wall time, the median."""
        return self.median(lambda run: run["items"] / run["wall_s"])

    @property
    def last_rate(self) -> float:
        """Items/s of the last epoch alone (median)."""
        return self.median(lambda run: run["epoch_items"] / run["epoch_s"][-1])

    @property
    def cpu_s(self) -> float:
        return self.median(lambda run: run["cpu_s"])

    def epoch_rates(self) -> list[float]:
        """Median items/s of each epoch."""
        if not self.runs:
            return []
        return [
            statistics.median(run["epoch_items"] / run["epoch_s"][e] for run in self.runs)
            for e in range(len(self.runs[0]["epoch_s"]))
        ]

    @property
    def ok(self) -> bool:
        return bool(self.runs) and not self.failures


def run_in_child(
    workload: str, config: Config, items: int, epochs: int, data: str
) -> tuple[dict[str, Any] | None, str]:
    """One run in a fresh process: ``(result, '')`` or ``(None, why it failed)``."""
    command = [sys.executable, os.path.abspath(__file__), "--one", workload, config.key]
    command += ["--items", str(items), "--epochs", str(epochs), "--data", data]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return None, f"no result within {RUN_TIMEOUT_S:.0f} s"
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = [line for line in done.stderr.strip().splitlines() if line.strip()][-1:] or [""]
        return None, f"exit code {done.returncode}: {tail[0][:300]}"
    result = json.loads(lines[-1])
    if result["problems"]:
        return None, "; ".join(result["problems"][:3])
    return result, ""


def write_images(root: Path, shards: int, per_shard: int) -> Path:
    """The image workload's shards (``bench_real_data.write_shards``) and a manifest of them."""
    images = images_module()
    parts, prints = images.write_shards(root, images.Sizes(shards, per_shard, 0, 0))
    manifest = root / "images.json"
    timed = parts["timed"]
    manifest.write_text(json.dumps({"shards": timed.sources, "items": timed.items, "fingerprints": prints}))
    return manifest


def measure(workload: str, items: int, epochs: int, repeats: int, data: str) -> list[Row]:
    """Every configuration of ``workload``, ``repeats`` runs each, alternating."""
    rows = [Row(config) for config in configs(workload)]
    for repeat in range(repeats):
        for row in rows:
            result, why = run_in_child(workload, row.config, items, epochs, data)
            if result is None:
                row.failures.append(f"run {repeat + 1}: {why}")
                progress = f"FAILED: {why}"
            else:
                row.runs.append(result)
                progress = f"{result['wall_s']:.2f} s, workers by epoch {result['workers']}"
            print(f"  {workload} {row.config.key} run {repeat + 1}: {progress}", file=sys.stderr, flush=True)
    return rows


def best_of(rows: Sequence[Row], rate: Callable[[Row], float]) -> Row | None:
    """The hand-picked row with the highest ``rate`` (among those that ran)."""
    picked = [row for row in rows if row.config.hand_picked and row.runs]
    return max(picked, key=rate) if picked else None


def table(workload: str, rows: Sequence[Row]) -> list[str]:
    """The workload's Markdown table and its verdict lines."""
    best = best_of(rows, lambda row: row.rate)
    best_last = best_of(rows, lambda row: row.last_rate)
    lines = [
        "| configuration | items/s (all epochs) | items/s (last epoch) | CPU s | vs best (all) | vs best (last) "
        "| workers by epoch | items/s by epoch | runs ok |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if row.runs:
            vs = f"{row.rate / best.rate:.3f}" if best else ""
            vs_last = f"{row.last_rate / best_last.rate:.3f}" if best_last else ""
            workers = " / ".join(",".join(str(n) for n in run["workers"]) for run in row.runs)
            by_epoch = ", ".join(f"{rate:,.0f}" for rate in row.epoch_rates())
            cells = [f"{row.rate:,.0f}", f"{row.last_rate:,.0f}", f"{row.cpu_s:.2f}", vs, vs_last, workers, by_epoch]
        else:
            cells = ["failed", "", "", "", "", "", ""]
        runs = f"{len(row.runs)}/{len(row.runs) + len(row.failures)}"
        label = row.config.label + (" **best**" if row is best else "")
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {runs} |")
    return lines + verdict(workload, rows, best, best_last)


def verdict(workload: str, rows: Sequence[Row], best: Row | None, best_last: Row | None) -> list[str]:
    """Whether auto met the contract here: within 10% of the best, not below the default."""
    auto = next(row for row in rows if not row.config.hand_picked)
    default = next(row for row in rows if row.config is DEFAULT)
    if not (auto.runs and default.runs and best and best_last):
        return [f"{workload}: not judged (a configuration failed)"]
    ratio, last = auto.rate / best.rate, auto.last_rate / best_last.rate
    to_default = auto.rate / default.rate
    held = ratio >= 1 - WITHIN
    return [
        f"{workload}: auto is {ratio:.3f}x the best hand-picked ({best.config.label}) over all epochs: "
        f"{'within' if held else 'NOT within'} {WITHIN:.0%}; last epoch {last:.3f}x the best last epoch "
        f"({best_last.config.label}): {'within' if last >= 1 - WITHIN else 'NOT within'} {WITHIN:.0%}",
        f"{workload}: auto is {to_default:.3f}x today's default over all epochs: "
        f"{'not worse' if to_default >= 1 else 'WORSE'} (last epoch {auto.last_rate / default.last_rate:.3f}x)",
    ]


def tuning_lines(workload: str, rows: Sequence[Row]) -> list[str]:
    """What auto chose in each run, and from what (``stats().tuning``)."""
    auto = next(row for row in rows if not row.config.hand_picked)
    lines = []
    for index, run in enumerate(auto.runs, 1):
        t = run["tuning"] or {}
        probe = t.get("probe", {})
        rates = ", ".join(f"{run['epoch_items'] / s:,.0f}" for s in run["epoch_s"])
        measured = ", ".join(f"{n}: {rate:,.0f}/s" for n, rate in t.get("measured_items_s", {}).items())
        predicted = t.get("predicted_items_s")
        lines.append(
            f"- {workload} auto run {index}: workers by epoch {run['workers']} at {rates} items/s; final choice "
            f"num_workers={t.get('num_workers')}, worker_prefetch_cnt={t.get('worker_prefetch_cnt')}, "
            f"main_prefetch_cnt={t.get('main_prefetch_cnt')}, predicted {predicted or 0:,.0f}/s; probe "
            f"{probe.get('items', 0)} items, {probe.get('item_s', 0) * 1e6:.1f} us and "
            f"{probe.get('item_bytes', 0) / 1024:,.0f} KiB per item; measured by the tuner {{{measured}}}; "
            f"why: {t.get('why', '')}"
        )
    return lines


def commit() -> str:
    """The repository's commit, with '+dirty' when the working tree differs from it."""
    here = str(Path(__file__).resolve().parent)
    try:
        head = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(
            ["git", "-C", here, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
        )
    except OSError:
        return "unknown"
    return (head.stdout.strip() or "unknown") + ("+dirty" if dirty.stdout.strip() else "")


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, run, print the tables; returns the exit code (1: a run failed)."""
    parser = argparse.ArgumentParser(description=" ".join((__doc__ or "").split("\n\n", 1)[0].split()))
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, of {','.join(WORKLOADS)}")
    parser.add_argument(
        "--repeats", type=int, default=None, help="fresh-process runs per configuration (3; --quick: 1)"
    )
    parser.add_argument("--epochs", type=int, default=3, help="epochs per run (3)")
    parser.add_argument("--quick", action="store_true", help="small sizes, one run per configuration")
    parser.add_argument("--one", nargs=2, metavar=("WORKLOAD", "CONFIG"), help=argparse.SUPPRESS)
    parser.add_argument("--items", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--data", default="", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.one:
        print(json.dumps(child(*options.one, options.items, options.epochs, options.data)))
        return 0
    keys = [k for k in options.workloads.split(",") if k]
    if not keys or any(k not in WORKLOADS for k in keys):
        parser.error(f"--workloads: choose from {','.join(WORKLOADS)}, got {options.workloads!r}")
    repeats = options.repeats or (1 if options.quick else 3)
    if repeats < 1 or options.epochs < 1:
        parser.error("--repeats and --epochs must be >= 1")
    quick = options.quick
    items = {
        "small": QUICK_SMALL_ITEMS if quick else SMALL_ITEMS,
        "numpy": QUICK_NUMPY_ITEMS if quick else NUMPY_ITEMS,
    }
    shards, per_shard = (QUICK_SHARDS, QUICK_PER_SHARD) if quick else (SHARDS, PER_SHARD)
    print(
        f"# bench_autotune: {datetime.datetime.now().isoformat(timespec='minutes')}, commit {commit()}, "
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}, "
        f"start method {multiprocessing.get_start_method()}"
    )
    print(
        f"settings: workloads={','.join(keys)} epochs={options.epochs} repeats={repeats} small={items['small']:,} "
        f"numpy={items['numpy']:,} images={shards}x{per_shard}={shards * per_shard:,} per epoch; "
        f"load {os.getloadavg()[0]:.2f} at the start"
    )
    started = time.perf_counter()
    failed = False
    with tempfile.TemporaryDirectory(prefix="bench_autotune-") as tmp:
        data = str(write_images(Path(tmp), shards, per_shard)) if "images" in keys else ""
        for key in keys:
            rows = measure(key, items.get(key, 0), options.epochs, repeats, data)
            per_epoch = items.get(key, shards * per_shard)
            unit = " (images, in batches of 32)" if key == "images" else ""
            print(f"\n## {key}: {per_epoch:,} items{unit} per epoch, {options.epochs} epochs, medians of {repeats}")
            print("\n".join(table(key, rows)))
            if key == "images":
                print("(the loader's items are batches of 32: the tuner's rates below are batches/s, not images/s)")
            print("\n".join(tuning_lines(key, rows)))
            for row in rows:
                for failure in row.failures:
                    print(f"- FAILED {key} {row.config.key}: {failure}")
            failed = failed or not all(row.ok for row in rows)
    print(
        "\nitems/s (all epochs): items of all epochs over the wall time from the loader's creation to its "
        "shutdown (the probe and trial epochs included); last epoch: iter() to its last item; by epoch: each "
        "epoch's iter() to its last item (epoch 0 includes the loader's start: workers, auto's probe); CPU s: "
        "the run's process and its joined workers; vs best: over the best hand-picked row's (by that column); "
        "workers by epoch: each run's, runs separated by /. Medians over the runs."
    )
    print(f"load {os.getloadavg()[0]:.2f} at the end; {time.perf_counter() - started:.0f} s")
    print("verification FAILED: see the failed runs above" if failed else "verification passed for every run")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
