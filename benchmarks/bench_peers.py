"""conveyor against its peers, each with 2 worker processes, on issue 18's three workloads:
torch's ``DataLoader``, Grain (``MapDataset ... mp_prefetch``), torchdata.nodes
(``ParallelMapper(method="process")`` in a ``Loader``), and, for ``compute``, the bound
of two bare forked processes doing the work with no per-item messages.

    bash benchmarks/peer_envs.sh     # once: Grain's and torchdata.nodes' venvs
    python benchmarks/bench_peers.py [--workloads small,arrays,compute]
        [--loaders conveyor,torch,grain,nodes,bare] [--repeats 3] [--quick] [--require-peers]
        [--compute-us 200]

Workloads (``peers_work``; items unbatched, made in the workers):

- ``small``: 200,000 ints, ``f(i) = i + 1``;
- ``arrays``: 2,000 new 1 MiB int64 arrays (``np.full(131072, i)``);
- ``compute``: 20,000 items of a fixed numpy op (FFT filtering of a signal sized here
  for ~200 µs of CPU, the issue's item: ``--compute-us``; its cost is measured and
  printed), each giving ``(i, float)``.

How each loader is built is in ``peers_runner``'s docstring (torch: a map-style
``Dataset``, ``batch_size=None``). conveyor, torch and the bare bound run under this
script's interpreter (conveyor with its defaults, statistics on); Grain and
torchdata.nodes under the venvs ``peer_envs.sh`` makes in ``benchmarks/.venvs``, which
hold numpy at the same version. A peer whose venv is missing is a row saying so (exit 2
instead with ``--require-peers``).

Each run is a fresh child process (``<its interpreter> peers_runner.py --loader X
--workload Y``): a small warm-up epoch, then the timed one, from the loader's creation to
the end of its shutdown. Runs alternate between the loaders (one of each, then again);
the tables give medians over ``--repeats`` runs, with the spread (min-max) of the bare
bound's and conveyor's items/s and CPU. CPU is that of the child and every process it
started over the timed span, and memory the peak of their summed PSS sampled every
20 ms (``peers_measure``'s docstring says how). Every epoch (the warm-up too) is
checked here: each id delivered exactly once, no malformed item, the checksum of the
values; and no process may outlive its loader's shutdown. Any failure makes the exit
code 1, after the tables.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from peers_measure import measure_child
from peers_report import Row, Run, bare_lines, table, target_lines
from peers_work import COMPUTE_SIZE, WORKLOADS, check_delivery, expected_checksum, size_children_for

HERE = Path(__file__).resolve().parent
RUNNER = HERE / "peers_runner.py"
VENVS = HERE / ".venvs"
LOADERS = ("bare", "conveyor", "torch", "grain", "nodes")  # the order of the runs in each round
PEERS = {"grain": "grain", "nodes": "nodes"}  # loader -> its venv under benchmarks/.venvs
#: Seconds one run may take before its processes are killed and it counts as failed.
RUN_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Workload:
    key: str
    items: int
    quick_items: int
    describe: str

    def count(self, quick: bool) -> int:
        return self.quick_items if quick else self.items

    def warmup(self, quick: bool) -> int:
        return max(8, self.count(quick) // 50)


WORKLOAD_INFO = {
    w.key: w
    for w in (
        Workload("small", 200_000, 4_000, "ints, f(i) = i + 1"),
        Workload("arrays", 2_000, 40, "new 1 MiB int64 arrays, np.full(131072, i), made in the worker"),
        Workload("compute", 20_000, 400, "(i, x): x from numpy work sized for ~200 µs per item, in the worker"),
    )
}
LABELS = {
    "bare": "bare bound: 2 forked processes",
    "conveyor": "conveyor DataLoader2",
    "torch": "torch DataLoader",
    "grain": "Grain mp_prefetch",
    "nodes": "torchdata.nodes ParallelMapper",
}


def interpreter(loader: str) -> tuple[Path | None, str]:
    """The Python that runs ``loader``, or ``None`` and why it is unavailable."""
    if loader in PEERS:  # peer_envs.sh writes the stamp last, once the venv is complete
        venv = VENVS / PEERS[loader]
        complete = (venv / ".peer-requirements").exists()
        return (venv / "bin" / "python", "") if complete else (None, "run benchmarks/peer_envs.sh")
    if loader == "torch" and importlib.util.find_spec("torch") is None:
        return None, f"torch is not installed for {sys.executable}"
    return Path(sys.executable), ""


def child_env(loader: str) -> dict[str, str]:
    """The child's environment: this one's; a peer's without this project's paths."""
    env = dict(os.environ)
    if loader in PEERS:
        env.pop("PYTHONPATH", None)
        env.pop("PYTHONHOME", None)
    return env


def run_once(
    loader: str, python: Path, workload: Workload, quick: bool, expected: dict[int, Any], drop_one: bool = False
) -> tuple[Run, dict[str, str]] | str:
    """One measured, checked run: its numbers and the versions it ran, or what was wrong."""
    n, warm = workload.count(quick), workload.warmup(quick)
    command = [str(python), str(RUNNER), "--loader", loader, "--workload", workload.key]
    command += ["--items", str(n), "--warmup-items", str(warm)] + (["--drop-one"] if drop_one else [])
    measured = measure_child(command, child_env(loader), RUN_TIMEOUT_S)
    lines = measured.stdout.strip().splitlines()
    if measured.exit_code != 0 or not lines:
        sys.stderr.write(measured.stderr_tail)
        last = [line for line in measured.stderr_tail.splitlines() if line.strip()][-1:] or [""]
        return "; ".join([*measured.problems, f"exit code {measured.exit_code}: {last[0][:200]}"])
    result = json.loads(lines[-1])
    problems = list(measured.problems)
    problems += check_delivery(result["tally"], n, expected[n])
    problems += ["warm-up: " + p for p in check_delivery(result["warmup"]["tally"], warm, expected[warm])]
    for stage in (result, result["warmup"]):
        if stage["stray"]:
            problems.append(f"{stage['stray']} worker process(es) still running after the loader's shutdown")
    if problems:
        return "; ".join(problems)
    cpu_s = measured.cpu_s - result["cpu_before_s"]
    run = Run(result["wall_s"], result["first_s"], cpu_s, measured.peak_pss_bytes, measured.samples)
    return run, result["versions"]


def expectations(workload: Workload, quick: bool, compute_size: int) -> dict[int, Any]:
    """The checksums of the timed and warm-up epochs. ``compute``'s computes every item
    here, which measures the op's cost: printed."""
    n, warm = workload.count(quick), workload.warmup(quick)
    started = time.process_time()
    found = {n: expected_checksum(workload.key, n, compute_size)}
    if workload.key == "compute":
        op_us = (time.process_time() - started) / n * 1e6
        print(
            f"compute op: {op_us:,.1f} µs of CPU per item ({compute_size:,} samples), measured over {n:,} items "
            f"in this process (numpy {np.__version__})"
        )
    found[warm] = expected_checksum(workload.key, warm, compute_size)
    return found


