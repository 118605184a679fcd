"""Where conveyor's CPU per item goes on ``bench_peers.py``'s compute workload, beyond the
work itself: issue 18's profile.

The workload is ``bench_peers``' ``compute`` (``work.compute.compute``, sized for ~200 µs of numpy
per item, a small result) through ``DataLoader2(IterableWrapper(range(n))
.sharding_filter().map(compute), MultiProcessingReadingService(num_workers=2))``. Each
round, alternating, in fresh child processes (so every run starts equal):

- ``bound``: two forked processes doing every other item's work, one message each at
  the end: the work alone, on both cores;
- ``conveyor`` (statistics on, the default) and ``conveyor, statistics off``: the loader
  from its creation to the end of its shutdown, with the CPU of the main process
  (``RUSAGE_SELF``) and of its workers (``RUSAGE_CHILDREN``: forked, and reaped at
  shutdown) apart;
- ``worker loop alone``: one worker's state machine (``WorkerStateMachine.produce``: the
  pulls, each item's state and position, chunks pickled as for the pipe) over half the
  items in one process with no other process running, against the same items' work
  alone in that process (before and after the loop): the loop's own cost per item, with
  nothing to contend with.

The table splits conveyor's CPU per item into: the work (the bound's), the main process,
the worker loop's own cost (measured alone), and the rest of the workers' CPU (what
running three processes on the cores costs the workers: preemptions, wake-ups, caches
shared with the main process; plus anything the loop alone does not show). Medians of
``--repeats`` rounds.

    python benchmarks/profile_overhead.py [--items N] [--repeats R]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from work.compute import COMPUTE_SIZE, compute, size_children_for  # noqa: E402  (the benchmarks folder is not a package)

MODES = ("bound", "conveyor", "conveyor-nostats", "loop")


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def run_bound(n: int) -> dict[str, float]:
    """The work alone in two forked processes, every other item each."""
    started, before = time.perf_counter(), _cpu(resource.RUSAGE_CHILDREN)
    pids = []
    for index in range(2):
        pid = os.fork()
        if pid == 0:  # never returns: whatever happens, the forked copy ends here
            code = 1
            try:
                for i in range(index, n, 2):
                    compute(i)
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        if status != 0:
            raise SystemExit(f"a bound process failed with status {status}")
    wall = time.perf_counter() - started
    return {"wall_s": wall, "main_s": 0.0, "workers_s": _cpu(resource.RUSAGE_CHILDREN) - before}


def run_conveyor(n: int, collect_stats: bool) -> dict[str, float]:
    """One epoch of the loader, creation to shutdown; checks every item came once."""
    from conveyor import DataLoader2, MultiProcessingReadingService
    from conveyor.pipes import IterableWrapper

    started = time.perf_counter()
    main_before, workers_before = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
    pipe = IterableWrapper(range(n)).sharding_filter().map(compute)
    loader = DataLoader2(
        pipe, reading_service=MultiProcessingReadingService(num_workers=2), collect_stats=collect_stats
    )
    seen = bytearray(n)
    for i, _ in loader:
        seen[i] += 1
    loader.shutdown()
    wall = time.perf_counter() - started
    if seen.count(1) != n:
        raise SystemExit(f"conveyor delivered {seen.count(0)} ids never and {n - seen.count(0) - seen.count(1)} twice")
    return {
        "wall_s": wall,
        "main_s": _cpu(resource.RUSAGE_SELF) - main_before,
        "workers_s": _cpu(resource.RUSAGE_CHILDREN) - workers_before,
    }


def run_loop(n: int) -> dict[str, float]:
    """One worker's loop over half the items in this process, against their work alone."""
    from conveyor.core.worker_info import WorkerInfo
    from conveyor.graph import SHARDING_PRIORITIES, apply_sharding
    from conveyor.pipes import IterableWrapper
    from conveyor.random import SeedGenerator
    from conveyor.workers.child.state_machine import Phase, WorkerStateMachine
    from conveyor.workers.transport.codec import Encoder
    from conveyor.workers.transport.protocol import StartEpoch

    def work_alone() -> float:
        before = _cpu(resource.RUSAGE_SELF)
        for i in range(0, n, 2):
            compute(i)
        return _cpu(resource.RUSAGE_SELF) - before

    for i in range(50):  # numpy's FFT caches its plans on the first calls
        compute(i)
    work = work_alone()
    graph = IterableWrapper(range(n)).sharding_filter().map(compute)
    apply_sharding(graph, 2, 0, SHARDING_PRIORITIES.MULTIPROCESSING)  # worker 0 of 2, as in the pool
    machine = WorkerStateMachine(graph, WorkerInfo(2, 0), Encoder(None))
    machine.start_epoch(StartEpoch(0, SeedGenerator(0), None, 1 << 30, True))
    before = _cpu(resource.RUSAGE_SELF)
    while machine.phase is Phase.RUNNING:
        machine.produce()
    loop = _cpu(resource.RUSAGE_SELF) - before
    return {"work_s": (work + work_alone()) / 2, "loop_s": loop}  # the work before and after: drift cancels


