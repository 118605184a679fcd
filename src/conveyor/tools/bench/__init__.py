"""``conveyor bench``: conveyor against ``torch.utils.data.DataLoader`` and torchdata 0.7.1's
``DataLoader2`` on the same pipelines, with every run checked.

The pieces, one concept per module, so that other front ends can reuse them (the
project's own benchmarks, in ``benchmarks/``, have a harness of their own: fresh processes
measured from outside, results saved; this command is the quick check a user runs):

- ``workloads``: the five workloads (``small``, ``numpy``, ``tensor``, ``cpu``, ``demo``),
  each with its conveyor graph, torch ``IterableDataset`` and torchdata graph, and its check;
- ``checks``: what a run must have delivered (count, sampled items, fingerprint), the same
  for every loader;
- ``loaders``: how each loader is built and shut down, and which ones are available;
- ``measure``: one checked, timed run (wall, first item, CPU incl. joined children);
- ``runner``: warm-ups, alternating runs, capping; :func:`run_benchmark` returns results;
- ``report``: the tables with ratios; ``plot``: throughput against ``num_workers``;
- ``options``: the command-line options and the :class:`Settings` they resolve to.

:func:`run` is the ``conveyor bench`` subcommand; :func:`main` is ``python -m conveyor.tools.bench``.
Internal: the commands are the interface, not these modules.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from typing import TextIO

from conveyor.tools.bench.errors import BenchError, CheckFailed
from conveyor.tools.bench.loaders import Loader, available_loaders, torch_version
from conveyor.tools.bench.measure import Run, measure_once
from conveyor.tools.bench.options import Settings, add_arguments, settings_from_args
from conveyor.tools.bench.report import (
    RATIO_NOTE,
    cpu_count,
    failed_required,
    format_report,
    format_table,
    machine_line,
)
from conveyor.tools.bench.runner import Result, run_benchmark
from conveyor.tools.bench.workloads import WORKLOAD_NAMES, DemoWorkload, Workload, cpu_heavy, make_workloads

__all__ = [
    "WORKLOAD_NAMES",
    "BenchError",
    "CheckFailed",
    "Loader",
    "Result",
    "Run",
    "Settings",
    "Workload",
    "add_arguments",
    "available_loaders",
    "execute",
    "format_report",
    "format_table",
    "main",
    "make_workloads",
    "measure_once",
    "run",
    "run_benchmark",
]


def _cpu_cost_line() -> str:
    """What the cpu workload's function costs here, so its items/s can be read against it."""
    times = []
    for i in range(5):
        start = time.perf_counter()
        cpu_heavy(i)
        times.append(time.perf_counter() - start)
    return f"cpu workload: its function takes {statistics.median(times) * 1e3:.2f} ms per item here (median of 5 calls)"


def execute(settings: Settings, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run the benchmark ``settings`` describe and print the report on ``out`` (progress and
    tracebacks on ``err``). Returns 0, or 1 when a conveyor or torch run failed (raised,
    or read wrong items) or the benchmark could not run; torchdata's failures are only
    reported in its rows."""
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    try:
        if settings.plot is not None:
            from conveyor.tools.bench.plot import require_matplotlib

            require_matplotlib()
        workloads = make_workloads(settings.data_dir)
        selected = [workloads[name] for name in settings.workloads]
        items = {w.name: settings.items_for(w) for w in selected}
        print("conveyor bench: conveyor DataLoader2 vs torch.utils.data.DataLoader vs torchdata DataLoader2", file=out)
        print(machine_line(), file=out)
        print(settings.describe(workloads), file=out)
        if "cpu" in items:
            print(_cpu_cost_line(), file=out)
        demo = workloads["demo"]
        if "demo" in items and isinstance(demo, DemoWorkload):
            try:
                demo.prepare(items["demo"])  # now, to report it; the runs reuse it
            except (BenchError, ImportError) as error:  # the demo's rows will say it failed, and why
                print(f"demo dataset: {error}", file=out)
            for line in demo.generated:
                print(f"demo dataset: {line}", file=out)
        print(RATIO_NOTE, file=out, flush=True)
        results = run_benchmark(
            selected,
            settings.worker_counts,
            settings.repeats,
            items,
            cap_seconds=settings.cap_seconds,
            log=lambda line: print(f"conveyor bench: {line}", file=err, flush=True),
            errors=err,
        )
        print("", file=out)
        print(format_report(results, settings.workers), file=out, flush=True)
        if settings.plot is not None:
            from conveyor.tools.bench.plot import plot_throughput

            title = f"conveyor bench: throughput vs num_workers ({cpu_count()} CPUs, torch {torch_version()})"
            note = (
                "items/s = items per run / median wall time\n(loader creation to shutdown, workers joined)\n"
                f"median of {settings.repeats} run(s) per point, after 1 warm-up\n"
                f"--quick: {'yes' if settings.quick else 'no'}; "
                "capped loaders: see the report"
            )
            path = plot_throughput(results, settings.plot, title, note)
            print(f"\nplot: {path}", file=out)
    except BenchError as error:
        print(f"conveyor bench: error: {error}", file=err)
        return 1
    failed = failed_required(results)
    checked = (
        "items checked: count, types and values (the demo: every batch); the last item after shutdown; "
        "no worker process left running after shutdown"
    )
    if failed:
        print(f"\nverification FAILED for {'; '.join(failed)} ({checked})", file=out)
        return 1
    print(f"\nverification passed for every run that completed ({checked})", file=out)
    return 0


def run(args: argparse.Namespace) -> int:
    """The ``conveyor bench`` subcommand: ``args`` as parsed by :func:`add_arguments`."""
    return execute(settings_from_args(args))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m conveyor.tools.bench``: the same as ``conveyor bench``."""
    parser = argparse.ArgumentParser(
        prog="python -m conveyor.tools.bench", description=(__doc__ or "").split("\n", 1)[0]
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))
