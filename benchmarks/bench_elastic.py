"""What an elastic resume costs: merging the ranks' states, and the time to the first item
after loading a merged state against loading the rank's own state (same topology).

1. ``merge``: ``DistributedReadingService.merge_rank_states`` on synthesized mid-epoch
   states of W ranks x k workers each (the shape a real job saves: a ``fullsync`` window
   over k worker states of ``shuffle -> sharding_filter -> map -> random_map``; ranks at
   slightly different positions, so the merged state holds runs), median of
   ``--repeats``, with the total size of the states in and the merged state out (JSON).
2. ``resume``: under ``torchrun`` (``--ranks`` ranks, gloo on 127.0.0.1; this script
   launches it), each rank reads ``IterableWrapper(range(N)).shuffle(64)
   .sharding_filter().map(...)`` through 2 forked workers to a cut, saves its state, and
   the ranks share their states (``all_gather_object``) and merge them. Then, alternating,
   ``--repeats`` times each: a new loader loads the rank's own state, or the merged state
   (resumed on the same number of ranks: what is measured is the mechanism, not a
   topology), and the time from ``load_state_dict`` to the first item, and to 1000 items,
   is taken (workers' start included, as in a real restart). Medians over repeats, the
   slowest rank's. Timings are never asserted anywhere.

    python benchmarks/bench_elastic.py [--ranks 3] [--items 200000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from conveyor import DataLoader2, DistributedReadingService, MultiProcessingReadingService, SequentialReadingService
from conveyor.pipes import IterableWrapper

WINDOW = 32
FIRST_ITEMS = 1000


def scaled(x: int) -> int:
    return x * 3 + 1


# --- 1. merging synthesized states --------------------------------------------------------------


def worker_state(read: int) -> dict[str, Any]:
    """A worker's state of ``shuffle(64) -> sharding_filter -> map -> random_map`` after
    the sharding point read ``read`` positions."""
    shuffle = {"window": read // 64, "taken": read % 64, "source": {"index": read // 64 * 64}}
    return {"count": read // 7, "source": {"source": {"position": read, "skip_below": 0, "source": shuffle}}}


def rank_state(rank: int, world: int, workers: int, steps: int) -> dict[str, Any]:
    """Rank ``rank`` after handing out ``steps`` items of its share (plus a little drift)."""
    handed = steps + rank % 3  # ranks a few positions apart: the merged state keeps runs
    last = rank + world * (handed - 1)
    start = max(0, last - world * WINDOW)  # where its fullsync window began
    lanes = [worker_state(start + world * lane + 1) for lane in range(workers)]
    bounds = [[start + world * lane] for lane in range(workers)]
    window = {"workers": lanes, "merge": {"last_lane": workers - 1, "bounds": bounds}}
    return {
        "format": "conveyor.DataLoader2", "version": 3, "fingerprint": "b" * 32, "seed": 5, "seeded": True,
        "epoch": 0, "in_progress": True, "items": steps, "position": [last],
        "pipeline": {"window": {"read": WINDOW, "source": window, "agreed": [WINDOW, WINDOW]}, "material": None,
                     "taken": WINDOW // 2, "yielded": steps, "padded": 0},
        "reading_service": {"services": [{"rank": rank, "world_size": world, "per_item": True},
                                         {"num_workers": workers, "per_item": True}]},
    }  # fmt: skip


def bench_merge(repeats: int) -> list[tuple[str, float, int, int, int]]:
    rows = []
    for world, workers in ((8, 2), (64, 8), (256, 8)):
        states = [rank_state(rank, world, workers, 5000) for rank in range(world)]
        times = []
        merged: dict[str, Any] = {}
        for _ in range(repeats):
            started = time.perf_counter()
            merged = DistributedReadingService.merge_rank_states(states)
            times.append(time.perf_counter() - started)
        runs = len(merged["reading_service"]["elastic"]["handed_out"]["runs"])
        size_in = sum(len(json.dumps(state)) for state in states)
        rows.append(
            (f"{world} ranks x {workers} workers", statistics.median(times), size_in, len(json.dumps(merged)), runs)
        )
    return rows


# --- 2. resuming under torchrun ----------------------------------------------------------------


def loader(items: int) -> DataLoader2:
    pipe = IterableWrapper(range(items)).shuffle(buffer_size=64).sharding_filter().map(scaled)
    service = SequentialReadingService(
        DistributedReadingService(timeout=120, window=WINDOW),
        MultiProcessingReadingService(2, multiprocessing_context="fork"),
    )
    return DataLoader2(pipe, reading_service=service)


def timed_resume(items: int, state: dict[str, Any]) -> tuple[float, float, list[int]]:
    """Seconds from ``load_state_dict`` to the first item and to ``FIRST_ITEMS`` items,
    and those items."""
    with loader(items) as resumed:
        started = time.perf_counter()
        resumed.load_state_dict(state)
        iterator = iter(resumed)
        read = [next(iterator)]
        first = time.perf_counter() - started
        read.extend(next(iterator) for _ in range(FIRST_ITEMS - 1))
        return first, time.perf_counter() - started, read


def rank_main(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cut = args.items // world // 2
    with loader(args.items) as first:
        first.seed(3)
        iterator = iter(first)
        for _ in range(cut):
            next(iterator)
        own = json.loads(json.dumps(first.state_dict()))
    states: list[Any] = [None] * world
    dist.all_gather_object(states, own)
    started = time.perf_counter()
    merged = DistributedReadingService.merge_rank_states(states)
    merge_s = time.perf_counter() - started
    samples: dict[str, list[tuple[float, float]]] = {"own state (same topology)": [], "merged state": []}
    agree = True
    for _ in range(args.repeats):
        *own_times, own_items = timed_resume(args.items, own)
        *merged_times, merged_items = timed_resume(args.items, merged)
        samples["own state (same topology)"].append(tuple(own_times))  # type: ignore[arg-type]
        samples["merged state"].append(tuple(merged_times))  # type: ignore[arg-type]
        # On the same ranks the remaining positions are shared out as before: the same items.
        agree = agree and own_items == merged_items
    agreed = torch.tensor([int(agree)])
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
    medians = torch.tensor(
        [[statistics.median(s[i] for s in runs) for i in (0, 1)] for runs in samples.values()], dtype=torch.float64
    )
    dist.all_reduce(medians, op=dist.ReduceOp.MAX)  # the slowest rank's
    if rank == 0:
        rows = [[name, *medians[i].tolist()] for i, name in enumerate(samples)]
        print(json.dumps({"rows": rows, "merge_s": merge_s, "cut": cut, "world": world, "agree": bool(agreed)}))
    dist.destroy_process_group()


def torchrun() -> list[str]:
    beside = Path(sys.executable).with_name("torchrun")
    found = beside if beside.exists() else shutil.which("torchrun")
    return [str(found)] if found else [sys.executable, "-m", "torch.distributed.run"]


def bench_resume(args: argparse.Namespace) -> dict[str, Any]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [
        *torchrun(), "--nnodes", "1", "--nproc-per-node", str(args.ranks), "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{port}", "--local-addr", "127.0.0.1", "--max-restarts", "0",
        __file__, "--rank-part", "--items", str(args.items), "--repeats", str(args.repeats),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    job = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        out, err = job.communicate(timeout=150)
    finally:
        if job.poll() is None:  # overran: end torchrun and every rank and worker it started
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(10)
    if job.returncode != 0:
        raise SystemExit(f"torchrun failed ({job.returncode}):\n{out}\n{err}")
    return json.loads(next(line for line in out.splitlines() if line.startswith("{")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=3)
    parser.add_argument("--items", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rank-part", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_part:
        rank_main(args)
        return
    print("merge_rank_states on synthesized mid-epoch states (median of", args.repeats, "runs)")
    print(f"| {'job':<22} | {'merge ms':>9} | {'states in (JSON)':>16} | {'merged (JSON)':>13} | {'runs':>4} |")
    print(f"|{'-' * 24}|{'-' * 11}|{'-' * 18}|{'-' * 15}|{'-' * 6}|")
    for name, seconds, size_in, size_out, runs in bench_merge(args.repeats):
        print(f"| {name:<22} | {seconds * 1e3:>9.2f} | {size_in:>14,} B | {size_out:>11,} B | {runs:>4} |")
    result = bench_resume(args)
    print()
    print(
        f"resume under torchrun: {result['world']} ranks x 2 forked workers, {args.items:,} items, cut after "
        f"{result['cut']:,} items per rank; merge of the real states: {result['merge_s'] * 1e3:.2f} ms "
        f"(medians of {args.repeats}, slowest rank); both resumes read the same {FIRST_ITEMS} items on every "
        f"rank: {'yes' if result['agree'] else 'NO'}"
    )
    print(f"| {'resume from':<26} | {'to 1st item ms':>14} | {'to ' + str(FIRST_ITEMS) + ' items ms':>15} |")
    print(f"|{'-' * 28}|{'-' * 16}|{'-' * 17}|")
    for name, first, many in result["rows"]:
        print(f"| {name:<26} | {first * 1e3:>14.1f} | {many * 1e3:>15.1f} |")


if __name__ == "__main__":
    main()