def run_workload(workload: Workload, options: argparse.Namespace, versions: dict[str, dict[str, str]]) -> list[Row]:
    """Every loader's runs on ``workload``, alternating; records the versions they ran."""
    repeats, quick = options.repeats, options.quick
    rows = [Row(loader, LABELS[loader], workload.count(quick)) for loader in options.loaders]
    if workload.key != "compute":
        rows = [row for row in rows if row.loader != "bare"]  # the bound is compute's only
    expected = expectations(workload, quick, options.compute_size)
    pythons = {}
    for row in rows:
        pythons[row.loader], why = interpreter(row.loader)
        if pythons[row.loader] is None:
            row.unavailable = why
    for repeat in range(repeats):
        for row in rows:
            python = pythons[row.loader]
            if python is None:
                continue
            outcome = run_once(row.loader, python, workload, quick, expected, row.loader == options.drop_one)
            if isinstance(outcome, tuple):
                run, versions[row.loader] = outcome
                row.runs.append(run)
                progress = f"{run.wall_s:.2f} s, {run.samples} memory samples"
            else:
                row.failures.append(f"run {repeat + 1}: {outcome}")
                progress = f"FAILED: {outcome[:300]}"
            print(f"  {workload.key} run {repeat + 1}/{repeats}: {row.loader} {progress}", file=sys.stderr, flush=True)
    return rows


