"""Thread workers against worker processes and torch's ``DataLoader``: JPEG decode, random
crop, batch, with 2 workers each, on the same data in the same run.

The workload is ``bench_real_data.py``'s (a), imported from it: WebDataset shards of
256x256 RGB JPEGs (quality 90, ~40 KB), each sample decoded with Pillow, cropped to
224x224 at a corner drawn from its index, batched by 32 into ``(images, labels, indices)``
tensors, and every batch checked (each item once, labels, each crop's fingerprint).

Rows (each run a fresh Python process; medians over ``--repeats`` runs):

- conveyor, ``MultiProcessingReadingService(2, worker_type="thread")``;
- conveyor, ``MultiProcessingReadingService(2)`` (worker processes, ``fork``);
- torch's ``DataLoader(..., batch_size=32, num_workers=2)`` over an ``IterableDataset``
  reading its worker's shards with ``tarfile``;
- three bounds, no loader, each thread or process checking its own batches: the same work
  as a torch worker's (``tarfile``, crop, batches of 32 by ``default_collate``) in 2 plain
  threads of the run's process, and in 2 forked processes; and conveyor's graph itself
  (the thread workers' work, without the loader: no hand-off, no merge) iterated in 2
  plain threads, each over every other shard. The threads' bounds are what the GIL
  leaves of 2 cores for this work; the last one tells the graph's share from the
  loader's.

Measured for the timed epoch of each run (after a warm-up epoch of 2 shards with a loader
of its own): images/s (loader creation to its shutdown); CPU per image (the run's process
and its joined children); the first batch (loader creation to the first batch); and
memory: the peak, over the epoch, of the sum over the run's process and all its
descendants of ``VmRSS`` (``/proc/<pid>/status``) and of ``Pss``
(``/proc/<pid>/smaps_rollup``: shared pages split between their sharers, where RSS counts
them in full in each process), sampled by the parent every 50 ms; the processes: the
most that ran at once, as the run itself saw them at each batch (itself and the live
children ``multiprocessing`` started: a short epoch's worker can start and end between
two of the parent's samples) or as the parent sampled them. Beside them, what
bounds the first two targets: the run's own RSS when it started (interpreter, torch,
Pillow, numpy, imported before any loader), which a thread worker shares and a worker
process holds again; the start-up alone (loader creation to the first item of the same
kind of loader over the shard paths alone: no file read, nothing decoded; the fastest of
3 such loaders); and one batch's work alone (32 images read, decoded, cropped and
collated in the run's thread with no loader; the fastest of the first shard's first 3
batches), which no loader's first batch can beat.

The bound in threads sets torch to one intra-op thread, as the bound in processes (and
torch's and conveyor's worker processes) do: ``default_collate`` stacks with torch.

The targets (thread workers against worker processes: first batch >= 10x sooner, peak RSS
<= 1/3, images/s >= 0.9x) are reported with whether each held; nothing asserts them.

    python benchmarks/bench_thread_workers.py [--quick] [--repeats R] [--shards S] [--per-shard P]
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch.utils.data import DataLoader

import bench_real_data as images
from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.pipes import IterableWrapper

#: Default sizes: 8 shards of 256 images (2,048 per epoch); --quick: 4 of 128, one run.
SHARDS, PER_SHARD = 8, 256
QUICK_SHARDS, QUICK_PER_SHARD = 4, 128
#: Seconds between two memory samples of a run's processes.
SAMPLE_S = 0.05
RUN_TIMEOUT_S = 300.0
MIB = 1 << 20
#: Thread workers against worker processes, as asked: start-up, memory, throughput.
FASTER_START, LESS_MEMORY, THROUGHPUT = 10.0, 1 / 3, 0.9


def conveyor_images(worker_type: str, part: images.Part, manifest: images.Manifest) -> images.Session:
    service = MultiProcessingReadingService(num_workers=images.WORKERS, worker_type=worker_type)
    loader = DataLoader2(images.image_pipeline(part.sources), reading_service=service)
    return images.Session(loader, loader.shutdown)


def threads_bound(part: images.Part, manifest: images.Manifest) -> images.Session:
    """The work alone in 2 plain threads, each a torch worker's shards, checking its batches."""
    torch.set_num_threads(1)
    executor = ThreadPoolExecutor(max_workers=images.WORKERS)
    tallies = executor.map(functools.partial(images.image_tally, part, manifest), range(images.WORKERS))
    return images.Session(tallies, executor.shutdown)


