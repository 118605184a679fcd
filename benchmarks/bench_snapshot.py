"""What a checkpoint at every step costs: an epoch read with and without ``state_dict()``
(and its serialisation) after every batch, through conveyor's loaders and torchdata's
``StatefulDataLoader(snapshot_every_n_steps=1)``, 2 worker processes each (issue 30).

    bash benchmarks/peer_envs.sh nodes     # once: the venv with torchdata 0.11 (StatefulDataLoader)
    python benchmarks/bench_snapshot.py [--items 24000] [--batch-size 16] [--repeats 5]
        [--item-us 200] [--loaders conveyor-map,conveyor-iterable,...] [--out PATH]
    python benchmarks/bench_snapshot.py --table [PATH]     # the table of a saved result
    python benchmarks/bench_snapshot.py --profile CASE [--items N]   # cProfile of CASE's calls

Every loader reads the same items with 2 worker processes (the default start method) and
``batch_size`` 16; item ``i`` is ``peers_work.compute(i)``: ``(i, x)``, ``x`` from a
fixed numpy op (FFT filtering) sized here for ``--item-us`` µs of CPU, so an epoch lasts a
few seconds of real work. The loaders (:data:`CASES`):

- ``conveyor-map``: ``conveyor.DataLoader`` over a map-style ``Dataset``, ``shuffle=True``
  with a seeded ``torch.Generator``;
- ``conveyor-iterable``: ``conveyor.DataLoader`` over an ``IterableDataset`` that reads
  its worker's share (``get_worker_info()``), no state of its own;
- ``conveyor-dl2``: ``conveyor.DataLoader2`` over
  ``IterableWrapper(range(n)).shuffle().sharding_filter().map(compute).batch(16).collate()``
  with ``MultiProcessingReadingService(num_workers=2)``, seeded;
- ``torchdata-map``, ``torchdata-iterable``: torchdata's ``StatefulDataLoader`` with
  ``snapshot_every_n_steps=1`` (its default) over the same two datasets, run in the venv
  ``peer_envs.sh nodes`` makes (torchdata 0.11.0 with the project's torch and numpy). A
  row says ``unavailable`` when that venv is missing.

Each loader runs in two modes: ``off``, the epoch alone; ``every``, after every batch
``state = loader.state_dict()`` and its serialisation as a checkpoint would write it
(conveyor's state is plain JSON-safe data: ``json.dumps``; torchdata's holds tensors, which
JSON cannot take: ``torch.save`` into memory, as torch checkpoints do). torchdata's
workers snapshot every step in both modes (``snapshot_every_n_steps=1`` is a setting of
the loader, not of the calls).

Each run is a fresh child process (``--one CASE MODE``): a small warm-up epoch in the
same mode with a loader of its own, then the timed epoch, from the loader's creation to
its last batch and its shutdown (workers joined). CPU is user + system CPU of the child
and of its reaped children, the workers (``getrusage`` ``RUSAGE_SELF`` +
``RUSAGE_CHILDREN``), over that span: the whole process tree. The calls are timed one by
one (wall and the calling thread's CPU). Runs alternate between loaders and modes (the
modes' order flips every repeat); the results are medians over ``--repeats`` runs:

- **overhead**: the ``every`` epoch's median wall time over the ``off`` one's, less 1 (the
  same for CPU): what the checkpoints cost end to end, noise included; and, paired, the
  median over the repeats of the same ratio between each repeat's two runs (back to back,
  so a slow phase of the machine moves them less);
- **in calls**: the time spent inside ``state_dict()`` and the serialisation as a share
  of the ``every`` epoch's wall time (which counts the moments the workers hold the main
  process's core), and their CPU (the calling thread's) as a share of the epoch's CPU (all
  its processes): the direct cost, which the noise between runs does not enter, and which
  the machine's load moves less than it moves wall times;
- **µs per call**: ``state_dict()`` and the serialisation apart, wall and CPU (the epoch's
  total over its calls); **state bytes**: the serialised state's size (median over the
  epoch's calls).

``--profile CASE`` runs one epoch of ``CASE`` in this process instead, with ``cProfile``
on around each ``state_dict()`` and its serialisation only, and prints the functions by
cumulative time (the op's size is ``peers_work``'s default there).

Every epoch (the warm-ups too) is checked: every id delivered exactly once, the checksum of
the values right, no worker process left after the shutdown; a failed run fails its row
and the exit code is 1. The results go to ``--out`` as JSON (machine, versions, git
commit, date, every run); ``--table`` prints the Markdown table from such a file.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

import bench_peers as peers
from child_processes import cpu_seconds, end_new_processes
from peers_work import (
    COMPUTE_SIZES,
    SIZE_VARIABLE,
    Tally,
    check_delivery,
    compute,
    expected_checksum,
    size_children_for,
)

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "snapshot.json"
#: bench_peers.py's name for the venv (``peer_envs.sh nodes``) whose torchdata has ``StatefulDataLoader``.
TORCHDATA_PEER = "nodes"
WORKERS = 2
MODES = ("off", "every")
#: The issue's bound on what a state_dict() at every step may cost, % of the epoch's time.
TARGET_PCT = 2.0
#: Seconds one run may take before it counts as failed.
RUN_TIMEOUT_S = 600.0
#: The sampler's generator's seed (the same order in every run).
SHUFFLE_SEED = 1234


@dataclass(frozen=True)
class Case:
    key: str
    label: str
    peer: bool  # runs under torchdata's venv
    serialiser: str


CASES = {
    c.key: c
    for c in (
        Case("conveyor-map", "conveyor DataLoader, map-style, shuffle", False, "json.dumps"),
        Case("conveyor-iterable", "conveyor DataLoader, IterableDataset", False, "json.dumps"),
        Case("conveyor-dl2", "conveyor DataLoader2 + MultiProcessingReadingService", False, "json.dumps"),
        Case("torchdata-map", "torchdata StatefulDataLoader, map-style, shuffle", True, "torch.save"),
        Case("torchdata-iterable", "torchdata StatefulDataLoader, IterableDataset", True, "torch.save"),
    )
}


# --- the child: one epoch ----------------------------------------------------------------


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


def make_loader(case: str, n: int, batch_size: int) -> Any:
    """``case``'s loader over ``n`` items (imports only that loader's library)."""
    if case == "conveyor-dl2":
        from conveyor import DataLoader2, MultiProcessingReadingService
        from conveyor.pipes import IterableWrapper

        graph = IterableWrapper(range(n)).shuffle().sharding_filter().map(compute).batch(batch_size).collate()
        loader = DataLoader2(graph, reading_service=MultiProcessingReadingService(num_workers=WORKERS))
        loader.seed(SHUFFLE_SEED)
        return loader
    if case.startswith("conveyor-"):
        from conveyor import DataLoader as Loader

        extra: dict[str, Any] = {}
    else:
        from torchdata.stateful_dataloader import StatefulDataLoader as Loader

        extra = {"snapshot_every_n_steps": 1}
    if case.endswith("-map"):
        generator = torch.Generator()
        generator.manual_seed(SHUFFLE_SEED)
        return Loader(Items(n), batch_size=batch_size, shuffle=True, generator=generator, num_workers=WORKERS, **extra)
    return Loader(ItemStream(n), batch_size=batch_size, num_workers=WORKERS, **extra)


def serialiser(case: str) -> Callable[[Any], bytes]:
    if CASES[case].serialiser == "json.dumps":
        return lambda state: json.dumps(state).encode()

    def torch_save(state: Any) -> bytes:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        return buffer.getvalue()

    return torch_save


def epoch(case: str, mode: str, n: int, batch_size: int) -> dict[str, Any]:
    """One checked epoch, timed from the loader's creation to its shutdown; in mode
    ``every``, each batch is followed by a state_dict() and its serialisation, timed."""
    serialise = serialiser(case)
    tally = Tally("compute", n)
    calls_s: list[float] = []  # state_dict(), wall
    serialise_s: list[float] = []
    calls_cpu_s = serialise_cpu_s = 0.0
    sizes: list[int] = []
    batches = 0
    before = set(multiprocessing.active_children())
    cpu = cpu_seconds()
    main_cpu = time.process_time()
    start = time.perf_counter()
    loader: Any = make_loader(case, n, batch_size)
    try:
        for ids, values in loader:
            batches += 1
            for item in zip(ids.tolist(), values.tolist(), strict=True):
                tally.see(item)
            if mode == "every":
                wall0, cpu0 = time.perf_counter(), time.thread_time()
                state = loader.state_dict()
                wall1, cpu1 = time.perf_counter(), time.thread_time()
                blob = serialise(state)
                wall2, cpu2 = time.perf_counter(), time.thread_time()
                calls_s.append(wall1 - wall0)
                serialise_s.append(wall2 - wall1)
                calls_cpu_s += cpu1 - cpu0
                serialise_cpu_s += cpu2 - cpu1
                sizes.append(len(blob))
        ids = values = state = None
        if hasattr(loader, "shutdown"):  # conveyor; torchdata's workers end with the epoch
            loader.shutdown()
        loader = None
        wall_s = time.perf_counter() - start
        main_cpu_s = time.process_time() - main_cpu
        stray = end_new_processes(before)
        cpu_s = cpu_seconds() - cpu
    finally:
        if loader is not None and hasattr(loader, "shutdown"):
            loader.shutdown()
        loader = None
        end_new_processes(before)
    return {
        "wall_s": wall_s,
        "cpu_s": cpu_s,
        "main_cpu_s": main_cpu_s,
        "batches": batches,
        "calls": len(calls_s),
        "state_dict_s": sum(calls_s),
        "state_dict_cpu_s": calls_cpu_s,
        "state_dict_median_us": statistics.median(calls_s) * 1e6 if calls_s else None,
        "state_dict_max_us": max(calls_s) * 1e6 if calls_s else None,
        "serialise_s": sum(serialise_s),
        "serialise_cpu_s": serialise_cpu_s,
        "state_bytes": statistics.median(sizes) if sizes else None,
        "state_bytes_max": max(sizes) if sizes else None,
        "tally": tally.summary(),
        "stray": stray,
    }


def versions() -> dict[str, str]:
    found = {"python": platform.python_version(), "numpy": np.__version__, "torch": torch.__version__}
    for name in ("conveyor", "torchdata"):
        module = sys.modules.get(name)
        if module is not None:
            found[name] = getattr(module, "__version__", "?")
    return found


def child(case: str, mode: str, n: int, warmup: int, batch_size: int) -> int:
    """A child run: a warm-up epoch, then the timed one, printed as one JSON line."""
    warnings.simplefilter("ignore")  # torchdata's deprecation warnings under this torch
    if CASES[case].peer:
        import torchdata.stateful_dataloader  # noqa: F401  (imported before the clock)
    else:
        import conveyor.torch_compat.dataloader  # noqa: F401
    warm = epoch(case, mode, warmup, batch_size)
    result = epoch(case, mode, n, batch_size)
    result["warmup"] = {"tally": warm["tally"], "stray": warm["stray"]}
    result["versions"] = versions()
    result["load"] = os.getloadavg()[0]  # the machine's, as the run ends
    print(json.dumps(result), flush=True)
    return 0


# --- the orchestrator --------------------------------------------------------------------


def interpreter(case: str) -> tuple[str | None, str]:
    """The Python that runs ``case``, or ``None`` and why it is unavailable (torchdata's:
    the venv bench_peers.py runs torchdata.nodes from)."""
    python, why = peers.interpreter(TORCHDATA_PEER if CASES[case].peer else "conveyor")
    return (str(python) if python is not None else None), why


def child_env(case: str) -> dict[str, str]:
    """This environment; torchdata's without this project's paths."""
    return peers.child_env(TORCHDATA_PEER if CASES[case].peer else "conveyor")


def run_once(case: str, mode: str, options: argparse.Namespace, expected: dict[int, float]) -> dict[str, Any] | str:
    """One checked run in a fresh process: its result, or what went wrong."""
    python, _ = interpreter(case)
    assert python is not None
    n, warm = options.items, options.warmup
    command = [python, str(Path(__file__).resolve()), "--one", case, mode, str(n), str(warm), str(options.batch_size)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=child_env(case))
    except subprocess.TimeoutExpired:
        return f"no result within {RUN_TIMEOUT_S:.0f} s"
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        sys.stderr.write(done.stderr[-3000:])
        tail = [line for line in done.stderr.splitlines() if line.strip()][-1:] or [""]
        return f"exit code {done.returncode}: {tail[0][:200]}"
    result = json.loads(lines[-1])
    problems = check_delivery(result["tally"], n, expected[n])
    problems += ["warm-up: " + p for p in check_delivery(result["warmup"]["tally"], warm, expected[warm])]
    for stage in (result, result["warmup"]):
        if stage["stray"]:
            problems.append(f"{stage['stray']} worker process(es) still running after the shutdown")
    if mode == "every" and result["calls"] != result["batches"]:
        problems.append(f"{result['calls']} state_dict() calls for {result['batches']} batches")
    return "; ".join(problems) if problems else result


def median(runs: Sequence[dict[str, Any]], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def summarise(row: dict[str, Any]) -> dict[str, Any] | None:
    """A row's figures from its runs (None unless both modes have runs)."""
    off, every = row["runs"]["off"], row["runs"]["every"]
    if not (off and every):
        return None
    wall_off, wall_every = median(off, "wall_s"), median(every, "wall_s")
    # each repeat's two runs, back to back: less exposed to the machine's slow phases
    off_by_repeat = {run["repeat"]: run["wall_s"] for run in off}
    paired = [
        (run["wall_s"] / off_by_repeat[run["repeat"]] - 1) * 100 for run in every if run["repeat"] in off_by_repeat
    ]
    cpu_off, cpu_every = median(off, "cpu_s"), median(every, "cpu_s")

    def per_call(run: dict[str, Any], *keys: str) -> float:
        return sum(run[k] for k in keys) / run["calls"] * 1e6

    return {
        "wall_off_s": wall_off,
        "wall_every_s": wall_every,
        "wall_overhead_pct": (wall_every / wall_off - 1) * 100,
        "wall_overhead_paired_pct": statistics.median(paired) if paired else None,
        "cpu_off_s": cpu_off,
        "cpu_every_s": cpu_every,
        "cpu_overhead_pct": (cpu_every / cpu_off - 1) * 100,
        "main_cpu_off_s": median(off, "main_cpu_s"),
        "main_cpu_every_s": median(every, "main_cpu_s"),
        "calls": every[0]["calls"],
        "state_dict_us": statistics.median(per_call(run, "state_dict_s") for run in every),
        "state_dict_median_us": median(every, "state_dict_median_us"),
        "state_dict_cpu_us": statistics.median(per_call(run, "state_dict_cpu_s") for run in every),
        "serialise_us": statistics.median(per_call(run, "serialise_s") for run in every),
        "serialise_cpu_us": statistics.median(per_call(run, "serialise_cpu_s") for run in every),
        "call_us": statistics.median(per_call(run, "state_dict_s", "serialise_s") for run in every),
        "call_cpu_us": statistics.median(per_call(run, "state_dict_cpu_s", "serialise_cpu_s") for run in every),
        "in_calls_pct": statistics.median(
            (run["state_dict_s"] + run["serialise_s"]) / run["wall_s"] * 100 for run in every
        ),
        "in_calls_cpu_pct": statistics.median(
            (run["state_dict_cpu_s"] + run["serialise_cpu_s"]) / run["cpu_s"] * 100 for run in every
        ),
        "state_bytes": median(every, "state_bytes"),
        "state_bytes_max": max(run["state_bytes_max"] for run in every),
    }


