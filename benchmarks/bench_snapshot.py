"""What a checkpoint at every step costs: an epoch read with and without ``state_dict()``
(and its serialisation) after every batch, through conveyor's loaders and torchdata's
``StatefulDataLoader(snapshot_every_n_steps=1)``, 2 worker processes each (issue 30).

    bash benchmarks/peer_envs.sh nodes     # once: the venv with torchdata 0.11 (StatefulDataLoader)
    python benchmarks/bench_snapshot.py [--loaders conveyor-map,conveyor-iterable,...] [--repeats 5]
        [--batch-size 16] [--item-us 200 | --compute-size N] [--items N] [--save | --out PATH]
    python benchmarks/bench_snapshot.py --profile LOADER [--items N]   # cProfile of its calls

Every loader reads the same items with 2 worker processes (the default start method) in
batches of 16; item ``i`` is ``work.compute.compute(i)``: ``(i, x)``, ``x`` from a fixed
numpy op (FFT filtering) sized here for ``--item-us`` µs of CPU, so an epoch lasts a few
seconds of real work. The loaders:

- ``conveyor-map``: ``conveyor.DataLoader`` over a map-style ``Dataset``, ``shuffle=True``
  with a seeded ``torch.Generator``;
- ``conveyor-iterable``: ``conveyor.DataLoader`` over an ``IterableDataset`` that reads
  its worker's share (``get_worker_info()``), no state of its own;
- ``conveyor-dl2``: ``conveyor.DataLoader2`` over
  ``IterableWrapper(range(n)).shuffle().sharding_filter().map(compute).batch(16).collate()``
  with ``MultiProcessingReadingService(num_workers=2)``, seeded;
- ``torchdata-map``, ``torchdata-iterable``: torchdata's ``StatefulDataLoader`` with
  ``snapshot_every_n_steps=1`` (its default) over the same two datasets, run in the venv
  ``peer_envs.sh nodes`` makes.

Two workloads: ``epoch``, the epoch alone; ``snapshots``, after every batch ``state =
loader.state_dict()`` and its serialisation as a checkpoint would write it (conveyor's
state is plain JSON-safe data: ``json.dumps``; torchdata's holds tensors: ``torch.save``
into memory, as torch checkpoints do). torchdata's workers snapshot every step in both
(``snapshot_every_n_steps=1`` is a setting of the loader, not of the calls). Runs go
loader by loader, both workloads back to back, their order flipping every repeat.

What the ``snapshots`` rows add (medians over the repeats): the overhead, the epoch's
wall time and CPU over the ``epoch`` row's, less 1, and paired (each repeat's two runs
against each other, back to back); the time inside the calls as a share of the epoch's
wall time, and their CPU (the calling thread's) as a share of the epoch's CPU: the
direct cost, which noise between runs does not enter; each call's µs; the serialised
state's bytes. How every run is measured and checked: :mod:`harness`. ``--profile``
runs one epoch in this process instead, cProfile on around the calls only.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from conveyor.tools.bench.harness import cli
from conveyor.tools.bench.harness.declare import Context, Loader, Opened, Slot, Suite, Workload
from conveyor.tools.bench.harness.results import Metric, Result
from conveyor.tools.bench.harness.tally import Tally
from work.compute import (
    COMPUTE_SIZES,
    SIZE_VARIABLE,
    compute,
    expected_checksum,
    size_children_for,
    tally_for,
)

WORKERS = 2
BATCH_SIZE = 16
#: The issue's bound on what a state_dict() at every step may cost, % of the epoch's time.
TARGET_PCT = 2.0
#: The sampler's generator's seed (the same order in every run).
SHUFFLE_SEED = 1234
SERIALISERS = {"conveyor": "json.dumps", "torchdata": "torch.save"}


class Items(Dataset):
    """Map-style: item ``i`` is ``compute(i)``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, float]:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return compute(i)