def graph_tally(part: images.Part, manifest: images.Manifest, worker: int) -> images.Tally:
    """One thread of the graph's bound: conveyor's graph over every other shard, no loader."""
    check = images.ImageCheck.for_part(part, manifest)
    first_at = images.read_epoch(images.image_pipeline(part.sources[worker :: images.WORKERS]), check, 0.0)
    return check.tally(first_at)


def graph_in_threads(part: images.Part, manifest: images.Manifest) -> images.Session:
    executor = ThreadPoolExecutor(max_workers=images.WORKERS)
    tallies = executor.map(functools.partial(graph_tally, part, manifest), range(images.WORKERS))
    return images.Session(tallies, executor.shutdown)


def conveyor_paths(worker_type: str, paths: list[str]) -> images.Session:
    service = MultiProcessingReadingService(num_workers=images.WORKERS, worker_type=worker_type)
    loader = DataLoader2(IterableWrapper(paths).sharding_filter(), reading_service=service)
    return images.Session(loader, loader.shutdown)


def torch_paths(paths: list[str]) -> images.Session:
    return images.Session(DataLoader(paths, batch_size=None, num_workers=images.WORKERS), lambda: None)


class Loader(NamedTuple):
    key: str
    label: str
    open: Callable[[images.Part, images.Manifest], images.Session]
    paths: Callable[[list[str]], images.Session] | None = None  # the same loader over the paths alone


LOADERS = {
    loader.key: loader
    for loader in (
        Loader(
            "threads",
            "conveyor, 2 thread workers",
            functools.partial(conveyor_images, "thread"),
            functools.partial(conveyor_paths, "thread"),
        ),
        Loader(
            "processes",
            "conveyor, 2 worker processes",
            functools.partial(conveyor_images, "process"),
            functools.partial(conveyor_paths, "process"),
        ),
        Loader("torch", "torch DataLoader(num_workers=2)", images.images_by_torch, torch_paths),
        Loader("bound-threads", "no loader: the work in 2 threads (bound)", threads_bound),
        Loader("bound-processes", "no loader: the work in 2 processes (bound)", images.images_bound),
        Loader("bound-graph", "no loader: conveyor's graph in 2 threads (bound)", graph_in_threads),
    )
}


# --- one run (a child process) --------------------------------------------------------


def own_rss() -> int:
    return status_bytes(os.getpid(), "VmRSS")


def one_batch_s(part: images.Part, batches: int = 3) -> float:
    """Seconds to make one batch in this thread with no loader: the fastest of the first
    shard's first ``batches`` batches."""
    made = images.collated(images.shard_items(part.sources[:1]))
    fastest = float("inf")
    for _ in range(batches):
        started = time.perf_counter()
        if next(made, None) is None:
            break
        fastest = min(fastest, time.perf_counter() - started)
    made.close()
    return fastest


def startup_s(loader: Loader, part: images.Part, tries: int = 3) -> float:
    """Seconds from the creation of ``loader``'s kind of loader over ``part``'s paths alone
    to its first item (nothing read or decoded), the fastest of ``tries`` loaders; NaN
    for a bound."""
    if loader.paths is None:
        return float("nan")
    fastest = float("inf")
    for _ in range(tries):
        started = time.perf_counter()
        session = loader.paths(list(part.sources))
        iterator = iter(session.batches)
        next(iterator)
        fastest = min(fastest, time.perf_counter() - started)
        del iterator  # (torch's workers end with their iterator)
        session.close()
    return fastest


def counting_processes(open_session: Callable[[], images.Session], seen: list[int]) -> Callable[[], images.Session]:
    """``open_session``, whose batches note in ``seen[0]`` the most processes this one had
    running at a batch: itself and its live children (a loader's worker processes)."""

    def opened() -> images.Session:
        session = open_session()

        def batches() -> Any:
            for batch in session.batches:
                seen[0] = max(seen[0], 1 + len(multiprocessing.active_children()))
                yield batch

        return images.Session(batches(), session.close)

    return opened