def git_commit() -> dict[str, Any]:
    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(HERE), *args], capture_output=True, text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 else ""

    return {"commit": git("rev-parse", "HEAD") or None, "dirty": bool(git("status", "--porcelain", "--", "src"))}


def machine() -> dict[str, Any]:
    model = ""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            model = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "")
    except OSError:
        pass
    return {
        "system": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "cpu": model,
        "cpus_usable": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "start_method": multiprocessing.get_start_method(),
    }


def choose_item_cost(options: argparse.Namespace) -> dict[str, Any]:
    """Size the op for ``--item-us`` here (or take ``--compute-size``); every child gets
    the size through the environment, which they inherit."""
    if options.compute_size:
        os.environ[SIZE_VARIABLE] = str(options.compute_size)
        return {"compute_size": options.compute_size, "op_us": None}
    size, seconds = size_children_for(options.item_us)
    return {"compute_size": size, "op_us": seconds * 1e6}


def run(options: argparse.Namespace) -> dict[str, Any]:
    """Every case's runs, alternating; the whole result."""
    started = time.perf_counter()
    load_start = os.getloadavg()[0]
    item_cost = choose_item_cost(options)
    size = item_cost["compute_size"]
    print(f"item op: {size:,} samples (--item-us {options.item_us:g})", file=sys.stderr, flush=True)
    expected = {k: expected_checksum("compute", k, size) for k in {options.items, options.warmup}}
    rows = []
    for key in options.loaders:
        why = interpreter(key)[1]
        rows.append(
            {
                "case": key,
                "label": CASES[key].label,
                "serialiser": CASES[key].serialiser,
                "unavailable": why or None,
                "versions": None,
                "runs": {mode: [] for mode in MODES},
                "failures": [],
            }
        )
    for repeat in range(options.repeats):
        modes = MODES if repeat % 2 == 0 else MODES[::-1]
        for row in rows:
            if row["unavailable"]:
                continue
            for mode in modes:
                outcome = run_once(row["case"], mode, options, expected)
                if isinstance(outcome, str):
                    row["failures"].append(f"{mode} run {repeat + 1}: {outcome}")
                    progress = f"FAILED: {outcome[:300]}"
                else:
                    row["versions"] = outcome.pop("versions")
                    row["runs"][mode].append({"repeat": repeat + 1, **outcome})
                    progress = f"{outcome['wall_s']:.2f} s"
                print(f"  run {repeat + 1}/{options.repeats}: {row['case']} {mode}: {progress}", file=sys.stderr)
    for row in rows:
        row["summary"] = summarise(row)
    from conveyor import __version__ as conveyor_version

    return {
        "benchmark": "bench_snapshot",
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "git": git_commit(),
        "machine": machine(),
        "versions": {"conveyor": conveyor_version, "torch": torch.__version__, "numpy": np.__version__},
        "command": options.command,
        "settings": {
            "items": options.items,
            "warmup_items": options.warmup,
            "batch_size": options.batch_size,
            "workers": WORKERS,
            "repeats": options.repeats,
            "item_us": options.item_us,
            **item_cost,
            "load_start": load_start,
            "load_end": os.getloadavg()[0],
            "seconds": time.perf_counter() - started,
        },
        "target_pct": TARGET_PCT,
        "rows": rows,
    }


