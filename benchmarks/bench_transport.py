"""Large-buffer transport: conveyor's ``DataLoader2`` + ``MultiProcessingReadingService(2)``
against ``torch.utils.data.DataLoader(num_workers=2)`` on the same items.

Workloads (each ``range(N)`` sharded across 2 workers, mapped there by ``np.full(size, i % 251,
uint8)``):

- ``1MiB``: 1,000 arrays of 1 MiB: conveyor's page ring.
- ``60MB``: 60 arrays of 60 MB, and ``300MB``: 24 arrays of 300 MB: larger than a ring, so
  conveyor sends each in a shared file of its own. Runs of a few GB, because a fresh
  process's first items cost far more than the next ones on both sides (fresh pages for
  the arrays, and for conveyor the first shared files, before dropped ones are reused):
  at 12 items of 300 MB conveyor measured ~1.0 GB/s, at 40 items 3.3-4.9 GB/s.
- ``1MiB-small-shm``: the ``1MiB`` workload with ``/dev/shm`` a 16 MB tmpfs (Docker's
  default is 64 MB), in a private mount namespace (``unshare -m``; needs root, otherwise
  the row says why it did not run). conveyor's rings are ``memfd_create`` memory, which
  ``/dev/shm``'s size does not bound; torch's shared tensors are ``/dev/shm`` files.

torch's side is an ``IterableDataset`` doing the same per worker, read with
``batch_size=None`` (its defaults otherwise: ``prefetch_factor=2``, no pinned memory); it
hands the arrays over as tensors (``default_convert``). Every run happens in a fresh
Python process (no page cache, allocator or import state carried between runs), timed
from the loader's creation to its last item and its shutdown, and checked: the count,
the first and last byte of every item, and every byte of the first, middle and last
items (the same check for both loaders, so both touch the same memory). Runs alternate
between the loaders; the table gives the median of ``--repeats`` runs in MB/s (10^6
bytes), conveyor's rate over torch's, and the CPU seconds per GB that the run cost all
its processes together (main and workers: steadier than wall time on a shared machine).
A run that fails (a crash, ``Bus error``, an exception, wrong items) is reported in its
row, never retried.

    python benchmarks/bench_transport.py [--repeats R] [--quick] [--workloads 1MiB,60MB,...]

Timings are never asserted anywhere; exit code 1 when a conveyor run failed, 2 for bad
arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MB = 1_000_000
WORKERS = 2
LOADERS = ("conveyor", "torch")
#: name -> (bytes per item, items per run, items per run with --quick, 16 MB /dev/shm)
WORKLOADS: dict[str, tuple[int, int, int, bool]] = {
    "1MiB": (1 << 20, 1000, 300, False),
    "60MB": (60 * MB, 60, 10, False),
    "300MB": (300 * MB, 24, 4, False),
    "1MiB-small-shm": (1 << 20, 1000, 300, True),
}
SMALL_SHM = "16m"
#: Seconds one run may take before it counts as failed.
RUN_TIMEOUT_S = 300.0


class Fill:
    """``np.full(size, i % 251, uint8)``: cheap to make, fully checkable (picklable)."""

    def __init__(self, size: int):
        self.size = size

    def __call__(self, i: int) -> np.ndarray:
        return np.full(self.size, i % 251, dtype=np.uint8)


def _as_array(item: Any) -> np.ndarray:
    return item if isinstance(item, np.ndarray) else item.numpy()


def check(items: Iterator[Any], count: int, size: int) -> tuple[int, list[str]]:
    """Consume ``items``; ``(how many, problems)``. Every item's ends, and every byte of a
    few, are compared with what ``Fill`` made."""
    full = {0, count // 2, count - 1}
    problems: list[str] = []
    seen = 0
    for i, item in enumerate(items):
        array = _as_array(item)
        expected = i % 251
        if array.shape != (size,) or array[0] != expected or array[-1] != expected:
            problems.append(f"item {i}: shape {array.shape}, ends {array[0]}..{array[-1]}, expected {expected}")
        elif i in full and not (array.min() == expected == array.max()):
            problems.append(f"item {i} differs from {expected} inside")
        seen = i + 1
        del item, array
    if seen != count:
        problems.append(f"read {seen} items, expected {count}")
    return seen, problems


def cpu_seconds() -> float:
    """User + system CPU of this process and its joined children (the workers) so far."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run_one(loader: str, size: int, count: int) -> dict[str, Any]:
    """One timed, checked run in this process: ``{"wall_s", "cpu_s", "items", "problems"}``."""
    cpu = cpu_seconds()
    start = time.perf_counter()
    if loader == "conveyor":
        from conveyor import DataLoader2, MultiProcessingReadingService
        from conveyor.pipes import IterableWrapper

        dl = DataLoader2(
            IterableWrapper(range(count)).sharding_filter().map(Fill(size)),
            reading_service=MultiProcessingReadingService(WORKERS),
        )
        try:
            seen, problems = check(iter(dl), count, size)
        finally:
            dl.shutdown()
    else:
        from torch.utils.data import DataLoader

        from conveyor.tools.bench.torch_datasets import ShardedRange

        iterator = iter(DataLoader(ShardedRange(count, Fill(size)), batch_size=None, num_workers=WORKERS))
        try:
            seen, problems = check(iterator, count, size)
        finally:
            iterator._shutdown_workers()  # type: ignore[attr-defined]
    wall = time.perf_counter() - start
    return {"wall_s": wall, "cpu_s": cpu_seconds() - cpu, "items": seen, "problems": problems}


