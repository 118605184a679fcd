"""``conveyor bench`` as a front end on the harness: its suite (:mod:`conveyor.tools.bench.suite`)
run for each ``num_workers`` asked, every run a fresh process measured from outside and
checked, then its report (:mod:`conveyor.tools.bench.report`), its results saved as JSON
when asked, and the plot.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from conveyor.tools.bench.demo_data import default_demo_root, demo_size, demo_warmup, prepare_demo
from conveyor.tools.bench.errors import BenchError
from conveyor.tools.bench.harness.declare import Workload
from conveyor.tools.bench.harness.orchestrate import build_result, run_suite
from conveyor.tools.bench.harness.results import Result, checkout_of
from conveyor.tools.bench.options import Settings
from conveyor.tools.bench.per_item import cpu_value
from conveyor.tools.bench.report import CHECKED, RATIO_NOTE, failed_required, format_report, machine_line
from conveyor.tools.bench.suite import SUITE


def _cpu_cost_line() -> str:
    """What the cpu workload's function costs here, so its items/s can be read against it."""
    times = []
    for i in range(5):
        start = time.perf_counter()
        cpu_value(i)
        times.append(time.perf_counter() - start)
    return f"cpu workload: its function takes {statistics.median(times) * 1e3:.2f} ms per item here (median of 5 calls)"


def sized(workload: Workload, settings: Settings) -> Workload:
    """``workload`` with the items these settings ask for (the demo: its dataset's count)."""
    items = settings.items_for(workload.items, workload.quick_items)
    if workload.key == "demo":
        items = demo_size(items)
    return dataclasses.replace(workload, items=items, quick_items=items)


def _versions() -> dict[str, str]:
    """The orchestrator's versions (each entry has its runs' own)."""
    import platform

    import numpy

    from conveyor import __version__

    return {"python": platform.python_version(), "numpy": numpy.__version__, "conveyor": __version__}


def _paths(settings: Settings, results: dict[int, Result]) -> dict[int, Path]:
    """Where each result goes: ``--out`` (other worker counts beside it), or under the checkout's results."""
    if settings.out is not None:
        out = settings.out
        return {
            c: out if c == settings.workers else out.with_name(f"{out.stem}-{c}-workers{out.suffix}") for c in results
        }
    checkout = checkout_of(Path(SUITE.path))
    if checkout is None:
        raise BenchError("--save writes under benchmarks/results/ of a conveyor checkout: use --out PATH here")
    root = checkout / "benchmarks" / "results"
    return {c: result.default_path(root) for c, result in results.items()}


def _run(settings: Settings, out: TextIO, err: TextIO) -> dict[int, Result]:
    """Every run, for each worker count; the results by worker count."""
    workloads = [sized(SUITE.workload(key), settings) for key in settings.workloads]
    loaders = [SUITE.loader(key) for key in settings.loaders]
    items = {w.key: w.items for w in workloads}
    print(f"conveyor bench: {' vs '.join(loader.label for loader in loaders)}; each run a fresh process", file=out)
    print(machine_line(), file=out)
    print(settings.describe(items), file=out)
    if "cpu" in items:
        print(_cpu_cost_line(), file=out)
    run_settings: dict[str, Any] = {"repeats": settings.repeats, "quick": settings.quick, "items": settings.items}
    if "demo" in items:
        root = settings.data_dir if settings.data_dir is not None else default_demo_root()
        for n in dict.fromkeys((items["demo"], demo_warmup(items["demo"]))):
            print(f"demo dataset: {prepare_demo(root, n)}", file=out)
        run_settings["demo_root"] = str(root.resolve())
    print(RATIO_NOTE, file=out, flush=True)
    results = {}
    for count in settings.worker_counts:
        sizes = ", ".join(f"{key} {n:,} items" for key, n in items.items())
        print(f"conveyor bench: {count} workers: {sizes}, {settings.repeats} run(s) per loader", file=err, flush=True)
        started, load = time.perf_counter(), [round(os.getloadavg()[0], 2)]
        asked = {**run_settings, "workers": count}
        rows = run_suite(
            SUITE,
            workloads,
            loaders,
            settings.repeats,
            False,
            asked,
            settings.drop_one,
            log=lambda line: print(f"conveyor bench: {line.strip()}", file=err, flush=True),
            cap_seconds=settings.cap_seconds,
        )
        load.append(round(os.getloadavg()[0], 2))
        command = settings.command(count)
        results[count] = build_result(SUITE, rows, command, asked, _versions(), load, time.perf_counter() - started)
    return results


def execute(settings: Settings, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run the benchmark ``settings`` describe and print the report on ``out`` (progress,
    and the tracebacks of failed runs, on ``err``). Returns 0, or 1 when a conveyor or
    torch run failed (raised, or delivered wrong) or the benchmark could not run;
    torchdata's failures are only reported in its rows."""
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    try:
        if settings.plot is not None:
            from conveyor.tools.bench.plot import require_matplotlib

            require_matplotlib()
        if settings.save and (settings.quick or settings.items is not None):
            raise BenchError("--quick and --items runs are not saved with the results (use --out PATH)")
        if settings.save:
            _paths(settings, {})  # no checkout: say so before the runs, not after
        results = _run(settings, out, err)
        print("", file=out)
        print(format_report(results, settings.workers), file=out, flush=True)
        if settings.out is not None or settings.save:
            for count, path in _paths(settings, results).items():
                print(f"written: {results[count].save(path)}", file=out)
        if settings.plot is not None:
            from conveyor.tools.bench.plot import plot_throughput

            cpus = results[settings.workers].machine["cpus"]
            title = f"conveyor bench: throughput vs num_workers ({cpus} CPUs)"
            note = (
                "items/s = items per run / median wall time\n(loader creation to shutdown, workers joined)\n"
                f"median of {settings.repeats} run(s) per point, each a fresh process\n"
                f"--quick: {'yes' if settings.quick else 'no'}; capped loaders: see the report"
            )
            print(f"\nplot: {plot_throughput(results, settings.plot, title, note)}", file=out)
    except BenchError as error:
        print(f"conveyor bench: error: {error}", file=err)
        return 1
    failed = failed_required(results)
    if failed:
        print(f"\nverification FAILED for {'; '.join(failed)} ({CHECKED})", file=out)
        return 1
    print(f"\nverification passed for every run of conveyor and torch ({CHECKED})", file=out)
    return 0
