"""What distribution costs: the agreed epoch end (``DistributedReadingService``'s windowed
``fullsync``), an elastic resume from a merged state, and merging the ranks' states.

    python benchmarks/bench_distributed.py [--workloads small,batched,training,resume,
        merge-8x2,merge-64x8,merge-256x8] [--loaders ...] [--repeats 5] [--quick] [--save | --out PATH]

Each run starts its ranks afresh: processes spawned on this machine, gloo over 127.0.0.1,
which live for the run's warm-up and timed epochs. Workloads and loaders:

- ``small``, ``batched``, ``training``: 2 ranks read ``IterableWrapper(range(N))
  .sharding_filter()`` in their own process, as single ints, in batches of 64, or in those
  batches each followed by a 0.5 ms step that waits without using the CPU (as a step
  waiting on a GPU does: the agreement's latency then hides behind it, its CPU cost
  remains). ``without``: sharded the same way with no agreement; ``window-8``,
  ``window-32``, ``window-128``: ``DistributedReadingService(window=K)``, which ends every
  epoch with a windowed ``fullsync``. Nothing is done per item: the worst case, where the
  agreement's cost hides behind no work.
- ``resume``: 3 ranks read ``IterableWrapper(range(N)).shuffle(64).sharding_filter()
  .map(...)`` through ``DistributedReadingService`` and 2 forked workers each, to the
  middle of their shares; they save their states, share them and merge them. Then each
  rank's new loader loads its own state (``own-state``, the same topology) or the merged
  state (``merged-state``) and reads 1,000 items; the epoch is timed from
  ``load_state_dict`` on (workers' start included, as in a real restart). The resumed
  items must be new ones, each delivered once.
- ``merge-8x2``, ``merge-64x8``, ``merge-256x8``: ``merge_rank_states`` (``merge``) on
  synthesized mid-epoch states of W ranks x k workers (the shape a real job saves: a
  ``fullsync`` window over k worker states, ranks a few positions apart so the merged
  state holds runs), with the JSON size of the states in and of the merged state out.

The ranks measure their epoch themselves (their processes live on across it): wall time
from the loaders' creation to the slowest rank's shutdown, the first item rank 0's, CPU
the sum of every rank's process and its reaped workers over its epoch. How every run is
checked, and measured otherwise: :mod:`harness`.
"""

from __future__ import annotations

import datetime
import json
import multiprocessing
import queue
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from conveyor.tools.bench.harness import cli
from conveyor.tools.bench.harness.declare import Context, Epoch, Loader, RunError, Suite, Workload
from conveyor.tools.bench.harness.processes import cpu_seconds
from conveyor.tools.bench.harness.results import Result
from conveyor.tools.bench.harness.tally import Tally

WORLD, RESUME_WORLD = 2, 3
BATCH = 64
#: The training workload's step per batch, waiting without the CPU.
STEP_S = 0.0005
#: resume: the fullsync window and the items read after the resume.
WINDOW, RESUMED = 32, 1000
#: Seconds a rank may take for an epoch before the run fails.
RANK_TIMEOUT_S = 600.0


def scaled(x: int) -> int:
    return x * 3 + 1


# --- the ranks (spawned processes, alive for a run's two epochs) ------------------------------


def fullsync_epoch(rank: int, spec: Mapping[str, Any]) -> dict[str, Any]:
    """One epoch of a fullsync loader (or the same sharding without one) on this rank."""
    from conveyor import DataLoader2, DistributedReadingService, InProcessReadingService
    from conveyor.graph import SHARDING_PRIORITIES, apply_sharding
    from conveyor.pipes import IterableWrapper

    workload, loader_key, n = spec["workload"], spec["loader"], spec["items"]
    pipe = IterableWrapper(range(n)).sharding_filter()
    pipe = pipe if workload == "small" else pipe.batch(BATCH)
    step = STEP_S if workload == "training" else 0.0
    ids: list[int] = []
    cpu, start, first = cpu_seconds(), time.perf_counter(), None
    if loader_key == "without":
        sharded = apply_sharding(pipe, WORLD, rank, SHARDING_PRIORITIES.DISTRIBUTED)
        loader = DataLoader2(sharded, reading_service=InProcessReadingService())
    else:
        window = int(loader_key.removeprefix("window-"))
        loader = DataLoader2(pipe, reading_service=DistributedReadingService(window=window))
    for item in loader:
        first = first if first is not None else time.perf_counter() - start
        ids.extend(item if isinstance(item, list) else [item])
        if step:
            time.sleep(step)  # a training step that waits on an accelerator: no CPU here
    loader.shutdown()
    return {"wall_s": time.perf_counter() - start, "first_s": first, "cpu_s": cpu_seconds() - cpu, "ids": ids}


