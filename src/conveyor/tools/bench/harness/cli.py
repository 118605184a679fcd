"""The command line every suite of ``benchmarks/`` shares: which workloads and loaders, how
many runs, where the result goes; then the run, its tables (``tables``), its notes, and an
exit code that says whether every run delivered what it had to. (``conveyor bench`` has a
command line of its own, on the same harness.)

    python benchmarks/bench_<suite>.py [--workloads A,B] [--loaders X,Y] [--repeats R]
        [--quick] [--items N] [--save | --out PATH] [--require-peers] [the suite's own options]

``--save`` writes the result to ``benchmarks/results/<suite>/<date>-<commit>.json``,
where the README's tables come from (``python -m conveyor.tools.bench.harness.tables --readme``);
``--quick`` runs (and ``--items`` runs, sized by hand) are not saved there. Exit codes: 0, every run passed
its checks; 1, a run failed; 2, bad arguments or (with ``--require-peers``) a peer's venv
missing.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from conveyor.tools.bench.harness.declare import Suite
from conveyor.tools.bench.harness.orchestrate import build_result, interpreter, run_suite, venvs_of
from conveyor.tools.bench.harness.results import machine
from conveyor.tools.bench.harness.tables import render


def _choose(parser: argparse.ArgumentParser, name: str, text: str, known: Sequence[str]) -> list[str]:
    chosen = [key for key in text.split(",") if key]
    unknown = [key for key in chosen if key not in known]
    if unknown or not chosen:
        parser.error(f"--{name}: unknown or none: {','.join(unknown)!r}; choose from {','.join(known)}")
    return [key for key in known if key in chosen]  # the declared order


def parser_for(suite: Suite, description: str) -> argparse.ArgumentParser:
    workloads = [w.key for w in suite.workloads]
    default = suite.default_workloads or workloads
    loaders = [loader.key for loader in suite.loaders]
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--workloads", default=",".join(default), help=f"comma-separated, of {','.join(workloads)}")
    parser.add_argument("--loaders", default=",".join(loaders), help=f"comma-separated, of {','.join(loaders)}")
    parser.add_argument(
        "--repeats", type=int, help=f"fresh-process runs per loader and workload ({suite.repeats}; --quick: 1)"
    )
    parser.add_argument("--quick", action="store_true", help="a smoke test: few items per workload")
    parser.add_argument("--items", type=int, help="items per epoch of every workload, instead of its own")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--save", action="store_true", help=f"write the result under benchmarks/results/{suite.name}/")
    where.add_argument("--out", type=Path, help="write the result to this file")
    parser.add_argument("--require-peers", action="store_true", help="exit 2 if a peer's venv is missing")
    # tests only: that loader's runs leave one item out of their tally, which must fail the run
    parser.add_argument("--drop-one", default="", help=argparse.SUPPRESS)
    if suite.arguments is not None:
        suite.arguments(parser)
    return parser


def main(suite: Suite, argv: Sequence[str] | None, description: str) -> int:
    """Run ``suite`` as ``argv`` asks; the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    parser = parser_for(suite, description)
    options = parser.parse_args(args)
    options.workloads = _choose(parser, "workloads", options.workloads, [w.key for w in suite.workloads])
    options.loaders = _choose(parser, "loaders", options.loaders, [loader.key for loader in suite.loaders])
    if options.repeats is None:
        options.repeats = 1 if options.quick else suite.repeats
    if options.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {options.repeats}")
    if options.items is not None and options.items < 1:
        parser.error(f"--items must be >= 1, got {options.items}")
    if options.save and (options.quick or options.items):
        parser.error("--quick and --items runs are not saved with the results (use --out)")
    loaders = [suite.loader(key) for key in options.loaders]
    venvs = venvs_of(suite)
    missing = [loader.key for loader in loaders if loader.venv is not None and interpreter(loader, venvs)[0] is None]
    if missing and options.require_peers:
        print(f"{suite.name}: no venv for {', '.join(missing)}: run benchmarks/peer_envs.sh", file=sys.stderr)
        return 2
    settings = {"repeats": options.repeats, "quick": options.quick, "items": options.items}
    settings.update(suite.settings(options) if suite.settings is not None else {})
    m = machine()
    print(f"machine: {m['system']} {m['arch']}, {m['cpus']} CPUs usable ({m['cpu']}), Python {m['python']}")
    print(
        f"settings: workloads={','.join(options.workloads)} loaders={','.join(options.loaders)} "
        f"repeats={options.repeats}{' quick' if options.quick else ''}; load {os.getloadavg()[0]:.2f} at the start",
        flush=True,
    )
    started, load = time.perf_counter(), [round(os.getloadavg()[0], 2)]
    workloads = [suite.workload(key) for key in options.workloads]
    with suite.prepare(options, settings) as prepared:
        run_settings = {**settings, **prepared}
        rows = run_suite(
            suite, workloads, loaders, options.repeats, options.quick, run_settings, options.drop_one, options.items
        )
    load.append(round(os.getloadavg()[0], 2))
    command = shlex.join(["python", f"benchmarks/{Path(suite.path).name}", *args])
    versions = orchestrator_versions()
    result = build_result(suite, rows, command, settings, versions, load, time.perf_counter() - started)
    print("\n" + render(result))
    failures = [f"failed: {e.workload}, {e.loader} {failure}" for e in result.entries for failure in e.failures]
    if failures:
        print("\n" + "\n".join(failures))
    root = Path(suite.path).resolve().parent / "results"  # benchmarks/results, beside the suites
    path = options.out or (result.default_path(root) if options.save else None)
    if path is not None:
        print(f"\nwritten: {result.save(path)}")
    print(f"{time.perf_counter() - started:.0f} s")
    print(
        "verification FAILED: see the failed runs above"
        if failures
        else "verification passed: every run delivered every item as it should"
    )
    return 1 if failures else 0


def orchestrator_versions() -> dict[str, str]:
    """Python's, numpy's and conveyor's, as the orchestrator finds them."""
    found = {"python": platform.python_version()}
    for name in ("numpy", "conveyor"):
        try:
            module = __import__(name)
        except ImportError:
            continue  # not installed here: the entries carry their runs' versions
        found[name] = str(getattr(module, "__version__", "?"))
    return found
