"""The report of ``conveyor bench``: the machine, one Markdown table per workload with
ratio rows, and a throughput-by-``num_workers`` table when several worker counts ran.

The ratio rows compare conveyor with each other loader so that above 1 always means
conveyor is better: items/s and MiB/s are conveyor's over theirs, CPU per item and time
to the first item are theirs over conveyor's. Every number is a median over the runs.
"""

from __future__ import annotations

import datetime
import math
import multiprocessing
import os
import platform
from collections.abc import Iterable, Sequence

import numpy as np

from conveyor import __version__
from conveyor.tools.bench.loaders import torch_threads, torch_version, torchdata_version
from conveyor.tools.bench.runner import Result
from conveyor.tools.bench.workloads import CONVEYOR

HEADER = (
    "loader",
    "items/run",
    "wall s",
    "items/s",
    "MiB/s",
    "CPU s",
    "CPU µs/item",
    "first item ms",
    "items/s spread",
    "check",
)
RATIO_NOTE = (
    "ratio rows: items/s and MiB/s = conveyor / that loader; CPU µs/item and first item = that loader / conveyor; "
    "above 1 = conveyor better. wall s runs from the loader's creation to its shutdown (workers joined); CPU s is "
    "this process's and its joined children's user+sys CPU over the run. Medians over the runs; "
    "spread = (max - min) / median of items/s."
)


def cpu_count() -> int | str:
    """The CPUs this process may run on (its affinity), which is what the workers share."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or "?"


def machine_line() -> str:
    """The machine and the versions the numbers depend on, and the date: reports are kept
    (benchmarks/README.md) and compared across commits and days."""
    threads = f" ({torch_threads()} intra-op threads)" if torch_threads() != "-" else ""
    return (
        f"machine: {platform.system()} {platform.release()} {platform.machine()}, {cpu_count()} CPUs usable, "
        f"python {platform.python_version()}, conveyor {__version__}, numpy {np.__version__}, "
        f"torch {torch_version()}{threads}, torchdata {torchdata_version()}, "
        f"start method {multiprocessing.get_start_method()}; date {datetime.date.today().isoformat()}"
    )


def _ratio(value: float) -> str:
    return f"{value:.2f}x" if math.isfinite(value) else "-"


def _ratio_row(ours: Result, theirs: Result) -> tuple[str, ...]:
    label = f"ratio conveyor vs {theirs.loader.name}"
    if not (ours.ok and theirs.ok):
        missing = ours if not ours.ok else theirs
        why = "unavailable" if missing.unavailable else "failed"
        return (label, "", "", "-", "-", "", "-", "-", "", f"{missing.loader.key} {why}")
    rate = _ratio(ours.rate / theirs.rate)
    cpu = _ratio(theirs.cpu_per_item / ours.cpu_per_item) if ours.cpu_per_item > 0 else "-"
    first = _ratio(theirs.median("first_s") / ours.median("first_s"))
    return (label, "", "", rate, rate if ours.mib_rate is not None else "-", "", cpu, first, "", "")


def _row(result: Result) -> tuple[str, ...]:
    name = result.loader.name + (" (capped)" if result.capped and result.ok else "")
    if not result.ok:
        items = "-" if result.unavailable else f"{result.items:,}"
        return (name, items, "-", "-", "-", "-", "-", "-", "-", result.status)
    mib = result.mib_rate
    return (
        name,
        f"{result.samples:,}",
        f"{result.median('wall_s'):.2f}",
        f"{result.rate:,.0f}",
        f"{mib:,.0f}" if mib is not None else "-",
        f"{result.median('cpu_s'):.2f}",
        f"{result.cpu_per_item * 1e6:,.1f}",
        f"{result.median('first_s') * 1e3:,.1f}",
        f"{result.spread:.0%}" if len(result.runs) > 1 else "-",
        result.status,
    )


def markdown(rows: Sequence[Sequence[str]]) -> str:
    """``rows`` (the first one the header) as an aligned Markdown table."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def format_table(results: Sequence[Result]) -> str:
    """One workload at one ``num_workers``: a row per loader, then a ratio row per other loader."""
    ours = next(r for r in results if r.loader.key == CONVEYOR)
    rows = [HEADER, *(_row(r) for r in results)]
    rows += [_ratio_row(ours, r) for r in results if r is not ours]
    return markdown(rows)


