"""One run: one loader, one workload, in a fresh process the orchestrator starts with that
loader's interpreter (a peer's venv, or its own).

    <python> benchmarks/harness/child.py SUITE_FILE --workload W --loader L --items N
        --warmup-items M [--settings JSON] [--drop-one]

It imports the suite's file, the standard library, numpy and the one loader it runs. It
reads a small warm-up epoch with a loader of its own (first-call costs: lazy imports,
caches), then the timed epoch, from the loader's creation to the end of its shutdown
(its worker processes joined), and prints one JSON line: wall time, time to the first
item, its own CPU (with its reaped children's) when the timed loader was created, what
each epoch delivered (a :class:`harness.tally.Tally` summary, checked by the
orchestrator), any figures of the suite's own, and the versions it ran. It then leaves
with ``os._exit``, so that interpreter teardown is not counted in the CPU the
orchestrator measures. Any worker process still running after the shutdown is ended and
counted as ``stray``.

Standard library only, besides what the suite imports.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.metadata
import importlib.util
import json
import multiprocessing
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parents[1]
if str(BENCHMARKS) not in sys.path:  # the harness and the suites' shared code live there
    sys.path.insert(0, str(BENCHMARKS))

from harness.declare import Context, RunError, Suite  # noqa: E402  (after the path it needs)
from harness.processes import cpu_seconds, end_new_processes  # noqa: E402


def load_suite(path: str) -> Suite:
    """The ``SUITE`` of the file at ``path``, imported as a module named after the file
    (registered in ``sys.modules``: pickled functions and spawned workers find it there)."""
    name = Path(path).stem
    if name in sys.modules:
        return sys.modules[name].SUITE
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise RunError(f"cannot import a suite from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module.SUITE


def own_rss_bytes() -> int:
    """This process's resident memory (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/status") as status:
            return next((int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:")), 0)
    except OSError:
        return 0


def loader_epoch(context: Context, drop_one: bool) -> dict[str, Any]:
    """One epoch from a new loader (``Loader.open``), timed from its creation to the end of
    its shutdown. ``drop_one`` leaves the first item out of the tally (tests only)."""
    assert context.loader.open is not None
    tally = context.workload.tally(context)
    see = tally.see
    gc.collect()  # the previous epoch's garbage is not this one's work
    before = set(multiprocessing.active_children())
    close = extra = None
    first_s: float | None = None
    rss = own_rss_bytes()
    cpu_before = cpu_seconds()
    start = time.perf_counter()
    try:
        opened = context.loader.open(context)
        close, extra = opened.close, opened.extra
        iterator = iter(opened.items)
        for item in iterator:
            first_s = time.perf_counter() - start
            if not drop_one:
                see(item)
            break
        for item in iterator:
            see(item)
        item = iterator = opened = None
        shut, close = close, None
        shut()
        stray = end_new_processes(before)
        wall_s = time.perf_counter() - start
    finally:
        if close is not None:  # an error before the shutdown: still end the workers
            close()
        end_new_processes(before)
    figures = dict(extra()) if extra is not None else {}
    return {
        "wall_s": wall_s,
        "first_s": first_s,
        "cpu_before_s": cpu_before,
        "cpu_s": None,
        "rss_before_bytes": rss,
        "stray": stray,
        "tally": tally.summary(),
        "extra": figures,
    }


def own_epoch(context: Context, drop_one: bool) -> dict[str, Any]:
    """One epoch of a loader that runs its own (``Loader.epoch``: a bound with no loader)."""
    assert context.loader.epoch is not None
    gc.collect()
    rss = own_rss_bytes()
    cpu_before = cpu_seconds()
    done = context.loader.epoch(context)
    tally = done.tally
    if drop_one:
        first = next((i for i, c in enumerate(tally.counts) if c), None)
        if first is not None:
            tally.counts[first] -= 1
            tally.count -= 1
    return {
        "wall_s": done.wall_s,
        "first_s": done.first_s,
        "cpu_before_s": cpu_before,
        "cpu_s": done.cpu_s,
        "rss_before_bytes": rss,
        "stray": 0,
        "tally": tally.summary(),
        "extra": dict(done.extra),
    }


def versions(packages: tuple[str, ...]) -> dict[str, str]:
    """The versions this run used: Python, numpy when imported, and the loader's packages
    (imported here, before any clock starts)."""
    found = {"python": platform.python_version()}
    for name in ("numpy", *packages):
        module = importlib.import_module(name)
        version = getattr(module, "__version__", None)
        if version is None:
            try:
                version = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                version = "?"
        found[name] = str(version)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="One run of a benchmark suite (started by its orchestrator).")
    parser.add_argument("suite")
    parser.add_argument("--workload", required=True)
    parser.add_argument("--loader", required=True)
    parser.add_argument("--items", type=int, required=True)
    parser.add_argument("--warmup-items", type=int, required=True)
    parser.add_argument("--settings", default="{}", help="the suite's settings for every run, as JSON")
    parser.add_argument("--drop-one", action="store_true", help="tests only: leave one item out of the tally")
    options = parser.parse_args(argv)
    suite = load_suite(options.suite)
    workload, loader = suite.workload(options.workload), suite.loader(options.loader)
    if not loader.runs(workload.key):
        raise RunError(f"{loader.key} does not run the {workload.key} workload")
    settings = {**workload.settings, **json.loads(options.settings)}
    found = versions(loader.packages)
    epoch = own_epoch if loader.epoch is not None else loader_epoch
    warm = Context(workload, loader, options.warmup_items, settings, warmup=True)
    warmup = epoch(warm, False)
    timed = epoch(Context(workload, loader, options.items, settings, warmup=False), options.drop_one)
    timed.update(loader=loader.key, workload=workload.key, items=options.items, versions=found)
    timed["warmup"] = {"items": options.warmup_items, "tally": warmup["tally"], "stray": warmup["stray"]}
    print(json.dumps(timed), flush=True)
    return 0


if __name__ == "__main__":
    try:
        code = main()
    except RunError as error:
        print(f"run: {error}", file=sys.stderr, flush=True)
        code = 1
    except Exception:  # any failure of the loader: the orchestrator reports the run failed
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown in the CPU the orchestrator measures