class ItemStream(IterableDataset):
    """Iterable: each worker yields ``compute(i)`` for its share of ``range(n)``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[tuple[int, float]]:
        info = get_worker_info()
        first, step = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(first, self.n, step):
            yield compute(i)


def make_loader(key: str, n: int, batch_size: int) -> Any:
    """``key``'s loader over ``n`` items (imports only that loader's library)."""
    if key == "conveyor-dl2":
        from conveyor import DataLoader2, MultiProcessingReadingService
        from conveyor.pipes import IterableWrapper

        graph = IterableWrapper(range(n)).shuffle().sharding_filter().map(compute).batch(batch_size).collate()
        loader = DataLoader2(graph, reading_service=MultiProcessingReadingService(num_workers=WORKERS))
        loader.seed(SHUFFLE_SEED)
        return loader
    if key.startswith("conveyor-"):
        from conveyor import DataLoader as StatefulLoader

        extra: dict[str, Any] = {}
    else:
        from torchdata.stateful_dataloader import StatefulDataLoader as StatefulLoader

        extra = {"snapshot_every_n_steps": 1}
    if key.endswith("-map"):
        generator = torch.Generator()
        generator.manual_seed(SHUFFLE_SEED)
        dataset = Items(n)
        return StatefulLoader(
            dataset, batch_size=batch_size, shuffle=True, generator=generator, num_workers=WORKERS, **extra
        )
    return StatefulLoader(ItemStream(n), batch_size=batch_size, num_workers=WORKERS, **extra)


def serialiser(key: str) -> Callable[[Any], bytes]:
    if key.startswith("conveyor"):
        return lambda state: json.dumps(state).encode()

    def torch_save(state: Any) -> bytes:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        return buffer.getvalue()

    return torch_save


def open_loader(context: Context) -> Opened:
    """An epoch of the loader's batches, handed to the tally item by item; with snapshots,
    each batch followed by a ``state_dict()`` and its serialisation, both timed."""
    import warnings

    warnings.simplefilter("ignore")  # torchdata's deprecation warnings under this torch
    assert context.loader is not None
    key, snapshots = context.loader.key, context.workload.key == "snapshots"
    serialise = serialiser(key)
    main_cpu = time.process_time()
    loader = make_loader(key, context.items, context.settings["batch_size"])
    figures: dict[str, Any] = {"batches": 0, "calls": 0, "state_dict_s": 0.0, "state_dict_cpu_s": 0.0}
    figures.update(serialise_s=0.0, serialise_cpu_s=0.0)
    sizes: list[int] = []

    def items() -> Iterator[tuple[int, float]]:
        for ids, values in loader:
            figures["batches"] += 1
            yield from zip(ids.tolist(), values.tolist(), strict=True)
            if snapshots:
                wall0, cpu0 = time.perf_counter(), time.thread_time()
                state = loader.state_dict()
                wall1, cpu1 = time.perf_counter(), time.thread_time()
                sizes.append(len(serialise(state)))
                wall2, cpu2 = time.perf_counter(), time.thread_time()
                figures["calls"] += 1
                figures["state_dict_s"] += wall1 - wall0
                figures["state_dict_cpu_s"] += cpu1 - cpu0
                figures["serialise_s"] += wall2 - wall1
                figures["serialise_cpu_s"] += cpu2 - cpu1

    def close() -> None:
        if hasattr(loader, "shutdown"):  # conveyor's; torchdata's workers end with the epoch
            loader.shutdown()

    def extra() -> Mapping[str, float]:
        figures["main_cpu_s"] = time.process_time() - main_cpu
        figures["state_bytes"] = statistics.median(sizes) if sizes else None
        return figures

    return Opened(items(), close, extra)


def tally(context: Context) -> Tally:
    return tally_for("compute", context.items)


def checksum(context: Context) -> float:
    return expected_checksum("compute", context.items, context.settings.get("compute_size"))


def check(run: Mapping[str, Any]) -> list[str]:
    """Snapshot runs: a state after every batch."""
    figures = run["extra"]
    if run["workload"] == "snapshots" and figures["calls"] != figures["batches"]:
        return [f"{figures['calls']} state_dict() calls for {figures['batches']} batches"]
    return []


def warmup(items: int) -> int:
    return min(items, max(4 * WORKERS * BATCH_SIZE, items // 50))


def schedule(workloads: Sequence[Workload], loaders: Sequence[Loader], repeats: int) -> Iterator[Slot]:
    """Loader by loader, both workloads back to back, their order flipping every repeat."""
    for repeat in range(repeats):
        for loader in loaders:
            for workload in workloads if repeat % 2 == 0 else workloads[::-1]:
                yield Slot(repeat, workload, loader)


def call_metrics(m: dict[str, Metric], items: int) -> None:
    """A snapshot row's per-run figures of its calls, from its runs' raw figures in ``m``."""
    runs = range(len(m["wall_s"].values))

    def value(key: str, r: int) -> float:
        return m[key].values[r]

    def in_calls(r: int, cpu_too: bool = False) -> float:
        """The calls' share of the epoch: of its wall time, or of all its processes' CPU."""
        if cpu_too:
            cpu = value("cpu_us_per_item", r) * items / 1e6
            return (value("state_dict_cpu_s", r) + value("serialise_cpu_s", r)) / cpu * 100
        return (value("state_dict_s", r) + value("serialise_s", r)) / value("wall_s", r) * 100

    m["in_calls_pct"] = Metric.of([in_calls(r) for r in runs])
    m["in_calls_cpu_pct"] = Metric.of([in_calls(r, cpu_too=True) for r in runs])
    for key in ("state_dict", "serialise"):
        m[f"{key}_us"] = Metric.of([value(f"{key}_s", r) / value("calls", r) * 1e6 for r in runs])
        m[f"{key}_cpu_us"] = Metric.of([value(f"{key}_cpu_s", r) / value("calls", r) * 1e6 for r in runs])


def derive(result: Result) -> None:
    """The snapshot rows' overheads and per-call figures (see the module)."""
    for every in result.entries:
        off = result.entry("epoch", every.loader)
        if every.workload != "snapshots" or every.status != "ok" or off is None or off.status != "ok":
            continue
        m, o = every.metrics, off.metrics
        m["wall_overhead_pct"] = Metric((m["wall_s"].median / o["wall_s"].median - 1) * 100)
        m["cpu_overhead_pct"] = Metric((m["cpu_us_per_item"].median / o["cpu_us_per_item"].median - 1) * 100)
        if len(o["wall_s"].values) == len(m["wall_s"].values):  # no failed run: the i-th of each is repeat i's
            pairs = zip(m["wall_s"].values, o["wall_s"].values, strict=True)
            m["wall_overhead_paired_pct"] = Metric.of([(a / b - 1) * 100 for a, b in pairs])
        call_metrics(m, result.workloads["snapshots"]["items"])


