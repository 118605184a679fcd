"""``conveyor.DataLoader`` against ``torch.utils.data.DataLoader``: the same call, the same
map-style datasets, ``num_workers=2`` and the default start method, otherwise each
loader's defaults unless a workload says otherwise.

Workloads (map-style ``torch.utils.data.Dataset``s, read with the default sequential
sampler and ``default_collate``):

- ``ints`` (a): 200,000 items, ``__getitem__(i)`` returns ``i``; ``batch_size=1`` (the
  default), so every batch is a 1-element int64 tensor. The per-item cost of the loader.
- ``tensors`` (b): 2,000 items, ``__getitem__(i)`` returns a new 1 MiB tensor
  (``torch.full((262144,), i, dtype=torch.float32)``); ``batch_size=1`` (the default: what
  a torch user who leaves it alone gets), so every batch is a ``(1, 262144)`` tensor.
  Bulk data.
- ``dicts`` (c): 200,000 items, ``__getitem__(i)`` returns ``{"id": i, "x": i / 2,
  "label": i % 10}``; ``batch_size=64``, so every batch is a dict of three 64-element
  tensors. Collation in the workers.
- ``tensors-unbatched`` (b'), only when named in ``--workloads``: the (b) dataset with
  ``batch_size=None``, which tells the cost of collating (b) apart from moving it.

Every run happens in a fresh Python process (no page cache, allocator, shared-memory or
import state carried from one loader to the other). The child imports torch and conveyor,
reads one small warm-up epoch with a loader of its own (first-call costs: lazy imports,
caches), then the timed epoch: from the loader's creation to its last batch *and its
shutdown* (conveyor: ``loader.shutdown()``; torch: the iterator ends its workers when the
epoch ends, and the iterator and loader are then deleted), with the worker processes
joined. CPU is user + system CPU of the child and of its joined children (the workers)
over that span: ``getrusage(RUSAGE_SELF)`` + ``getrusage(RUSAGE_CHILDREN)``. Runs alternate
between the loaders (torch, conveyor, torch, ...); the table gives medians over
``--repeats`` runs. ``--scale`` multiplies every workload's item count (a quick run).

Every run (the warm-up too) is checked: every item is delivered exactly once (a count
per id), each batch's shape, and its values against its id (``ints``: the value is the
id; ``tensors``: the first and last elements equal the id; ``dicts``: ``x == id / 2``
and ``label == id % 10``); no worker process may be left running after the shutdown. A
wrong run raises in the child; the parent reports it in the loader's row and exits 1.

    python benchmarks/bench_torch_dataloader.py [--repeats R] [--scale S] [--workloads ints,tensors,dicts]

The targets the project states (conveyor's items/s at least 10x torch's on ``ints``, 5x
on ``tensors``, 1.5x on ``dicts``, and less CPU per item than torch on all three) are
reported, with whether each held in this run; nothing asserts them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import Dataset

from child_processes import cpu_seconds, end_new_processes

WORKERS = 2
LOADERS = ("torch", "conveyor")  # the order of the runs within each repeat
TENSOR_ELEMENTS = (1 << 20) // 4  # float32 elements in 1 MiB
#: Seconds one run may take before it counts as failed.
RUN_TIMEOUT_S = 600.0


class Ints(Dataset):
    """(a) ``i`` for ``i`` in ``range(n)``."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return i


class Tensors(Dataset):
    """(b) a new 1 MiB float32 tensor filled with ``i``, for ``i`` in ``range(n)``."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return torch.full((TENSOR_ELEMENTS,), i, dtype=torch.float32)


class Dicts(Dataset):
    """(c) a small dict per ``i`` in ``range(n)``."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return {"id": i, "x": i / 2, "label": i % 10}


@dataclass(frozen=True)
class Workload:
    key: str
    letter: str
    items: int  # at --scale 1
    dataset: type[Dataset]
    batch_size: int | None
    describe: str
    target: float | None  # conveyor's items/s over torch's, at least (None: no target stated)

    @property
    def per_batch(self) -> int:
        return self.batch_size or 1

    def count(self, scale: float) -> int:
        """Items per run at ``scale``: at least two batches per worker."""
        return max(2 * WORKERS * self.per_batch, round(self.items * scale))