def machine_line() -> str:
    return (
        f"machine: {platform.system()} {platform.release()} {platform.machine()}, "
        f"{len(os.sched_getaffinity(0))} CPUs usable, Python {platform.python_version()}; "
        f"date {datetime.date.today().isoformat()}"
    )


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=" ".join((__doc__ or "").split("\n\n", 1)[0].split()))
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, of {','.join(WORKLOADS)}")
    parser.add_argument("--loaders", default=",".join(LOADERS), help=f"comma-separated, of {','.join(LOADERS)}")
    parser.add_argument("--repeats", type=int, help="fresh-process runs per loader and workload (3; --quick: 1)")
    parser.add_argument("--quick", action="store_true", help="a smoke test: few items per workload")
    parser.add_argument("--require-peers", action="store_true", help="exit 2 if a peer's venv is missing")
    parser.add_argument(
        "--compute-us",
        type=float,
        default=200.0,
        help="size compute's op for this many µs of CPU per item here (issue 18's ~200); 0: keep "
        "PEERS_COMPUTE_SIZE, or 6,144 samples",
    )
    # tests only: that loader's runs leave one item out of their tally, which must fail the run
    parser.add_argument("--drop-one", default="", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    for name, known in (("workloads", WORKLOADS), ("loaders", LOADERS)):
        chosen = [key for key in getattr(options, name).split(",") if key]
        unknown = [key for key in chosen if key not in known]
        if unknown or not chosen:
            parser.error(f"--{name}: unknown or none: {','.join(unknown)!r}; choose from {','.join(known)}")
        setattr(options, name, [key for key in known if key in chosen])  # the rounds' order
    options.repeats = options.repeats or (1 if options.quick else 3)
    if options.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {options.repeats}")
    if options.compute_us < 0:
        parser.error(f"--compute-us must be >= 0, got {options.compute_us}")
    return options


def choose_compute_size(options: argparse.Namespace) -> None:
    """Size compute's signal for ``--compute-us`` here; every child gets the size through
    ``PEERS_COMPUTE_SIZE`` (in this process's environment, which they inherit)."""
    options.compute_size = COMPUTE_SIZE
    if "compute" not in options.workloads or not options.compute_us:
        return
    options.compute_size, seconds = size_children_for(options.compute_us)
    print(
        f"compute op sized for ~{options.compute_us:,.0f} µs: {options.compute_size:,} samples, "
        f"{seconds * 1e6:,.1f} µs per call measured here"
    )


def main(argv: list[str] | None = None) -> int:
    options = parse(argv)
    missing = [loader for loader in options.loaders if loader in PEERS and interpreter(loader)[0] is None]
    if missing and options.require_peers:
        print(
            f"bench_peers: no venv for {', '.join(missing)} under {VENVS}: run benchmarks/peer_envs.sh", file=sys.stderr
        )
        return 2
    print(machine_line())
    print(
        f"settings: workloads={','.join(options.workloads)} loaders={','.join(options.loaders)} workers=2 "
        f"repeats={options.repeats}{' quick' if options.quick else ''}; load {os.getloadavg()[0]:.2f} at the start",
        flush=True,
    )
    choose_compute_size(options)
    started = time.perf_counter()
    sections: dict[str, list[Row]] = {}
    versions: dict[str, dict[str, str]] = {}
    for key in options.workloads:
        sections[key] = run_workload(WORKLOAD_INFO[key], options, versions)
    for key, rows in sections.items():
        workload = WORKLOAD_INFO[key]
        print(f"\n{key}: {workload.count(options.quick):,} {workload.describe}")
        print(table(rows))
        if key == "compute":
            print("\n".join(bare_lines(rows)))
        for row in rows:
            for failure in row.failures:
                print(f"failed: {row.loader} {failure}")
    print(
        "\nversions: "
        + "; ".join(f"{k}: " + ", ".join(f"{p} {v}" for p, v in vs.items()) for k, vs in versions.items())
    )
    print("\n".join(["targets (issue 18; reported, not asserted):", *target_lines(sections)]))
    print(f"load {os.getloadavg()[0]:.2f} at the end; {time.perf_counter() - started:.0f} s")
    failed = any(row.failures for rows in sections.values() for row in rows)
    print(
        "verification FAILED: see the failed runs above"
        if failed
        else "verification passed: every run delivered every item exactly once"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