@dataclass
class Row:
    """One loader on one workload: its runs' rates, or why there are none."""

    workload: str
    loader: str
    rates: list[float] = field(default_factory=list)  # MB/s per run
    cpu: list[float] = field(default_factory=list)  # CPU seconds (all processes) per GB, per run
    failures: list[str] = field(default_factory=list)

    @property
    def median(self) -> float | None:
        return statistics.median(self.rates) if self.rates else None


def _reason(done: subprocess.CompletedProcess[str]) -> str:
    if done.returncode < 0:
        try:
            name = signal.Signals(-done.returncode).name
        except ValueError:
            name = f"signal {-done.returncode}"
        why = f"killed by {name}"
    else:
        why = f"exit code {done.returncode}"
    tail = [line for line in done.stderr.strip().splitlines() if line.strip()][-1:] or [""]
    return f"{why}: {tail[0][:160]}".rstrip(": ")


def small_shm_problem() -> str:
    """Why a private 16 MB /dev/shm cannot be had here ('' when it can)."""
    if not sys.platform.startswith("linux"):
        return "needs Linux mount namespaces"
    if os.geteuid() != 0:
        return "needs root to mount a private /dev/shm (unshare -m + mount -t tmpfs)"
    if shutil.which("unshare") is None:
        return "needs unshare(1)"
    return ""


def measure(workload: str, loader: str, quick: bool) -> tuple[float | None, float, str]:
    """One run in a fresh process: ``(MB/s, CPU s per GB, '')`` or ``(None, 0, why it failed)``."""
    size, count, quick_count, small_shm = WORKLOADS[workload]
    count = quick_count if quick else count
    command = [sys.executable, os.path.abspath(__file__), "--one", loader, str(size), str(count)]
    if small_shm:
        script = f'mount -t tmpfs -o size={SMALL_SHM} tmpfs /dev/shm && exec "$@"'
        command = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", *command]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None, 0.0, f"no result within {RUN_TIMEOUT_S:.0f} s"
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return None, 0.0, _reason(done)
    result = json.loads(lines[-1])
    if "error" in result:
        return None, 0.0, result["error"]
    if result["problems"]:
        return None, 0.0, "wrong items: " + "; ".join(result["problems"][:3])
    gigabytes = result["items"] * size / 1e9
    return gigabytes * 1000 / result["wall_s"], result["cpu_s"] / gigabytes, ""


def run(workloads: Sequence[str], repeats: int, quick: bool) -> list[Row]:
    """Every loader on every workload, ``repeats`` fresh-process runs each, alternating."""
    rows: list[Row] = []
    for workload in workloads:
        pair = [Row(workload, loader) for loader in LOADERS]
        rows.extend(pair)
        problem = small_shm_problem() if WORKLOADS[workload][3] else ""
        if problem:
            for row in pair:
                row.failures.append(f"not run: {problem}")
            continue
        print(f"{workload}: {repeats} run(s) per loader", file=sys.stderr, flush=True)
        for _ in range(repeats):
            for row in pair:
                rate, cpu, why = measure(workload, row.loader, quick)
                if rate is None:
                    row.failures.append(why)
                else:
                    row.rates.append(rate)
                    row.cpu.append(cpu)
    return rows


def report(rows: Sequence[Row]) -> str:
    """The table, then the failures in full."""
    lines = [
        "| workload | loader | MB/s (median) | CPU s/GB (median) | runs ok | ratio conveyor/torch (MB/s) |",
        "|---|---|---|---|---|---|",
    ]
    medians = {(r.workload, r.loader): r.median for r in rows}
    notes: list[str] = []
    for row in rows:
        rate = f"{row.median:,.0f}" if row.median is not None else "failed"
        conveyor, torch = medians[(row.workload, "conveyor")], medians[(row.workload, "torch")]
        ratio = f"{conveyor / torch:.2f}" if row.loader == "torch" and conveyor and torch else ""
        runs = f"{len(row.rates)}/{len(row.rates) + len(row.failures)}"
        cpu = f"{statistics.median(row.cpu):.2f}" if row.cpu else ""
        lines.append(f"| {row.workload} | {row.loader} | {rate} | {cpu} | {runs} | {ratio} |")
        for failure in dict.fromkeys(row.failures):
            notes.append(f"- {row.workload}, {row.loader}: {failure}")
    return "\n".join(lines + (["", *notes] if notes else []))


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, run, print the table; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--one"]:  # a child: one run, one JSON line
        loader, size, count = args[1], int(args[2]), int(args[3])
        try:
            print(json.dumps(run_one(loader, size, count)))
        except Exception as error:  # the parent reports it in the loader's row
            print(json.dumps({"error": " ".join(f"{type(error).__name__}: {error}".split())[:300]}))
        return 0
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument("--repeats", type=int, default=3, help="fresh-process runs per loader and workload")
    parser.add_argument("--quick", action="store_true", help="fewer items per run")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, of {list(WORKLOADS)}")
    options = parser.parse_args(args)
    workloads = [w for w in options.workloads.split(",") if w]
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown or options.repeats < 1:
        parser.error(f"unknown workloads {unknown}" if unknown else "--repeats must be >= 1")
    import torch

    print(
        f"python {sys.version.split()[0]}, numpy {np.__version__}, torch {torch.__version__}, "
        f"{os.cpu_count()} cpus, load {os.getloadavg()[0]:.1f}, {WORKERS} workers, repeats {options.repeats}"
        f"{', quick' if options.quick else ''}"
    )
    rows = run(workloads, options.repeats, options.quick)
    print(report(rows))
    failed = any(r.loader == "conveyor" and r.failures and not r.failures[0].startswith("not run") for r in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
