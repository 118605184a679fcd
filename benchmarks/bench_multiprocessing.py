"""Multi-process throughput: conveyor's ``DataLoader2`` + ``MultiProcessingReadingService`` against
``torch.utils.data.DataLoader`` and torchdata 0.7.1's ``DataLoader2``, with ``W`` worker processes each.

Every loader reads ``range(N)`` sharded across its workers and mapped by a module-level function:

- ``small``: 200,000 ints, identity. The per-item cost of moving an item between processes.
- ``numpy``: 2,000 numpy arrays of 1 MiB (``np.full(1 << 20, i % 251, uint8)``). Bulk data.
- ``tensor``: 2,000 torch tensors of 1 MiB (``torch.full``). Bulk data, torch's own sharing path.

Each run is timed from the loader's creation to its last item *and its shutdown* (workers
joined), and also to its first item. CPU time is the process's own plus its joined children's
(``getrusage``), divided by the items. Every run is checked: item count; value, type and
contents of a few items at known positions; the last item once more after shutdown. Runs
alternate between loaders (conveyor, torch, torchdata, conveyor, ...) after one small warm-up
run each, and the tables report medians. A loader whose run would take more than
``--cap-seconds`` (estimated from its warm-up) reads fewer items per run, and says so.

    python benchmarks/bench_multiprocessing.py [--workloads small,numpy,tensor] [--workers W]
        [--repeats R] [--quick] [--cap-seconds S]

torchdata is optional: its rows say ``unavailable: <reason>`` when it cannot be imported and
``failed: <reason>`` when it breaks at run time. Timings are never asserted anywhere.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import math
import multiprocessing
import os
import platform
import resource
import statistics
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

try:
    import torch
    from torch.utils.data import IterableDataset, get_worker_info

    TORCH_ERROR = ""
except Exception as err:  # ImportError, or a broken install
    torch = None  # type: ignore[assignment]
    IterableDataset = object  # type: ignore[assignment,misc]
    TORCH_ERROR = f"{type(err).__name__}: {err}"

CONVEYOR = "conveyor DataLoader2"
MIB = 1 << 20
#: ``Result.error`` texts longer than this are shortened in the table (stderr has the whole traceback).
MAX_REASON = 100

Make = Callable[["Workload", int, int], tuple[Iterable[Any], Callable[[], None]]]


# --- workloads: module-level, so they pickle under every start method ------------------------


def identity(i: int) -> int:
    return i


def numpy_mib(i: int) -> np.ndarray:
    return np.full(MIB, i % 251, dtype=np.uint8)


def tensor_mib(i: int) -> Any:
    return torch.full((MIB,), i % 251, dtype=torch.uint8)


@dataclass(frozen=True)
class Workload:
    name: str
    fn: Callable[[int], Any]
    items: int  # per run
    quick_items: int  # per run with --quick
    kind: str  # "int", "ndarray" or "tensor"
    describe: str

    @property
    def mib_per_item(self) -> int:
        return 0 if self.kind == "int" else 1


WORKLOADS = {
    w.name: w
    for w in (
        Workload("small", identity, 200_000, 20_000, "int", "ints, fn = identity"),
        Workload("numpy", numpy_mib, 2_000, 200, "ndarray", "numpy uint8 arrays of 1 MiB, fn = np.full"),
        Workload("tensor", tensor_mib, 2_000, 200, "tensor", "torch uint8 tensors of 1 MiB, fn = torch.full"),
    )
}


def check_item(kind: str, item: Any, position: int) -> str | None:
    """None if ``item`` is the ``kind`` of item expected at ``position`` (loaders keep order), else why not."""
    if kind == "int":
        if type(item) is int and item == position:
            return None
        return f"item {position} is {item!r}, expected {position}"
    expected = position % 251
    if kind == "tensor":
        if torch is None or not isinstance(item, torch.Tensor):
            return f"item {position} is a {type(item).__name__}, expected a torch.Tensor"
        array = item.numpy()
    else:
        if not isinstance(item, np.ndarray):
            return f"item {position} is a {type(item).__name__}, expected a numpy.ndarray"
        array = item
    if array.dtype != np.uint8 or array.shape != (MIB,):
        return f"item {position} has dtype {array.dtype} and shape {array.shape}, expected uint8 ({MIB},)"
    if array[0] != expected or array.min() != expected or array.max() != expected:
        return f"item {position} holds {array[0]}..{array.min()}..{array.max()}, expected {expected} throughout"
    return None


def sample_positions(n: int) -> set[int]:
    """A few positions whose items are checked in full during the run."""
    return {p for p in (0, 1, n // 3, n // 2 + 1, n - 2, n - 1) if 0 <= p < n}


# --- loaders -----------------------------------------------------------------------------------


class ShardedRange(IterableDataset):
    """``fn(i)`` for this worker's share of ``range(n)``: what ``sharding_filter().map(fn)`` yields."""

    def __init__(self, n: int, fn: Callable[[int], Any]):
        self.n, self.fn = n, fn

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker_id, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return map(self.fn, range(worker_id, self.n, num_workers))