def child(loader_key: str, manifest_path: str) -> int:
    """A run: the warm-up epoch, what bounds the targets, then the timed epoch between two
    lines for the parent's memory sampling; the result as one JSON line."""
    rss_libraries = own_rss()  # everything imported, no loader made yet
    manifest, loader = images.Manifest.load(manifest_path), LOADERS[loader_key]
    warm, timed = manifest.parts["images"]["warm"], manifest.parts["images"]["timed"]
    images.epoch(functools.partial(loader.open, warm, manifest), images.ImageCheck.for_part(warm, manifest), 0)
    bounds = {"startup_s": startup_s(loader, timed), "batch_s": one_batch_s(timed), "rss_libraries": rss_libraries}
    check = images.ImageCheck.for_part(timed, manifest)
    seen = [1]
    print("timed-start", flush=True)
    result = images.epoch(counting_processes(functools.partial(loader.open, timed, manifest), seen), check, 0)
    print("timed-end", flush=True)
    print(json.dumps({**result, **bounds, "processes_seen": seen[0]}), flush=True)
    return 0


# --- memory of a process tree (the parent samples it) ----------------------------------


def status_bytes(pid: int, key: str) -> int:
    """A ``kB`` line of ``/proc/<pid>/status`` in bytes (0 once the process is gone)."""
    return _kb_line(f"/proc/{pid}/status", key)


def pss_bytes(pid: int) -> int:
    return _kb_line(f"/proc/{pid}/smaps_rollup", "Pss")


def _kb_line(path: str, key: str) -> int:
    try:
        with open(path) as lines:
            for line in lines:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return 0
    return 0


def descendants(root: int) -> list[int]:
    """``root`` and every process below it (from each process's parent in ``/proc``)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as stat:
                    parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(name))
    tree, pending = [], [root]
    while pending:
        pid = pending.pop()
        tree.append(pid)
        pending.extend(children.get(pid, []))
    return tree


def tree_memory(root: int) -> tuple[int, int, int]:
    """``(sum of VmRSS, sum of Pss, processes)`` of ``root``'s process tree, in bytes."""
    pids = descendants(root)
    return sum(status_bytes(p, "VmRSS") for p in pids), sum(pss_bytes(p) for p in pids), len(pids)


def measure(loader: Loader, manifest_path: Path) -> tuple[dict[str, Any] | None, str]:
    """One run in a fresh process, its memory sampled meanwhile: ``(result, '')`` or
    ``(None, why it failed)``."""
    command = [sys.executable, os.path.abspath(__file__), "--one", loader.key, str(manifest_path)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.SimpleQueue[str] = queue.SimpleQueue()
    errors: list[str] = []
    readers = [
        threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True),  # type: ignore[union-attr]
        threading.Thread(target=lambda: errors.extend(process.stderr), daemon=True),  # type: ignore[union-attr]
    ]
    for reader in readers:
        reader.start()
    sampling, peak_rss, peak_pss, processes, output = False, 0, 0, 0, []
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while process.poll() is None and time.monotonic() < deadline:
        while not lines.empty():
            line = lines.get().strip()
            output.append(line)
            sampling = {"timed-start": True, "timed-end": False}.get(line, sampling)
        if sampling:
            rss, pss, count = tree_memory(process.pid)
            peak_rss, peak_pss, processes = max(peak_rss, rss), max(peak_pss, pss), max(processes, count)
        time.sleep(SAMPLE_S)
    if process.poll() is None:
        process.kill()
        process.wait()
        return None, f"no result within {RUN_TIMEOUT_S:.0f} s"
    for reader in readers:
        reader.join()
    while not lines.empty():
        output.append(lines.get().strip())
    if process.returncode != 0 or not output or not output[-1].startswith("{"):
        sys.stderr.write("".join(errors))
        tail = [line for line in "".join(errors).splitlines() if line.strip()][-1:] or [""]
        return None, f"exit code {process.returncode}: {tail[0][:300]}".rstrip(": ")
    result = json.loads(output[-1])
    processes = max(processes, result.pop("processes_seen"))
    return {**result, "peak_rss": peak_rss, "peak_pss": peak_pss, "processes": processes}, ""


# --- the parent: data, runs, table ----------------------------------------------------