def resume_loader(items: int) -> Any:
    from conveyor import DataLoader2, DistributedReadingService, MultiProcessingReadingService, SequentialReadingService
    from conveyor.pipes import IterableWrapper

    pipe = IterableWrapper(range(items)).shuffle(buffer_size=64).sharding_filter().map(scaled)
    service = SequentialReadingService(
        DistributedReadingService(timeout=120, window=WINDOW),
        MultiProcessingReadingService(2, multiprocessing_context="fork"),
    )
    return DataLoader2(pipe, reading_service=service)


def resume_epoch(rank: int, world: int, spec: Mapping[str, Any]) -> dict[str, Any]:
    """Read to the cut, share and merge the states (untimed), then resume from the rank's
    own state or the merged one and read ``RESUMED`` items, timed from ``load_state_dict``."""
    import torch.distributed as dist

    from conveyor import DistributedReadingService

    n = spec["items"]
    with resume_loader(n) as first_loader:
        first_loader.seed(3)
        iterator = iter(first_loader)
        before = [(next(iterator) - 1) // 3 for _ in range(n // world // 2)]
        own = json.loads(json.dumps(first_loader.state_dict()))
    states: list[Any] = [None] * world
    dist.all_gather_object(states, own)
    merging = time.perf_counter()
    merged = DistributedReadingService.merge_rank_states(states)
    merge_ms = (time.perf_counter() - merging) * 1e3
    state = merged if spec["loader"] == "merged-state" else own
    read = min(RESUMED, n // world - len(before) - 1)
    dist.barrier()
    cpu, start = cpu_seconds(), time.perf_counter()
    with resume_loader(n) as resumed:
        resumed.load_state_dict(state)
        iterator = iter(resumed)
        ids = [(next(iterator) - 1) // 3]
        first = time.perf_counter() - start
        ids.extend((next(iterator) - 1) // 3 for _ in range(read - 1))
        many = time.perf_counter() - start
    return {
        "wall_s": time.perf_counter() - start,
        "first_s": first,
        "cpu_s": cpu_seconds() - cpu,
        "ids": ids,
        "before": before,
        "to_items_ms": many * 1e3,
        "merge_ms": merge_ms,
    }


def rank_main(rank: int, world: int, port: int, commands: Any, results: Any) -> None:
    """A rank: joins the group, then runs each epoch it is sent until told to stop."""
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=120),
    )
    try:
        while (spec := commands.get()) is not None:
            dist.barrier()
            if spec["workload"] == "resume":
                results.put((rank, resume_epoch(rank, world, spec)))
            else:
                results.put((rank, fullsync_epoch(rank, spec)))
    finally:
        dist.destroy_process_group()


class Ranks:
    """The run's rank processes, started at its first epoch and stopped after its last."""

    def __init__(self, world: int) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        spawn = multiprocessing.get_context("spawn")
        self.world = world
        self.commands = [spawn.Queue() for _ in range(world)]
        self.results = spawn.Queue()
        self.processes = [
            spawn.Process(target=rank_main, args=(rank, world, port, self.commands[rank], self.results))
            for rank in range(world)
        ]
        for process in self.processes:
            process.start()

    def epoch(self, spec: dict[str, Any]) -> dict[int, dict[str, Any]]:
        for commands in self.commands:
            commands.put(spec)
        found: dict[int, dict[str, Any]] = {}
        while len(found) < self.world:
            try:
                rank, result = self.results.get(timeout=RANK_TIMEOUT_S)
            except queue.Empty:
                raise RunError(f"a rank gave no result within {RANK_TIMEOUT_S:.0f} s") from None
            found[rank] = result
        return found

    def stop(self) -> None:
        for commands in self.commands:
            commands.put(None)
        for process in self.processes:
            process.join(60)
            if process.is_alive():
                process.kill()
                process.join()


RANKS: dict[str, Ranks] = {}  # the run's ranks (a run is one process, its two epochs one after the other)


def ranks_epoch(context: Context) -> Epoch:
    """One epoch on every rank: the warm-up starts the ranks, the timed epoch stops them."""
    assert context.loader is not None
    world = RESUME_WORLD if context.workload.key == "resume" else WORLD
    ranks = RANKS.setdefault("run", Ranks(world))
    try:
        found = ranks.epoch({"workload": context.workload.key, "loader": context.loader.key, "items": context.items})
    finally:
        if not context.warmup:
            ranks.stop()
    resume = context.workload.key == "resume"
    tally = ResumeTally(context.items) if resume else Tally(context.items)
    if resume:
        tally.before = {i for result in found.values() for i in result["before"]}
    for result in found.values():
        for i in result["ids"]:
            tally.see(i)
    extra = {key: max(r[key] for r in found.values()) for key in ("to_items_ms", "merge_ms")} if resume else {}
    return Epoch(
        wall_s=max(r["wall_s"] for r in found.values()),
        first_s=found[0]["first_s"],
        tally=tally,
        cpu_s=sum(r["cpu_s"] for r in found.values()),
        extra=extra,
    )


class ResumeTally(Tally):
    """The resumed items: new ones (none read before the cut), each once."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.before: set[int] = set()  # the ids the ranks read before the cut

    def see(self, item: Any) -> None:
        self.count += 1
        if item in self.before:
            self.wrong(f"id {item}", "an item not read before the cut")
        self.id(item)

    def summary(self) -> dict[str, Any]:
        found = super().summary()
        found["expected"] = sum(1 for c in self.counts if c)
        found["right"] = self.counts.count(1)
        found["missing"] = 0
        return found


# --- merging synthesized states -----------------------------------------------------------------


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


def merge_epoch(context: Context) -> Epoch:
    """One merge of the workload's synthesized states; its one item is the merged state."""
    from conveyor import DistributedReadingService

    world, workers = (int(part) for part in context.workload.key.removeprefix("merge-").split("x"))
    states = [rank_state(rank, world, workers, 5000) for rank in range(world)]
    start, cpu = time.perf_counter(), time.process_time()
    merged = DistributedReadingService.merge_rank_states(states)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    tally = Tally(1)
    runs = merged.get("reading_service", {}).get("elastic", {}).get("handed_out", {}).get("runs")
    if runs:
        tally.see(0)
    else:
        tally.wrong(sorted(merged), "a merged state with the ranks' handed-out runs")
    extra = {
        "merge_ms": wall * 1e3,
        "states_bytes": sum(len(json.dumps(state)) for state in states),
        "merged_bytes": len(json.dumps(merged)),
        "runs": len(runs or ()),
    }
    return Epoch(wall, wall, tally, cpu_s=cpu, extra=extra)


# --- the suite ---------------------------------------------------------------------------------


def tally(context: Context) -> Tally:
    return Tally(context.items)  # what the ranks' epochs use is made where they are merged


FULLSYNC = ("small", "batched", "training")
MERGES = ("merge-8x2", "merge-64x8", "merge-256x8")
WORKLOADS = (
    Workload("small", 200_000, 4_000, "ints, no work per item, 2 ranks", tally),
    Workload("batched", 200_000, 4_000, "ints in batches of 64, 2 ranks", tally),
    Workload("training", 200_000, 4_000, "batches of 64, each with a 0.5 ms step, 2 ranks", tally),
    Workload("resume", 200_000, 12_000, "shuffled ints, 3 ranks x 2 workers, resumed mid-epoch", tally),
    *(
        Workload(key, 1, 1, f"merge of {key.removeprefix('merge-').replace('x', ' ranks x ')} workers' states", tally)
        for key in MERGES
    ),
)
LOADERS = (
    Loader("without", "sharded, no agreement", epoch=ranks_epoch, workloads=FULLSYNC, packages=("conveyor", "torch")),
    *(
        Loader(
            f"window-{w}",
            f"fullsync, window {w}",
            epoch=ranks_epoch,
            workloads=FULLSYNC,
            packages=("conveyor", "torch"),
        )
        for w in (8, 32, 128)
    ),
    Loader(
        "own-state",
        "resumed from the rank's own state",
        epoch=ranks_epoch,
        workloads=("resume",),
        packages=("conveyor", "torch"),
    ),
    Loader(
        "merged-state",
        "resumed from the merged state",
        epoch=ranks_epoch,
        workloads=("resume",),
        packages=("conveyor", "torch"),
    ),
    Loader("merge", "merge_rank_states", epoch=merge_epoch, workloads=MERGES, packages=("conveyor",)),
)


def notes(result: Result) -> list[str]:
    lines = []
    for workload in FULLSYNC:
        base = result.median(workload, "without", "wall_s")
        for window in (8, 32, 128):
            wall = result.median(workload, f"window-{window}", "wall_s")
            if base and wall:
                lines.append(f"{workload}, window {window}: {wall / base:.2f}x the wall time without the agreement")
    return lines


SUITE = Suite(
    name="distributed",
    title="The agreed epoch end, an elastic resume, and merging the ranks' states",
    path=str(Path(__file__).resolve()),
    workloads=WORKLOADS,
    loaders=LOADERS,
    subject="without",
    columns=(
        "items_per_s",
        "cpu_us_per_item",
        "first_item_ms",
        "to_items_ms",
        "merge_ms",
        "states_bytes",
        "merged_bytes",
        "runs",
    ),
    ratio=None,
    metrics={
        "to_items_ms": (f"to {RESUMED:,} items ms", "ms"),
        "merge_ms": ("merge ms", "ms"),
        "states_bytes": ("states in, JSON B", "B"),
        "merged_bytes": ("merged, JSON B", "B"),
        "runs": ("runs in the merged state", "count"),
    },
    repeats=5,
    notes=notes,
)


def main(argv: list[str] | None = None) -> int:
    return cli.main(SUITE, argv, " ".join((__doc__ or "").split("\n\n", 1)[0].split()))


if __name__ == "__main__":
    sys.exit(main())