# --- the table -----------------------------------------------------------------------------

HEADER = (
    "loader",
    "serialised by",
    "epoch s, no snapshots",
    "epoch s, snapshot every batch",
    "overhead, wall: medians (paired)",
    "overhead, CPU (all processes)",
    "in calls: % of epoch wall (% of its CPU)",
    "µs per state_dict: wall (CPU)",
    "µs per serialisation: wall (CPU)",
    "state bytes",
    "runs ok",
)


def signed_pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}%"


def table(result: dict[str, Any]) -> str:
    """The Markdown table of a result, then its failures."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    notes = []
    for row in result["rows"]:
        cells = [row["label"], f"`{row['serialiser']}`"]
        s = row["summary"]
        if row["unavailable"]:
            cells += [f"unavailable: {row['unavailable']}", *[""] * (len(HEADER) - 3)]
        elif s is None:
            cells += ["failed", *[""] * (len(HEADER) - 3)]
        else:
            cells += [
                f"{s['wall_off_s']:.3f}",
                f"{s['wall_every_s']:.3f}",
                f"{s['wall_overhead_pct']:+.1f}% ({signed_pct(s['wall_overhead_paired_pct'])})",
                f"{s['cpu_overhead_pct']:+.1f}%",
                f"{s['in_calls_pct']:.1f}% ({s['in_calls_cpu_pct']:.1f}%)",
                f"{s['state_dict_us']:,.0f} ({s['state_dict_cpu_us']:,.0f})",
                f"{s['serialise_us']:,.0f} ({s['serialise_cpu_us']:,.0f})",
                f"{s['state_bytes']:,.0f}",
            ]
        if not row["unavailable"]:
            ok = sum(len(runs) for runs in row["runs"].values())
            cells.append(f"{ok}/{ok + len(row['failures'])}")
        lines.append("| " + " | ".join(cells) + " |")
        notes += [f"- {row['case']}: {failure}" for failure in row["failures"]]
    return "\n".join(lines + (["", "failed runs:", *notes] if notes else []))


def describe(result: dict[str, Any]) -> str:
    """The lines around the table: what ran, where, and the issue's target per conveyor row."""
    m, v, s, g = result["machine"], result["versions"], result["settings"], result["git"]
    torchdata = next((r["versions"]["torchdata"] for r in result["rows"] if "torchdata" in (r["versions"] or {})), None)
    loads = [run["load"] for row in result["rows"] for runs in row["runs"].values() for run in runs]
    commit = (g["commit"] or "?")[:10] + (" (src modified)" if g["dirty"] else "")
    op = f", {s['op_us']:,.1f} µs per call" if s.get("op_us") else ""
    lines = [
        f"{result['date']}, conveyor {v['conveyor']} at {commit}, torch {v['torch']}, numpy {v['numpy']}"
        + (f", torchdata {torchdata}" if torchdata else "")
        + f"; {m['system']} {m['machine']}, {m['cpus_usable']} CPUs usable ({m['cpu']}), Python {m['python']}, "
        f"start method {m['start_method']}.",
        f"Command: `{result['command']}`: {s['items']:,} items per epoch in batches of {s['batch_size']}, "
        f"{s['workers']} workers, median of {s['repeats']} fresh-process runs per loader and mode; item op "
        f"{s['compute_size']:,} samples{op}; load {s['load_start']:.2f} at the start, {s['load_end']:.2f} at the "
        f"end, {min(loads, default=0):.2f}-{max(loads, default=0):.2f} as the runs ended; {s['seconds']:.0f} s.",
    ]
    for row in result["rows"]:
        summary = row["summary"]
        if row["case"].startswith("conveyor") and summary:
            worst = max(summary["wall_overhead_paired_pct"] or 0.0, summary["in_calls_cpu_pct"])
            held = "held" if worst <= result["target_pct"] else "missed"
            lines.append(
                f"target (≤ {result['target_pct']:g}% of the epoch): {row['label']}: "
                f"wall {signed_pct(summary['wall_overhead_paired_pct'])} (paired), CPU in calls "
                f"{summary['in_calls_cpu_pct']:.1f}% of the epoch's: {held}"
            )
    return "\n".join(lines)


