"""What leaving ``DataLoader2.stats()`` on costs: the same loader with ``collect_stats=True`` (the
default) and ``False``, alternating runs, medians of ``--repeats``.

Pipelines:

- ``demo``: the ``conveyor demo`` graph (shard files, decode, shuffle, augment, batch, collate)
  over a generated dataset of 4,096 images, in 2 worker processes and in-process.
- ``small``: ``IterableWrapper(range(N)).sharding_filter().map(f)`` in 2 worker processes.
- ``trivial``: ``IterableWrapper(range(N)).map(f)`` in-process, where an item costs a few hundred
  nanoseconds: the worst case, since counting an item costs tens of nanoseconds per stage.

Each run's wall time goes from ``iter()`` to the last item; its CPU time covers the whole run,
workers included (``getrusage`` of the process and its joined children). In the same run,
``torch.utils.data.DataLoader`` reads the same items (the ``IterableDataset`` classes of
``conveyor.tools.bench.torch_datasets``, ``batch_size=None``, as many workers), so the table
also shows conveyor with its default statistics against what users would pick instead.
Timings are never asserted anywhere.

    python benchmarks/bench_stats.py [--repeats R] [--torch-repeats R] [--items N] [--data-dir DIR]
        [--epochs K] [--pipelines demo,small,trivial]
    python benchmarks/bench_stats.py --sample-cost EPOCHS   # what sampling costs the demo, pull by pull
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conveyor import DataLoader2, InProcessReadingService, MultiProcessingReadingService
from conveyor.pipes import IterableWrapper
from conveyor.tools.bench.torch_datasets import DemoShards, ShardedRange
from conveyor.tools.demo import build_pipeline, prepare_dataset

#: The demo graph's defaults (``build_pipeline``), for torch's side.
DEMO_BATCH, DEMO_SHUFFLE_BUFFER, DEMO_SEED = 64, 1024, 0


def identity(x: int) -> int:
    return x


def cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def timed(make: Callable[[bool], DataLoader2], stats: bool, epochs: int = 1) -> tuple[float, float]:
    """(wall seconds from the first ``iter()`` to the last item of ``epochs`` epochs of one
    loader, CPU seconds of the whole run with its workers, counted once they are joined)."""
    cpu = cpu_seconds()
    loader = make(stats)
    try:
        start = time.perf_counter()
        for _ in range(epochs):
            for _ in loader:
                pass
        wall = time.perf_counter() - start
    finally:
        loader.shutdown()
    return wall, cpu_seconds() - cpu


def timed_torch(make: Callable[[], Any], epochs: int = 1) -> tuple[float, float]:
    """:func:`timed` for a torch ``DataLoader``: its workers are joined when each epoch's
    iterator is exhausted and dropped."""
    cpu = cpu_seconds()
    loader = make()
    start = time.perf_counter()
    for _ in range(epochs):
        for _ in loader:
            pass
    wall = time.perf_counter() - start
    return wall, cpu_seconds() - cpu


def sample_cost(data_dir: Path, epochs: int) -> str:
    """What sampling costs the in-process demo, measured pull by pull (CPU time), on one
    loader over ``epochs`` epochs (its sampling schedule runs on across them, as in
    training): the sampled pulls (``PullProfiler.pull``, which traces) against the median
    pull, and what they add to an epoch. Noise between runs does not enter: both kinds of
    pull are timed in the same epochs."""
    import conveyor.observe.pull_profiler as pull_profiler

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--items", type=int, default=200_000)
    parser.add_argument(
        "--torch-repeats",
        type=int,
        default=3,
        help="runs of torch's DataLoader per pipeline (its 2-worker small-int run takes ~20 s)",
    )
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument(
        "--epochs", type=int, default=1, help="epochs per loader (a loader's sampling schedule runs on across them)"
    )
    parser.add_argument("--pipelines", default=None, help="comma-separated names (default: all); e.g. demo")
    parser.add_argument(
        "--sample-cost",
        type=int,
        default=0,
        metavar="RUNS",
        help="only time sampled pulls over RUNS in-process demo epochs of one loader",
    )
    args = parser.parse_args(argv)
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="conveyor-bench-stats-")) / "data"
    prepare_dataset(data_dir, 16, 256)
    if args.sample_cost:
        print(sample_cost(data_dir, args.sample_cost))
        return 0

    def demo(workers: int) -> Callable[[bool], DataLoader2]:
        service = MultiProcessingReadingService(workers) if workers else InProcessReadingService()
        return lambda stats: DataLoader2(build_pipeline(data_dir), reading_service=service, collect_stats=stats)

    pipelines: dict[str, Callable[[bool], DataLoader2]] = {
        "demo, 2 workers": demo(2),
        "demo, in-process": demo(0),
        "small, 2 workers": lambda stats: DataLoader2(
            IterableWrapper(range(args.items)).sharding_filter().map(identity),
            reading_service=MultiProcessingReadingService(2),
            collect_stats=stats,
        ),
        "trivial, in-process": lambda stats: DataLoader2(
            IterableWrapper(range(args.items)).map(identity), collect_stats=stats
        ),
    }
    from torch.utils.data import DataLoader

    files = sorted(str(path) for path in data_dir.glob("*.npz"))
    torch_loaders: dict[str, Callable[[], Any]] = {
        "demo, 2 workers": lambda: DataLoader(
            DemoShards(files, DEMO_BATCH, DEMO_SHUFFLE_BUFFER, DEMO_SEED), batch_size=None, num_workers=2
        ),
        "demo, in-process": lambda: DataLoader(
            DemoShards(files, DEMO_BATCH, DEMO_SHUFFLE_BUFFER, DEMO_SEED), batch_size=None, num_workers=0
        ),
        "small, 2 workers": lambda: DataLoader(ShardedRange(args.items, identity), batch_size=None, num_workers=2),
        "trivial, in-process": lambda: DataLoader(ShardedRange(args.items, identity), batch_size=None, num_workers=0),
    }
    if args.pipelines:
        wanted = [w.strip() for w in args.pipelines.split(",")]
        pipelines = {name: make for name, make in pipelines.items() if any(name.startswith(w) for w in wanted)}
        if not pipelines:
            parser.error(f"--pipelines {args.pipelines!r} names none of: demo, small, trivial")
    print(
        f"stats overhead: collect_stats=True vs False, medians of {args.repeats} alternating runs each, "
        f"{args.epochs} epoch(s) per loader"
    )
    print(
        f"(torch: torch.utils.data.DataLoader on the same items, same run, median of {args.torch_repeats}; "
        "last column: its wall over conveyor's)"
    )
    print(
        "| pipeline | wall off (s) | wall on (s) | wall overhead | CPU off (s) | CPU on (s) | CPU overhead "
        "| CPU overhead by pair, median [quartiles] | CPU overhead, fastest runs | torch wall (s) | torch CPU (s) "
        "| conveyor (stats on) vs torch |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, make in pipelines.items():
        timed(make, True), timed(make, False), timed_torch(torch_loaders[name])  # warm-up, one epoch each
        # On and off alternate, each first in every other pair; torch's runs come after them:
        # torch's in-process runs leave its OpenMP threads spinning for a while, which the
        # next run in this process would pay for (it did: +11% for whichever came next).
        on, off = [], []
        for repeat in range(args.repeats):
            for stats in (True, False) if repeat % 2 == 0 else (False, True):
                (on if stats else off).append(timed(make, stats, args.epochs))
        torch_runs = [timed_torch(torch_loaders[name], args.epochs) for _ in range(args.torch_repeats)]
        wall_on, wall_off, wall_torch = (statistics.median(r[0] for r in runs) for runs in (on, off, torch_runs))
        cpu_on, cpu_off, cpu_torch = (statistics.median(r[1] for r in runs) for runs in (on, off, torch_runs))
        # Each pair ran back to back, so its ratio is less exposed to the machine's slow phases.
        ratios = [a[1] / b[1] - 1 for a, b in zip(on, off, strict=True)]
        low, middle, high = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
        print(
            f"| {name} | {wall_off:.3f} | {wall_on:.3f} | {wall_on / wall_off - 1:+.1%} | "
            f"{cpu_off:.3f} | {cpu_on:.3f} | {cpu_on / cpu_off - 1:+.1%} | {middle:+.1%} [{low:+.1%}, {high:+.1%}] | "
            f"{min(r[1] for r in on) / min(r[1] for r in off) - 1:+.1%} | "
            f"{wall_torch:.3f} | {cpu_torch:.3f} | {wall_torch / wall_on:.2f}x faster |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