def notes(result: Result) -> list[str]:
    """The issue's target per conveyor loader: a state after every batch costs at most 2%
    of the epoch, judged on the paired wall overhead and the calls' share of the CPU."""
    lines = []
    for entry in result.entries:
        if entry.workload != "snapshots" or not entry.loader.startswith("conveyor") or entry.status != "ok":
            continue
        in_calls = entry.metrics["in_calls_cpu_pct"].median
        paired = entry.metrics.get("wall_overhead_paired_pct")
        wall = paired.median if paired is not None else entry.metrics["wall_overhead_pct"].median
        held = "held" if max(wall, in_calls) <= TARGET_PCT else "missed"
        lines.append(
            f"target (<= {TARGET_PCT:g}% of the epoch): {entry.label}: wall {wall:+.1f}% (paired), CPU in calls "
            f"{in_calls:.1f}% of the epoch's: {held}"
        )
    return lines


def positive(kind: type) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    return parse


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch-size", type=positive(int), default=BATCH_SIZE, help=f"({BATCH_SIZE})")
    parser.add_argument("--item-us", type=positive(float), default=200.0, help="size the op for this many µs (200)")
    parser.add_argument("--compute-size", type=int, choices=COMPUTE_SIZES, help="the op's samples, instead")


def settings(options: argparse.Namespace) -> dict[str, Any]:
    """The batch size, and the op's size for ``--item-us`` here (or ``--compute-size``):
    every run gets it through the environment, which they inherit."""
    if options.compute_size:
        os.environ[SIZE_VARIABLE] = str(options.compute_size)
        return {"batch_size": options.batch_size, "compute_size": options.compute_size}
    size, seconds = size_children_for(options.item_us)
    print(f"item op: {size:,} samples, {seconds * 1e6:,.1f} µs per call here (--item-us {options.item_us:g})")
    return {"batch_size": options.batch_size, "compute_size": size, "op_us": round(seconds * 1e6, 1)}


def label(key: str, what: str) -> Loader:
    peer = key.startswith("torchdata")
    packages = ("torchdata", "torch") if peer else ("conveyor", "torch")
    return Loader(key, what, open_loader, venv="nodes" if peer else None, packages=packages)