def child(mode: str, n: int) -> dict[str, Any]:
    if mode == "bound":
        return run_bound(n)
    if mode == "loop":
        return run_loop(n)
    return run_conveyor(n, collect_stats=mode == "conveyor")


def measure(mode: str, n: int) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--child", mode, "--items", str(n)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise SystemExit(f"the {mode} run failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--compute-us",
        type=float,
        default=200.0,
        help="size the op for this many µs of CPU per item here, as bench_peers.py does (0: keep its size)",
    )
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.items < 2 or args.repeats < 1 or args.compute_us < 0:
        parser.error("--items must be >= 2, --repeats >= 1 and --compute-us >= 0")
    if args.child:
        print(json.dumps(child(args.child, args.items)))
        return 0
    size = COMPUTE_SIZE
    if args.compute_us:
        size, seconds = size_children_for(args.compute_us)
        print(f"op sized for ~{args.compute_us:,.0f} µs: {size:,} samples, {seconds * 1e6:,.1f} µs per call here")
    n = args.items
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    for round_ in range(args.repeats):
        for mode in MODES:
            runs[mode].append(measure(mode, n))
            print(f"  round {round_ + 1}/{args.repeats}: {mode}", file=sys.stderr)

    def per_item(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[mode]) / n * 1e6

    def rate(mode: str) -> float:
        return n / statistics.median(r["wall_s"] for r in runs[mode])

    half = n // 2 + n % 2
    loop_us = statistics.median((r["loop_s"] - r["work_s"]) / half * 1e6 for r in runs["loop"])
    bound_us = per_item("bound", "workers_s")
    print(
        f"compute workload ({size:,} samples), {n:,} items, 2 workers, medians of {args.repeats}; "
        f"load {os.getloadavg()[0]:.2f}"
    )
    print("| run | items/s | % of the bound | CPU µs/item | main process | workers | workers beyond the work |")
    print("|---|---|---|---|---|---|---|")
    for mode, label in (
        ("bound", "bound: the work alone"),
        ("conveyor", "conveyor"),
        ("conveyor-nostats", "conveyor, statistics off"),
    ):
        main_us, workers_us = per_item(mode, "main_s"), per_item(mode, "workers_s")
        print(
            f"| {label} | {rate(mode):,.0f} | {rate(mode) / rate('bound'):.1%} | {main_us + workers_us:.1f} | "
            f"{main_us:.1f} | {workers_us:.1f} | {workers_us - bound_us:+.1f} |"
        )
    main_us, workers_us = per_item("conveyor", "main_s"), per_item("conveyor", "workers_s")
    total = main_us + workers_us - bound_us
    rest = workers_us - bound_us - loop_us
    share = f"{total / bound_us:.1%} of the work's {bound_us:.1f} µs"
    print(f"\nconveyor's CPU per item beyond the work: {total:.1f} µs ({share})")
    for label, value in (
        ("the main process (receiving, merging, handing out; start-up and shutdown)", main_us),
        ("the worker loop's own cost, measured alone (states, positions, chunks)", loop_us),
        ("the rest of the workers' CPU (three processes on the cores: preemption, wake-ups, caches)", rest),
    ):
        print(f"- {label}: {value:.1f} µs ({value / total:.0%})" if total > 0 else f"- {label}: {value:.1f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