@dataclass
class Row:
    loader: Loader
    runs: list[dict[str, Any]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def median(self, what: str) -> float:
        return statistics.median(run[what] for run in self.runs)

    @property
    def rate(self) -> float:
        return self.runs[0]["items"] / self.median("wall_s")

    def ms(self, what: str) -> str:
        value = self.median(what) * 1000
        return "-" if value != value else f"{value:,.1f}"  # NaN: not measured (a bound's start-up)

    def mib(self, what: str) -> float:
        return self.median(what) / MIB


HEADER = (
    "loader",
    "images/s",
    "CPU µs/image",
    "first batch ms",
    "peak RSS MiB (all processes)",
    "peak PSS MiB",
    "start-up alone ms",
    "one batch alone ms",
    "RSS of the libraries MiB",
    "processes",
    "runs ok",
)


def cells(row: Row) -> list[str]:
    if not row.runs:
        return [row.loader.label, "failed", *[""] * (len(HEADER) - 3), f"0/{len(row.failures)}"]
    items = row.runs[0]["items"]
    return [
        row.loader.label,
        f"{row.rate:,.0f}",
        f"{row.median('cpu_s') / items * 1e6:,.0f}",
        row.ms("first_s"),
        f"{row.mib('peak_rss'):,.0f}",
        f"{row.mib('peak_pss'):,.0f}",
        row.ms("startup_s"),
        row.ms("batch_s"),
        f"{row.mib('rss_libraries'):,.0f}",
        f"{max(run['processes'] for run in row.runs)}",
        f"{len(row.runs)}/{len(row.runs) + len(row.failures)}",
    ]


def report(rows: Sequence[Row]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(cells(row)) + " |" for row in rows]
    notes = [f"- {row.loader.key}: {failure}" for row in rows for failure in row.failures]
    return "\n".join(lines + (["", "failed runs:", *notes] if notes else []))


def verdicts(rows: dict[str, Row]) -> list[str]:
    """Thread workers against worker processes (and torch's loader): the three targets,
    then what bounds them."""
    threads, processes, torch_row, bound = rows["threads"], rows["processes"], rows["torch"], rows["bound-threads"]
    if not (threads.runs and processes.runs):
        return ["targets: not measured (a loader failed)"]
    start = processes.median("first_s") / threads.median("first_s")
    memory = threads.median("peak_rss") / processes.median("peak_rss")
    rate = threads.rate / processes.rate
    batch, libraries = threads.median("batch_s"), threads.median("rss_libraries")
    lines = [
        "thread workers against worker processes:",
        f"first batch {start:.2f}x sooner (target >= {FASTER_START:g}x): {'yes' if start >= FASTER_START else 'no'}",
        f"peak RSS {memory:.3f}x (target <= {LESS_MEMORY:.3f}x): {'yes' if memory <= LESS_MEMORY else 'no'}",
        f"images/s {rate:.3f}x (target >= {THROUGHPUT:g}x): {'yes' if rate >= THROUGHPUT else 'no'}",
        "what bounds them:",
        f"- start: one batch's work alone takes {batch * 1000:,.1f} ms, which bounds the ratio of first batches at "
        f"{processes.median('first_s') / batch:.2f}x here; the start-up alone: {threads.ms('startup_s')} ms "
        f"(threads) vs {processes.ms('startup_s')} ms (processes), "
        f"{processes.median('startup_s') / threads.median('startup_s'):.2f}x sooner",
        f"- memory: the libraries' {libraries / MIB:,.0f} MiB (RSS before any loader) bound the ratio of peak RSS "
        f"at {libraries / processes.median('peak_rss'):.3f}x here; above them, thread workers add "
        f"{(threads.median('peak_rss') - libraries) / MIB:,.0f} MiB, worker processes "
        f"{(processes.median('peak_rss') - processes.median('rss_libraries')) / MIB:,.0f} MiB; peak PSS "
        f"{threads.median('peak_pss') / processes.median('peak_pss'):.3f}x",
    ]
    graph = rows["bound-graph"]
    if bound.runs and graph.runs:
        lines.append(
            f"- throughput: the work alone in 2 threads runs at {bound.rate:,.0f} images/s "
            f"({bound.rate / processes.rate:.3f}x the worker processes' rate), conveyor's graph alone in 2 threads "
            f"at {graph.rate:,.0f} ({graph.rate / processes.rate:.3f}x); thread workers reach "
            f"{threads.rate / graph.rate:.0%} of the latter"
        )
    if torch_row.runs:
        lines.append(
            f"against torch's DataLoader: images/s {threads.rate / torch_row.rate:.3f}x, first batch "
            f"{torch_row.median('first_s') / threads.median('first_s'):.2f}x sooner, peak RSS "
            f"{threads.median('peak_rss') / torch_row.median('peak_rss'):.3f}x"
        )
    return lines


def commit() -> str:
    try:
        done = subprocess.run(
            ["git", "-C", str(Path(__file__).resolve().parent), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return done.stdout.strip() or "unknown"


def benchmark(shards: int, per_shard: int, repeats: int) -> list[Row]:
    """Write the shards, run every loader ``repeats`` times (alternating); data removed at the end."""
    rows = [Row(loader) for loader in LOADERS.values()]
    with tempfile.TemporaryDirectory(prefix="bench_thread_workers-") as tmp:
        root = Path(tmp)
        started = time.perf_counter()
        parts, prints = images.write_shards(root, images.Sizes(shards, per_shard, 0, 0))
        manifest = images.Manifest(parts={"images": parts}, fingerprints=prints)
        manifest.save(root / "manifest.json")
        print(f"data written in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        for repeat in range(repeats):
            for row in rows:
                result, why = measure(row.loader, root / "manifest.json")
                if result is None:
                    row.failures.append(f"run {repeat + 1}: {why}")
                else:
                    row.runs.append(result)
                progress = f"{result['wall_s']:.2f} s" if result else "failed"
                print(f"  {row.loader.key} run {repeat + 1}: {progress}", file=sys.stderr, flush=True)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--one"]:
        return child(args[1], args[2])
    parser = argparse.ArgumentParser(description=" ".join((__doc__ or "").split("\n\n", 1)[0].split()))
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_SHARDS} shards of {QUICK_PER_SHARD}, one run")
    parser.add_argument("--repeats", type=int, default=None, help="fresh-process runs per row (3; --quick: 1)")
    parser.add_argument("--shards", type=int, default=None, help=f"shards ({SHARDS}; at least {2 * images.WORKERS})")
    parser.add_argument("--per-shard", type=int, default=None, help=f"images per shard ({PER_SHARD})")
    options = parser.parse_args(args)
    repeats = options.repeats or (1 if options.quick else 3)
    shards = options.shards or (QUICK_SHARDS if options.quick else SHARDS)
    per_shard = options.per_shard or (QUICK_PER_SHARD if options.quick else PER_SHARD)
    if repeats < 1 or shards < 2 * images.WORKERS or per_shard < 1:
        parser.error(f"need --repeats >= 1, --shards >= {2 * images.WORKERS}, --per-shard >= 1")
    images.stop_on_sigterm()
    print(images.machine_line())
    print(
        f"settings: {shards} shards x {per_shard} images = {shards * per_shard:,} per epoch, batches of "
        f"{images.IMAGE_BATCH}, workers={images.WORKERS}, repeats={repeats}, commit {commit()}; "
        f"load {os.getloadavg()[0]:.2f} at the start"
    )
    started = time.perf_counter()
    rows = benchmark(shards, per_shard, repeats)
    print(report(rows))
    print(
        "images/s: per run over the median wall time (loader creation to shutdown, workers joined); CPU: the "
        "run's process and its joined children; first batch: loader creation to the first batch (a bound: its "
        "first thread's or process's); memory: peak over the timed epoch of the sums over the run's processes; "
        "start-up alone: the same kind of loader's first item over the shard paths alone (fastest of 3); one "
        "batch alone: 32 images read, decoded, cropped and collated with no loader (fastest of 3); RSS of the "
        "libraries: the run's process before any loader. Medians over the runs."
    )
    print("\n".join(verdicts({row.loader.key: row for row in rows})))
    print(f"load {os.getloadavg()[0]:.2f} at the end; {time.perf_counter() - started:.0f} s")
    failed = any(row.failures for row in rows)
    print("verification FAILED: see the failed runs above" if failed else "verification passed for every run")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