def report(result: dict[str, Any]) -> str:
    return describe(result) + "\n\n" + table(result)


# --- the profile ---------------------------------------------------------------------------


def profile(case: str, n: int, batch_size: int, top: int) -> int:
    """One epoch of ``case`` in this process, a state_dict() and its serialisation after
    every batch, with cProfile on around those calls only; prints where they spend their
    time (the profiler inflates the cost of each Python call: compare shares, not totals)."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    serialise = serialiser(case)
    loader = make_loader(case, n, batch_size)
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
    print(f"{CASES[case].label}: {calls} calls of state_dict() and {CASES[case].serialiser}, under cProfile")
    pstats.Stats(profiler, stream=sys.stdout).sort_stats("cumulative").print_stats(top)
    return 0


# --- the command line ----------------------------------------------------------------------


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=" ".join((__doc__ or "").split("\n\n", 1)[0].split()))
    parser.add_argument("--items", type=int, default=24_000, help="items per epoch (24,000)")
    parser.add_argument("--batch-size", type=int, default=16, help="(16)")
    parser.add_argument("--repeats", type=int, default=5, help="fresh-process runs per loader and mode (5)")
    parser.add_argument("--item-us", type=float, default=200.0, help="size the item op for this many µs of CPU (200)")
    parser.add_argument(
        "--compute-size", type=int, default=0, help=f"the op's samples, instead of sizing it: one of {COMPUTE_SIZES}"
    )
    parser.add_argument("--loaders", default=",".join(CASES), help=f"comma-separated, of {','.join(CASES)}")
    parser.add_argument(
        "--profile", metavar="CASE", help="profile CASE's state_dict() calls in this process instead (cProfile)"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"where the JSON goes ({DEFAULT_OUT.name})")
    options = parser.parse_args(argv)
    chosen = [key for key in options.loaders.split(",") if key]
    unknown = [key for key in chosen if key not in CASES]
    if unknown or not chosen:
        parser.error(f"--loaders: unknown or none: {','.join(unknown)!r}; choose from {','.join(CASES)}")
    options.loaders = [key for key in CASES if key in chosen]
    if options.profile is not None and options.profile not in CASES:
        parser.error(f"--profile: unknown case {options.profile!r}; choose from {','.join(CASES)}")
    for name, low in (("items", 2 * WORKERS), ("batch_size", 1), ("repeats", 1)):
        if getattr(options, name) < low:
            parser.error(f"--{name.replace('_', '-')} must be >= {low}, got {getattr(options, name)}")
    if options.compute_size and options.compute_size not in COMPUTE_SIZES:
        parser.error(f"--compute-size must be one of {COMPUTE_SIZES}, got {options.compute_size}")
    if not options.item_us > 0:
        parser.error(f"--item-us must be > 0, got {options.item_us}")
    options.warmup = min(options.items, max(4 * WORKERS * options.batch_size, options.items // 50))
    options.command = " ".join(["python benchmarks/bench_snapshot.py", *argv])
    return options


def main(argv: Sequence[str] | None = None) -> int:
    """Run and write the JSON (or, with ``--table``, print a saved one's table); the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--one"]:  # a child: one run, one JSON line (an exception fails it)
        case, mode, n, warmup, batch_size = args[1], args[2], int(args[3]), int(args[4]), int(args[5])
        return child(case, mode, n, warmup, batch_size)
    if args[:1] == ["--table"]:
        path = Path(args[1]) if len(args) > 1 else DEFAULT_OUT
        print(report(json.loads(path.read_text())))
        return 0
    options = parse(args)
    if options.profile:
        return profile(options.profile, options.items, options.batch_size, top=30)
    result = run(options)
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps(result, indent=1) + "\n")
    print(report(result))
    print(f"\nwritten: {options.out}")
    failed = any(row["failures"] for row in result["rows"])
    print("verification FAILED: see the failed runs above" if failed else "verification passed for every run")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