def _check_line(results: Sequence[Result]) -> str:
    """Whether the loaders' runs passed their checks with the same fingerprint (capped
    runs read fewer items, so theirs is listed on its own)."""
    done = [r for r in results if r.ok]
    if not done:
        return "check: no loader completed a run"
    full = [r for r in done if not r.capped]
    distinct = list(dict.fromkeys(f for r in full for f in r.fingerprints))
    if len(distinct) > 1:
        listed = "; ".join(f"{r.loader.name}: {' | '.join(r.fingerprints)}" for r in full)
        line = f"check: runs passed but their items DIFFER between loaders: {listed}"
    elif distinct:
        line = f"check: every run of {', '.join(r.loader.name for r in full)} passed, same items: {distinct[0]}"
    else:
        line = "check: every run passed"
    for result in done:
        if result.capped:
            line += f"; {result.loader.name} (capped) passed on its own items: {' | '.join(result.fingerprints)}"
    return line


def format_section(results: Sequence[Result]) -> str:
    """Title, table, notes and check line for one workload at one ``num_workers``."""
    first = results[0]
    workload, workers = first.workload, first.workers
    repeats = max((len(r.runs) for r in results), default=0)
    items = next((r.samples for r in results if r.ok and not r.capped), first.items)
    title = (
        f"{workload.name}: {workload.describe(items)}; {workers} worker{'s' if workers != 1 else ''}, "
        f"median of {repeats} run(s)"
    )
    lines = [title, "", format_table(results), ""]
    for result in results:
        note = workload.output_note(result.loader.key)
        if note and result.ok:
            lines.append(f"note: {result.loader.name} {note}")
        if result.capped and result.ok:
            lines.append(f"note: {result.capped}")
    lines.append(_check_line(results))
    return "\n".join(lines)


def _groups(results: Iterable[Result]) -> dict[tuple[int, str], list[Result]]:
    groups: dict[tuple[int, str], list[Result]] = {}
    for result in results:
        groups.setdefault((result.workers, result.workload.name), []).append(result)
    return groups


def format_sweep(results: Sequence[Result]) -> str:
    """items/s (median) of every loader on every workload, one column per ``num_workers``."""
    counts = sorted({r.workers for r in results})
    cells: dict[tuple[str, str], dict[int, str]] = {}
    for result in results:
        value = f"{result.rate:,.0f}" if result.ok else ("n/a" if result.unavailable else "failed")
        cells.setdefault((result.workload.name, result.loader.name), {})[result.workers] = value
    rows = [("workload", "loader", *(f"{c} workers" for c in counts))]
    rows += [(w, loader, *(by.get(c, "-") for c in counts)) for (w, loader), by in cells.items()]
    return "throughput by num_workers (items/s, median):\n\n" + markdown(rows)


def format_report(results: Sequence[Result], workers: int) -> str:
    """The full report: a section per workload at ``workers`` workers, then the sweep
    table when other worker counts ran too."""
    groups = _groups(results)
    sections = [format_section(group) for (count, _), group in groups.items() if count == workers]
    if len({r.workers for r in results}) > 1:
        sections.append(format_sweep(results))
    return "\n\n".join(sections)


def failed_required(results: Iterable[Result]) -> list[str]:
    """``workload (N workers): loader`` for every failed run of a loader whose failure counts."""
    return [
        f"{r.workload.name} ({r.workers} worker{'s' if r.workers != 1 else ''}): {r.loader.name}"
        for r in results
        if r.error and r.loader.required
    ]
