"""What the agreed epoch end costs: a rank's loader with ``DistributedReadingService`` (which ends
every epoch with a windowed ``fullsync``) against the same pipeline, sharded the same way,
read without it.

Two ranks run on this machine (gloo over 127.0.0.1, one process each). Each reads
``IterableWrapper(range(N)).sharding_filter()`` (its half), in-process, with nothing done per
item: the worst case, where the agreement's cost is not hidden behind any work. Workloads:
``small`` (N single ints), ``batched`` (the same ints in batches of 64: what a training
loop usually reads after ``fullsync``) and ``training`` (those batches, each followed by a
0.5 ms step that waits without using the CPU, as a step waiting on a GPU does: the
agreement's latency then hides behind the step, its CPU cost remains). Runs alternate (without, window A, window B, ...,
without, ...) and the table reports medians over ``--repeats`` runs of rank 0's wall time
and CPU time from ``iter()`` to the last item. Timings are never asserted anywhere.

    python benchmarks/bench_distributed.py [--items N] [--repeats R] [--windows 8,32,128]
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing
import socket
import statistics
import time
from typing import Any

import torch.distributed as dist

from conveyor import DataLoader2, DistributedReadingService, InProcessReadingService
from conveyor.graph import SHARDING_PRIORITIES, apply_sharding
from conveyor.pipes import IterableWrapper

WORLD = 2
WORKLOADS = ("small", "batched", "training")
#: The simulated training step of the ``training`` workload, per batch.
STEP_S = 0.0005


def pipeline(items: int, workload: str) -> Any:
    pipe = IterableWrapper(range(items)).sharding_filter()
    return pipe if workload == "small" else pipe.batch(64)


def timed_epoch(loader: DataLoader2, step_s: float) -> tuple[float, float, int]:
    start_wall, start_cpu = time.perf_counter(), time.process_time()
    count = 0
    for _ in loader:
        count += 1
        if step_s:
            time.sleep(step_s)  # a training step that waits on an accelerator: no CPU here
    return time.perf_counter() - start_wall, time.process_time() - start_cpu, count


def without_fullsync(items: int, workload: str, rank: int) -> DataLoader2:
    pipe = apply_sharding(pipeline(items, workload), WORLD, rank, SHARDING_PRIORITIES.DISTRIBUTED)
    return DataLoader2(pipe, reading_service=InProcessReadingService())


def with_fullsync(items: int, workload: str, window: int) -> DataLoader2:
    return DataLoader2(pipeline(items, workload), reading_service=DistributedReadingService(window=window))


def rank_main(rank: int, port: int, args: argparse.Namespace, results: Any) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
        timeout=datetime.timedelta(seconds=120),
    )  # fmt: skip
    rows: dict[tuple[str, str], list[tuple[float, float, int]]] = {}
    configs = [("without", None)] + [(f"window={w}", w) for w in args.windows]
    for workload in WORKLOADS:
        step_s = STEP_S if workload == "training" else 0.0
        loaders = {
            name: without_fullsync(args.items, workload, rank) if window is None
            else with_fullsync(args.items, workload, window)
            for name, window in configs
        }  # fmt: skip
        for loader in loaders.values():  # warm-up: groups created, code paths run once
            timed_epoch(loader, step_s)
        for _ in range(args.repeats):
            for name, loader in loaders.items():
                dist.barrier()
                rows.setdefault((workload, name), []).append(timed_epoch(loader, step_s))
        for loader in loaders.values():
            loader.shutdown()
    if rank == 0:
        results.put(rows)
    dist.destroy_process_group()


def report(rows: dict[tuple[str, str], list[tuple[float, float, int]]], args: argparse.Namespace) -> None:
    print(f"fullsync overhead: {WORLD} ranks on this machine, {args.items:,} items, medians of {args.repeats} runs")
    header = ("workload", "loader", "items/rank", "items/s", "wall vs without", "CPU µs/item", "CPU added µs/item")
    print(" | ".join(header))
    for workload in WORKLOADS:
        base_wall = statistics.median(r[0] for r in rows[(workload, "without")])
        base_cpu = statistics.median(r[1] for r in rows[(workload, "without")])
        for (load, name), runs in rows.items():
            if load != workload:
                continue
            wall = statistics.median(r[0] for r in runs)
            cpu = statistics.median(r[1] for r in runs)
            count = runs[0][2]
            print(
                f"{workload} | {name} | {count:,} | {count / wall:,.0f} | {wall / base_wall:.2f}x | "
                f"{cpu / count * 1e6:.2f} | {(cpu - base_cpu) / count * 1e6:+.2f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--windows", type=lambda text: [int(w) for w in text.split(",")], default=[8, 32, 128])
    args = parser.parse_args()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    ranks = [context.Process(target=rank_main, args=(rank, port, args, results)) for rank in range(WORLD)]
    for process in ranks:
        process.start()
    try:
        rows = results.get(timeout=1800)
    finally:
        for process in ranks:
            process.join(60)
            if process.is_alive():
                process.kill()
    report(rows, args)


if __name__ == "__main__":
    main()