DESCRIBE = "(i, x) items in batches of 16: x from numpy work sized for ~200 µs per item"
WORKLOADS = (
    Workload("epoch", 24_000, 96, DESCRIBE + ", no snapshots", tally, checksum, warmup=warmup),
    Workload(
        "snapshots",
        24_000,
        96,
        DESCRIBE + "; a state_dict() and its serialisation after every batch",
        tally,
        checksum,
        warmup=warmup,
    ),
)
LOADERS = (
    label("conveyor-map", "conveyor DataLoader, map-style, shuffle"),
    label("conveyor-iterable", "conveyor DataLoader, IterableDataset"),
    label("conveyor-dl2", "conveyor DataLoader2 + MultiProcessingReadingService"),
    label("torchdata-map", "torchdata StatefulDataLoader, map-style, shuffle"),
    label("torchdata-iterable", "torchdata StatefulDataLoader, IterableDataset"),
)
METRICS = {
    "wall_overhead_pct": ("overhead, wall", "Δ%"),
    "wall_overhead_paired_pct": ("overhead, wall, paired", "Δ%"),
    "cpu_overhead_pct": ("overhead, CPU (all processes)", "Δ%"),
    "in_calls_pct": ("in calls, % of epoch wall", "%"),
    "in_calls_cpu_pct": ("in calls, % of epoch CPU", "%"),
    "state_dict_us": ("µs per state_dict", "µs"),
    "state_dict_cpu_us": ("CPU µs per state_dict", "µs"),
    "serialise_us": ("µs per serialisation", "µs"),
    "serialise_cpu_us": ("CPU µs per serialisation", "µs"),
    "state_bytes": ("state bytes", "B"),
    "batches": ("batches", "count"),
    "calls": ("calls", "count"),
    "state_dict_s": ("s in state_dict", "s"),
    "state_dict_cpu_s": ("CPU s in state_dict", "s"),
    "serialise_s": ("s in serialisation", "s"),
    "serialise_cpu_s": ("CPU s in serialisation", "s"),
    "main_cpu_s": ("main process CPU s", "s"),
}
SUITE = Suite(
    name="snapshot",
    title="What a state_dict() at every step costs, 2 worker processes each",
    path=str(Path(__file__).resolve()),
    workloads=WORKLOADS,
    loaders=LOADERS,
    subject="conveyor-dl2",
    columns=(
        "wall_s",
        "wall_overhead_pct",
        "wall_overhead_paired_pct",
        "cpu_overhead_pct",
        "in_calls_pct",
        "in_calls_cpu_pct",
        "state_dict_us",
        "state_dict_cpu_us",
        "serialise_us",
        "serialise_cpu_us",
        "state_bytes",
    ),
    spread=(),
    ratio=None,
    metrics=METRICS,
    repeats=5,
    arguments=arguments,
    settings=settings,
    check=check,
    derive=derive,
    notes=notes,
    schedule=schedule,
)


def profile(key: str, n: int, top: int = 30) -> int:
    """One epoch of ``key`` in this process, a state_dict() and its serialisation after
    every batch, with cProfile on around those calls only; prints where they spend their
    time (the profiler inflates the cost of each Python call: compare shares, not totals)."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    serialise = serialiser(key)
    loader = make_loader(key, n, BATCH_SIZE)
    calls = 0
    try:
        for _batch in loader:
            profiler.enable()
            serialise(loader.state_dict())
            profiler.disable()
            calls += 1
    finally:
        if hasattr(loader, "shutdown"):
            loader.shutdown()
    print(f"{SUITE.loader(key).label}: {calls} calls of state_dict() and its serialisation, under cProfile")
    pstats.Stats(profiler, stream=sys.stdout).sort_stats("cumulative").print_stats(top)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--profile"]:
        parser = argparse.ArgumentParser(description="cProfile of one loader's state_dict() calls")
        parser.add_argument("--profile", choices=[loader.key for loader in LOADERS], required=True)
        parser.add_argument("--items", type=int, default=8_000)
        options = parser.parse_args(args)
        return profile(options.profile, options.items)
    return cli.main(SUITE, args, " ".join((__doc__ or "").split("\n\n", 1)[0].split()))


if __name__ == "__main__":
    sys.exit(main())