@dataclass
class Candidate:
    """A loader under test: ``make(workload, n, workers)`` builds it (timed) and returns
    ``(iterable, shutdown)``."""

    name: str
    make: Make | None
    unavailable: str = ""
    required: bool = True  # a failure makes main() return 1
    numpy_as_tensor: bool = False  # hands numpy arrays over as torch tensors

    def kind(self, workload: Workload) -> str:
        """The kind of item this loader yields for ``workload``."""
        return "tensor" if self.numpy_as_tensor and workload.kind == "ndarray" else workload.kind


def _conveyor(workload: Workload, n: int, workers: int) -> tuple[Iterable[Any], Callable[[], None]]:
    from conveyor import DataLoader2, MultiProcessingReadingService
    from conveyor.pipes import IterableWrapper

    pipe = IterableWrapper(range(n)).sharding_filter().map(workload.fn)
    loader = DataLoader2(pipe, reading_service=MultiProcessingReadingService(num_workers=workers))
    return loader, loader.shutdown


def _nothing() -> None:
    pass


def _torch(workload: Workload, n: int, workers: int) -> tuple[Iterable[Any], Callable[[], None]]:
    from torch.utils.data import DataLoader

    # Workers are joined when the iterator is deleted (time_once drops it before calling the
    # shutdown), and already when it is exhausted since persistent_workers is off.
    return DataLoader(ShardedRange(n, workload.fn), num_workers=workers, batch_size=None), _nothing


def _torch_candidate() -> Candidate:
    if torch is None:
        return Candidate("torch DataLoader", None, f"unavailable: {TORCH_ERROR}")
    # batch_size=None still applies default_convert, which turns numpy arrays into tensors.
    return Candidate(f"torch {torch.__version__} DataLoader", _torch, numpy_as_tensor=True)


def _torchdata_candidate() -> Candidate:
    name = "torchdata 0.7.1 DataLoader2"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torchdata announces its deprecation on import
            import torchdata
            from torchdata.dataloader2 import DataLoader2, MultiProcessingReadingService
            from torchdata.datapipes.iter import IterableWrapper
    except Exception as err:  # ImportError, or torchdata failing against this torch
        return Candidate(name, None, f"unavailable: {type(err).__name__}: {err}", required=False)
    name = f"torchdata {getattr(torchdata, '__version__', '?')} DataLoader2"

    def make(workload: Workload, n: int, workers: int) -> tuple[Iterable[Any], Callable[[], None]]:
        pipe = IterableWrapper(range(n)).sharding_filter().map(workload.fn)
        loader = DataLoader2(pipe, reading_service=MultiProcessingReadingService(num_workers=workers))
        return loader, loader.shutdown

    return Candidate(name, make, required=False)


def candidates() -> list[Candidate]:
    return [Candidate(CONVEYOR, _conveyor), _torch_candidate(), _torchdata_candidate()]


# --- measuring ---------------------------------------------------------------------------------


class Run(NamedTuple):
    wall_s: float  # creation to last item, shutdown included
    first_s: float  # creation to first item
    cpu_s: float  # own + joined children's user+sys CPU


def cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class CheckFailed(RuntimeError):
    pass


def time_once(candidate: Candidate, workload: Workload, n: int, workers: int) -> Run:
    """One checked run of ``n`` items; raises :class:`CheckFailed` when the items are wrong."""
    assert candidate.make is not None
    kind = candidate.kind(workload)
    gc.collect()  # the previous run's garbage is not this run's work
    wanted = {p + 1 for p in sample_positions(n)}  # as 1-based counts
    problems: list[str] = []
    cpu_start = cpu_seconds()
    start = time.perf_counter()
    loader, shutdown = candidate.make(workload, n, workers)
    iterator: Iterator[Any] | None = None
    shut = False
    count, first_s, item = 0, math.nan, None
    try:
        iterator = iter(loader)
        for item in iterator:  # the first item alone, to time it
            first_s = time.perf_counter() - start
            count = 1
            problems.append(check_item(kind, item, 0) or "")
            break
        for count, item in enumerate(iterator, 2):  # the last item stays in item: checked below
            if count in wanted:
                problems.append(check_item(kind, item, count - 1) or "")
        iterator = None  # torch: deleting the iterator joins its workers
        shutdown()
        shut = True
        stray = multiprocessing.active_children()  # also reaps exited children, so their CPU counts
        wall_s = time.perf_counter() - start
    finally:
        iterator = None
        if not shut:
            shutdown()
    if stray:
        problems.append(f"{len(stray)} worker process(es) still running after shutdown")
        for process in stray:
            process.join(10)
    cpu_s = cpu_seconds() - cpu_start
    if count != n:
        problems.append(f"read {count} items, expected {n}")
    elif n > 0:
        # The last item, once more: it must stay intact after the loader has shut down.
        problems.append(check_item(kind, item, n - 1) or "")
    del item
    problems = [p for p in problems if p]
    if problems:
        raise CheckFailed("; ".join(problems))
    return Run(wall_s, first_s, cpu_s)