WORKLOADS = {
    w.key: w
    for w in (
        Workload("ints", "a", 200_000, Ints, 1, "ints, __getitem__(i) = i; batch_size=1", 10.0),
        Workload("tensors", "b", 2_000, Tensors, 1, "1 MiB float32 tensors (torch.full); batch_size=1", 5.0),
        Workload("dicts", "c", 200_000, Dicts, 64, 'dicts {"id": i, "x": i / 2, "label": i % 10}; batch_size=64', 1.5),
        # Not run by default: (b) without batching, to tell the collation's cost from the transport's.
        Workload("tensors-unbatched", "b'", 2_000, Tensors, None, "the (b) dataset; batch_size=None", None),
    )
}
#: The workloads run by default: the three the targets are about.
DEFAULT_WORKLOADS = ("ints", "tensors", "dicts")


class CheckFailed(Exception):
    """The items a loader delivered are wrong."""


class Checker:
    """Looks at each batch as it arrives (cheaply: a count per id, a few values) and says
    at the end whether every item came exactly once."""

    def __init__(self, workload: Workload, n: int):
        self.workload, self.n = workload, n
        self.counts = bytearray(n)  # deliveries per id (saturating at 255)
        self.problems: list[str] = []
        self.batches = 0

    def _count(self, i: int) -> None:
        if not 0 <= i < self.n:
            self.problems.append(f"id {i} out of range")
        elif self.counts[i] < 255:
            self.counts[i] += 1

    def see(self, batch: Any) -> None:
        self.batches += 1
        if len(self.problems) > 10:
            return
        key = self.workload.key
        if key == "ints":
            if not (isinstance(batch, torch.Tensor) and batch.shape == (1,)):
                self.problems.append(f"batch {self.batches}: {type(batch).__name__} {getattr(batch, 'shape', '')}")
                return
            self._count(batch.item())
        elif key.startswith("tensors"):
            shape = (TENSOR_ELEMENTS,) if self.workload.batch_size is None else (1, TENSOR_ELEMENTS)
            if not (isinstance(batch, torch.Tensor) and batch.shape == shape):
                self.problems.append(f"batch {self.batches}: {type(batch).__name__} {getattr(batch, 'shape', '')}")
                return
            flat = batch.view(-1)
            first, last = flat[0].item(), flat[-1].item()
            if first != last or first != int(first):
                self.problems.append(f"batch {self.batches}: elements {first} .. {last}")
                return
            self._count(int(first))
        else:
            if not (isinstance(batch, dict) and set(batch) == {"id", "x", "label"}):
                self.problems.append(f"batch {self.batches}: {type(batch).__name__}")
                return
            ids = batch["id"]
            if not (torch.equal(batch["label"], ids % 10) and torch.equal(batch["x"], ids / 2)):
                self.problems.append(f"batch {self.batches}: x or label do not match the ids")
            for i in ids.tolist():
                self._count(i)

    def finish(self) -> None:
        """Raise :class:`CheckFailed` unless every id came exactly once."""
        problems = list(self.problems)
        once = self.counts.count(1)
        if once != self.n:
            missing, repeated = self.counts.count(0), self.n - once - self.counts.count(0)
            problems.append(f"{missing} id(s) never delivered, {repeated} delivered more than once (of {self.n})")
        expected = -(-self.n // self.workload.per_batch)
        if self.batches != expected:
            problems.append(f"{self.batches} batches, expected {expected}")
        if problems:
            raise CheckFailed("; ".join(problems[:5]))


def epoch(loader_name: str, workload: Workload, n: int) -> dict[str, Any]:
    """One checked epoch of ``n`` items, timed from the loader's creation to its shutdown."""
    if loader_name == "conveyor":
        from conveyor import DataLoader as Loader
    else:
        from torch.utils.data import DataLoader as Loader
    dataset = workload.dataset(n)
    check = Checker(workload, n)
    before = set(multiprocessing.active_children())
    first_s = float("nan")
    cpu = cpu_seconds()
    start = time.perf_counter()
    loader: Any = Loader(dataset, batch_size=workload.batch_size, num_workers=WORKERS)
    try:
        iterator: Any = iter(loader)
        batch: Any = None
        for batch in iterator:
            first_s = time.perf_counter() - start
            check.see(batch)
            break
        for batch in iterator:
            check.see(batch)
        batch = None
        if loader_name == "conveyor":
            loader.shutdown()
        iterator = loader = None  # torch: its workers ended with the epoch; this drops what is left
        wall_s = time.perf_counter() - start
        stray = end_new_processes(before)
        cpu_s = cpu_seconds() - cpu
    finally:
        if loader_name == "conveyor" and loader is not None:
            loader.shutdown()
        iterator = loader = batch = None
        end_new_processes(before)
    if stray:
        check.problems.append(f"{stray} worker process(es) still running after the shutdown")
    check.finish()
    return {"wall_s": wall_s, "first_s": first_s, "cpu_s": cpu_s, "items": n, "batches": check.batches}


def child(loader_name: str, key: str, n: int) -> int:
    """A child run: a small warm-up epoch, then the timed one, printed as one JSON line."""
    workload = WORKLOADS[key]
    import conveyor.torch_compat.dataloader  # noqa: F401  (imported before the clock, as torch is)

    epoch(loader_name, workload, min(n, max(4 * WORKERS * workload.per_batch, n // 50)))
    print(json.dumps(epoch(loader_name, workload, n)), flush=True)
    return 0


@dataclass
class Row:
    """One loader on one workload: its runs, or why some failed."""

    workload: Workload
    loader: str
    runs: list[dict[str, Any]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def median(self, what: str) -> float:
        return statistics.median(run[what] for run in self.runs)

    @property
    def rate(self) -> float:
        """Items per second: items per run over the median wall time."""
        return self.runs[0]["items"] / self.median("wall_s")

    @property
    def cpu_us(self) -> float:
        """Median CPU of a run (all its processes), in µs per item."""
        return self.median("cpu_s") / self.runs[0]["items"] * 1e6


def measure(loader: str, workload: Workload, n: int) -> tuple[dict[str, Any] | None, str]:
    """One run in a fresh process: ``(result, '')`` or ``(None, why it failed)``."""
    command = [sys.executable, os.path.abspath(__file__), "--one", loader, workload.key, str(n)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None, f"no result within {RUN_TIMEOUT_S:.0f} s"
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        sys.stderr.write(done.stderr)
        tail = [line for line in done.stderr.strip().splitlines() if line.strip()][-1:] or [""]
        return None, f"exit code {done.returncode}: {tail[0][:200]}".rstrip(": ")
    return json.loads(lines[-1]), ""


def run(workloads: Sequence[Workload], repeats: int, scale: float) -> list[Row]:
    """Both loaders on every workload, ``repeats`` fresh-process runs each, alternating."""
    rows: list[Row] = []
    for workload in workloads:
        pair = [Row(workload, loader) for loader in LOADERS]
        rows.extend(pair)
        n = workload.count(scale)
        print(f"({workload.letter}) {workload.key}: {n:,} items, {repeats} run(s) per loader", file=sys.stderr)
        for repeat in range(repeats):
            for row in pair:
                result, why = measure(row.loader, workload, n)
                if result is None:
                    row.failures.append(f"run {repeat + 1}: {why}")
                else:
                    row.runs.append(result)
                progress = f"{result['wall_s']:.2f} s" if result else "failed"
                print(f"  {row.loader} run {repeat + 1}: {progress}", file=sys.stderr, flush=True)
    return rows


def verdict(conveyor: Row, torch_row: Row) -> tuple[str, str]:
    """The target of conveyor's row and whether it held, as text."""
    goal = conveyor.workload.target
    if goal is None:
        return "none stated", ""
    target = f"items/s >= {goal:g}x torch, CPU/item < torch"
    if not (conveyor.runs and torch_row.runs):
        return target, "not measured (a loader failed)"
    ratio = conveyor.rate / torch_row.rate
    rate_ok = ratio >= goal
    cpu_ok = conveyor.cpu_us < torch_row.cpu_us
    held = "yes" if rate_ok and cpu_ok else "no"
    rate = f"{ratio:.2f}x {'>=' if rate_ok else '<'} {goal:g}x"
    cpu = f"CPU {conveyor.cpu_us:,.1f} {'<' if cpu_ok else '>='} {torch_row.cpu_us:,.1f} µs"
    return target, f"{held} ({rate}; {cpu})"


HEADER = (
    "workload",
    "loader",
    "items/s",
    "ratio conveyor/torch",
    "CPU µs/item",
    "first batch ms",
    "runs ok",
    "target (conveyor)",
    "held in this run",
)


def report(rows: Sequence[Row]) -> str:
    """The Markdown table (medians), then the failures in full."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    notes: list[str] = []
    by_key = {(r.workload.key, r.loader): r for r in rows}
    for row in rows:
        w = row.workload
        cells = [f"({w.letter}) {w.key}", row.loader if row.loader == "conveyor" else f"torch {torch.__version__}"]
        if row.runs:
            cells += [f"{row.rate:,.0f}", "", f"{row.cpu_us:,.1f}", f"{row.median('first_s') * 1000:,.1f}"]
        else:
            cells += ["failed", "", "", ""]
        cells.append(f"{len(row.runs)}/{len(row.runs) + len(row.failures)}")
        other = by_key[(w.key, "torch")]
        if row.loader == "conveyor":
            if row.runs and other.runs:
                cells[3] = f"{row.rate / other.rate:.2f}x"
            cells += list(verdict(row, other))
        else:
            cells += ["", ""]
        lines.append("| " + " | ".join(cells) + " |")
        for failure in dict.fromkeys(row.failures):
            notes.append(f"- {w.key}, {row.loader}: {failure}")
    return "\n".join(lines + (["", "failed runs:", *notes] if notes else []))


def machine_line() -> str:
    import numpy as np

    import conveyor

    return (
        f"machine: {platform.system()} {platform.release()} {platform.machine()}, {os.cpu_count()} CPUs, "
        f"python {platform.python_version()}, conveyor {conveyor.__version__}, numpy {np.__version__}, "
        f"torch {torch.__version__} ({torch.get_num_threads()} intra-op threads), "
        f"start method {multiprocessing.get_start_method()}; date {datetime.date.today().isoformat()}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, run, print the table; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--one"]:  # a child: one run, one JSON line (an exception fails it)
        return child(args[1], args[2], int(args[3]))
    parser = argparse.ArgumentParser(description=" ".join((__doc__ or "").split("\n\n", 1)[0].split()))
    parser.add_argument("--repeats", type=int, default=3, help="fresh-process runs per loader and workload (3)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies every workload's item count (1)")
    parser.add_argument(
        "--workloads", default=",".join(DEFAULT_WORKLOADS), help=f"comma-separated, of {','.join(WORKLOADS)}"
    )
    options = parser.parse_args(args)
    keys = [k for k in options.workloads.split(",") if k]
    unknown = [k for k in keys if k not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s) {','.join(unknown)}; choose from {','.join(WORKLOADS)}")
    if options.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {options.repeats}")
    if not options.scale > 0:
        parser.error(f"--scale must be > 0, got {options.scale}")
    print(machine_line())
    print(
        f"settings: workloads={','.join(keys)} workers={WORKERS} repeats={options.repeats} scale={options.scale:g}; "
        f"load {os.getloadavg()[0]:.2f} at the start"
    )
    started = time.perf_counter()
    workloads = [WORKLOADS[k] for k in keys]
    rows = run(workloads, options.repeats, options.scale)
    for w in workloads:
        print(f"({w.letter}) {w.key}: {w.count(options.scale):,} items, {w.describe}")
    print(report(rows))
    print(
        "items/s: items per run over the median wall time (loader creation to shutdown, workers joined); "
        "ratio: conveyor's items/s over torch's; CPU µs/item: median CPU of all the run's processes per item; "
        "first batch: loader creation to the first batch. Medians over the runs."
    )
    print(f"load {os.getloadavg()[0]:.2f} at the end; {time.perf_counter() - started:.0f} s")
    failed = any(row.failures for row in rows)
    print("verification FAILED: see the failed runs above" if failed else "verification passed for every run")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