@dataclass
class Result:
    """One loader on one workload."""

    candidate: Candidate
    items: int  # per run (fewer than the workload's when capped)
    capped: str = ""
    error: str = ""
    runs: list[Run] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.candidate.make is not None and not self.error and bool(self.runs)

    def median(self, what: str) -> float:
        return statistics.median(getattr(r, what) for r in self.runs)

    @property
    def rate(self) -> float:
        return self.items / self.median("wall_s")

    @property
    def cpu_per_item(self) -> float:
        return statistics.median(r.cpu_s for r in self.runs) / self.items

    @property
    def spread(self) -> float:
        """(max - min) / median of items/s over the runs."""
        rates = [self.items / r.wall_s for r in self.runs]
        return (max(rates) - min(rates)) / statistics.median(rates)


def _fail(result: Result, err: BaseException, when: str) -> None:
    reason = f"{type(err).__name__}: {err}" if not isinstance(err, CheckFailed) else f"check: {err}"
    reason = " ".join(reason.split())
    result.error = f"failed ({when}): {reason}"
    print(f"{result.candidate.name}, {when}:", file=sys.stderr)
    traceback.print_exception(err, file=sys.stderr)


def _significant(n: int, digits: int = 2) -> int:
    """``n`` rounded down to ``digits`` significant digits (96,000 rather than 96,341)."""
    scale = 10 ** max(0, len(str(n)) - digits)
    return max(1, n // scale * scale)


def warm_up(result: Result, workload: Workload, workers: int, cap_seconds: float) -> None:
    """One small run (imports, first-call caches); caps ``result.items`` if a full run would be too long."""
    n = result.items
    n_warm = min(n, max(2 * workers, n // 50))
    try:
        warm = time_once(result.candidate, workload, n_warm, workers)
    except Exception as err:
        _fail(result, err, "warm-up")
        return
    # Start-up (to the first item) once, then the rest (shutdown included: errs on the long side).
    per_item = (warm.wall_s - warm.first_s) / max(1, n_warm - 1)
    estimate = warm.first_s + per_item * (n - 1)
    if estimate > cap_seconds:
        result.items = _significant(max(n_warm, int((cap_seconds - warm.first_s) / per_item)))
        result.capped = (
            f"{result.candidate.name}: capped at {result.items:,} of {n:,} items per run (a full run would take "
            f"~{estimate:.0f} s, over --cap-seconds {cap_seconds:g}); its rates and per-item CPU are over the "
            "capped runs, whose fixed start-up and shutdown cost is spread over fewer items"
        )


def run(workload: Workload, n: int, workers: int, repeats: int, cap_seconds: float) -> list[Result]:
    """Every available loader ``repeats`` times on ``workload``, alternating between loaders."""
    results = [Result(c, n) for c in candidates()]
    runnable = [r for r in results if r.candidate.make is not None]
    for r in runnable:
        warm_up(r, workload, workers, cap_seconds)
    for repeat in range(repeats):
        for r in runnable:
            if r.error:
                continue
            try:
                r.runs.append(time_once(r.candidate, workload, r.items, workers))
            except Exception as err:
                _fail(r, err, f"run {repeat + 1}")
    return results


# --- reporting ---------------------------------------------------------------------------------

HEADER = (
    "loader",
    "items/run",
    "wall s",
    "items/s",
    "MiB/s",
    "CPU µs/item",
    "first item ms",
    "items/s spread",
    "check",
)
RATIO_NOTE = (
    "ratio rows: items/s and MiB/s = conveyor / that loader; CPU/item and first item = that loader / conveyor; "
    "above 1 = conveyor better. Medians over the runs; spread = (max - min) / median of items/s."
)


def _ratio_row(ours: Result, theirs: Result, mib: bool) -> tuple[str, ...]:
    label = f"ratio conveyor vs {theirs.candidate.name}"
    if not (ours.ok and theirs.ok):
        short = (ours if not ours.ok else theirs).candidate.name.split()[0]
        why = f"{short} {'unavailable' if (ours if not ours.ok else theirs).candidate.make is None else 'failed'}"
        return (label, "", "", "-", "-", "-", "-", "", why)
    rate = f"{ours.rate / theirs.rate:.2f}x"
    cpu = f"{theirs.cpu_per_item / ours.cpu_per_item:.2f}x"
    first = f"{theirs.median('first_s') / ours.median('first_s'):.2f}x"
    return (label, "", "", rate, rate if mib else "-", cpu, first, "", "")


def _row(r: Result, mib_per_item: int) -> tuple[str, ...]:
    if r.candidate.make is None:
        return (r.candidate.name, "-", "-", "-", "-", "-", "-", "-", r.candidate.unavailable)
    if not r.ok:
        reason = r.error if len(r.error) <= MAX_REASON else r.error[: MAX_REASON - 3] + "..."
        return (r.candidate.name, f"{r.items:,}", "-", "-", "-", "-", "-", "-", reason)
    spread = f"{r.spread:.0%}" if len(r.runs) > 1 else "-"
    return (
        r.candidate.name + (" (capped)" if r.capped else ""),
        f"{r.items:,}",
        f"{r.median('wall_s'):.2f}",
        f"{r.rate:,.0f}",
        f"{r.rate * mib_per_item:,.0f}" if mib_per_item else "-",
        f"{r.cpu_per_item * 1e6:,.1f}",
        f"{r.median('first_s') * 1e3:,.1f}",
        spread,
        f"ok ({len(r.runs)} run{'s' if len(r.runs) > 1 else ''})",
    )


def format_table(results: Sequence[Result], workload: Workload) -> str:
    """A Markdown table: one row per loader, then the ratio rows."""
    ours = next(r for r in results if r.candidate.name == CONVEYOR)
    rows = [HEADER, *(_row(r, workload.mib_per_item) for r in results)]
    rows += [_ratio_row(ours, r, workload.mib_per_item > 0) for r in results if r is not ours]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    lines = ["| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def _cpu_count() -> int | str:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or "?"


def _workloads(text: str) -> list[Workload]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in WORKLOADS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"choose from {','.join(WORKLOADS)}; got {text!r}")
    return [WORKLOADS[name] for name in dict.fromkeys(names)]


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, run, print the setup line and a table per workload.

    Returns 1 when a conveyor or torch run failed (raised, or read wrong items), else 0;
    torchdata's failures are only reported in its rows.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--workloads",
        type=_workloads,
        default=list(WORKLOADS.values()),
        metavar="LIST",
        help=f"comma-separated, from {','.join(WORKLOADS)} (default: all)",
    )
    parser.add_argument("--workers", type=int, default=2, metavar="W", help="worker processes (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=None, metavar="R", help="runs per loader (default: 3; 1 quick)")
    parser.add_argument(
        "--quick", action="store_true", help="20,000 ints / 200 arrays per run and 1 repeat (a smoke test)"
    )
    parser.add_argument(
        "--cap-seconds",
        type=float,
        default=60.0,
        metavar="S",
        help="a loader whose run would take longer reads fewer items per run (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 3)
    if args.workers < 1 or repeats < 1 or not args.cap_seconds > 0:
        parser.error("--workers and --repeats must be >= 1, --cap-seconds > 0")
    print(
        f"date={datetime.date.today().isoformat()} workers={args.workers} repeats={repeats} "
        f"start_method={multiprocessing.get_start_method()} python={platform.python_version()} "
        f"numpy={np.__version__} torch={torch.__version__ if torch is not None else '-'} "
        f"machine={platform.machine()} cpus={_cpu_count()}",
        flush=True,
    )
    print(RATIO_NOTE, flush=True)
    failed: list[str] = []
    for workload in args.workloads:
        n = workload.quick_items if args.quick else workload.items
        results = run(workload, n, args.workers, repeats, args.cap_seconds)
        print(f"\n{workload.name}: {n:,} {workload.describe}; {args.workers} workers, median of {repeats} run(s)")
        print(format_table(results, workload))
        for r in results:
            if r.ok and r.candidate.kind(workload) != workload.kind:
                print(f"note: {r.candidate.name} yields {r.candidate.kind(workload)}s here (its default_convert)")
            if r.capped:
                print(f"note: {r.capped}")
            if r.error and r.candidate.required:
                failed.append(f"{workload.name}: {r.candidate.name}")
        print(flush=True)
    checked = "items checked: count; value, type and contents at sampled positions; the last item after shutdown"
    if failed:
        print(f"verification FAILED for {', '.join(failed)} ({checked})")
        return 1
    print(f"verification passed for every run that completed ({checked})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
