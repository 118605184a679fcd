"""The report of ``conveyor bench``, generated from the harness's results: the machine, one
Markdown table per workload with ratio rows, and a throughput-by-``num_workers`` table
when several worker counts ran.

The ratio rows compare conveyor with each other loader so that above 1 always means
conveyor is better: items/s and MiB/s are conveyor's over theirs, CPU per item, time to
the first item and peak memory are theirs over conveyor's. Every number is a median over
the runs.
"""

from __future__ import annotations

import datetime
import importlib.metadata
from collections.abc import Iterable, Mapping, Sequence

from conveyor.tools.bench.harness.results import Entry, Result, machine
from conveyor.tools.bench.loaders import REQUIRED
from conveyor.tools.bench.workloads import output_note

MIB = 1 << 20
HEADER = (
    "loader",
    "items/run",
    "wall s",
    "items/s",
    "MiB/s",
    "CPU s",
    "CPU µs/item",
    "first item ms",
    "peak PSS MiB",
    "items/s spread",
    "check",
)
#: The ratio row's metrics, each with whether conveyor's figure is the numerator (more is better).
RATIOS = (
    ("items_per_s", True),
    ("mb_per_s", True),
    ("cpu_us_per_item", False),
    ("first_item_ms", False),
    ("peak_pss_mib", False),
)
RATIO_NOTE = (
    "ratio rows: items/s and MiB/s = conveyor / that loader; CPU µs/item, first item and peak PSS = that loader / "
    "conveyor; above 1 = conveyor better. Each run is a fresh process: wall s runs from the loader's creation to "
    "its shutdown (workers joined), after a warm-up epoch; CPU s is the user+sys CPU of the run's whole process "
    "tree, measured from outside; peak PSS is the peak of their summed PSS. Medians over the runs; "
    "spread = (max - min) / median of items/s."
)
#: Status texts longer than this are shortened in the table (stderr has the whole traceback).
MAX_REASON = 110
CHECKED = (
    "every item of every epoch counted as it arrived: each id delivered once, nothing malformed, the checksum "
    "right; the last item unchanged by the loader's shutdown; no process left behind it"
)


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def machine_line() -> str:
    """The machine and the versions the numbers depend on, and the date: reports are kept
    and compared across commits and days. (Versions as installed: nothing is imported.)"""
    m = machine()
    versions = ", ".join(f"{name} {_version(name)}" for name in ("conveyor", "numpy", "torch", "torchdata"))
    return (
        f"machine: {m['system']} {m['arch']}, {m['cpus']} CPUs usable, python {m['python']}, {versions}, "
        f"start method {m['start_method']}; date {datetime.date.today().isoformat()}"
    )


def _median(entry: Entry, key: str) -> float | None:
    metric = entry.metrics.get(key)
    return metric.median if metric is not None else None


def _short(text: str) -> str:
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."


def status(entry: Entry) -> str:
    """The row's check cell: ``ok (N runs)``, or why there are no numbers."""
    if entry.status == "unavailable":
        return _short(f"unavailable: {entry.reason}")
    if entry.status == "failed":
        return _short(f"failed ({entry.failures[0]})")
    runs = f"{entry.runs} run{'s' if entry.runs != 1 else ''}"
    if entry.failures:
        return _short(f"ok ({runs}; failed {entry.failures[0]})")
    return f"ok ({runs})"


def _row(entry: Entry, items: int) -> tuple[str, ...]:
    if entry.status != "ok":
        return (entry.label, "-" if entry.status == "unavailable" else f"{items:,}", *["-"] * 8, status(entry))
    rate = entry.metrics["items_per_s"]
    mb = _median(entry, "mb_per_s")
    first = _median(entry, "first_item_ms")
    spread = (rate.max - rate.min) / rate.median if entry.runs > 1 and rate.max is not None and rate.min else None
    return (
        entry.label,
        f"{_median(entry, 'items') or 0:,.0f}",
        f"{_median(entry, 'wall_s') or 0:.2f}",
        f"{rate.median:,.0f}",
        f"{mb * 1e6 / MIB:,.0f}" if mb is not None else "-",
        f"{_median(entry, 'cpu_s') or 0:.2f}",
        f"{_median(entry, 'cpu_us_per_item') or 0:,.1f}",
        f"{first:,.1f}" if first is not None else "-",
        f"{_median(entry, 'peak_pss_mib') or 0:,.1f}",
        f"{spread:.0%}" if spread is not None else "-",
        status(entry),
    )


def _ratio_row(ours: Entry, theirs: Entry) -> tuple[str, ...]:
    label = f"ratio conveyor vs {theirs.label}"
    if ours.status != "ok" or theirs.status != "ok":
        missing = ours if ours.status != "ok" else theirs
        return (label, "", "", "-", "-", "", "-", "-", "-", "", f"{missing.loader} {missing.status}")
    cells = {}
    for key, ours_on_top in RATIOS:
        a, b = _median(ours, key), _median(theirs, key)
        ratio = (a / b if ours_on_top else b / a) if a and b else None
        cells[key] = f"{ratio:.2f}x" if ratio is not None else "-"
    return (label, "", "", cells["items_per_s"], cells["mb_per_s"], "", cells["cpu_us_per_item"],
            cells["first_item_ms"], cells["peak_pss_mib"], "", "")  # fmt: skip


def markdown(rows: Sequence[Sequence[str]]) -> str:
    """``rows`` (the first one the header) as an aligned Markdown table."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def format_table(entries: Sequence[Entry], items: int) -> str:
    """One workload at one ``num_workers``: a row per loader, then a ratio row per other loader."""
    rows = [HEADER, *(_row(entry, items) for entry in entries)]
    ours = next((e for e in entries if e.loader == "conveyor"), None)
    if ours is not None:
        rows += [_ratio_row(ours, entry) for entry in entries if entry is not ours]
    return markdown(rows)


def _check_line(entries: Sequence[Entry]) -> str:
    done = [e for e in entries if e.status == "ok"]
    if not done:
        return "check: no loader completed a run"
    line = f"check: every run of {', '.join(e.label for e in done)} passed"
    failed = [f"{e.label}: {e.failures[0]}" for e in entries if e.failures]
    return line + ("; runs failed: " + "; ".join(failed) if failed else "")


def format_section(result: Result, workload: str) -> str:
    """Title, table, notes and check line for one workload at the result's ``num_workers``."""
    entries = [e for e in result.entries if e.workload == workload]
    described = result.workloads[workload]
    workers = result.settings["workers"]
    repeats = max((e.runs for e in entries), default=0)
    title = (
        f"{workload}: {described['items']:,} {described['describe']}; {workers} worker{'s' if workers != 1 else ''}, "
        f"median of {repeats} run(s)"
    )
    lines = [title, "", format_table(entries, described["items"]), ""]
    for entry in entries:
        note = output_note(workload, entry.loader)
        if note and entry.status == "ok":
            lines.append(f"note: {entry.label} {note}")
    if any("(capped: " in e.label for e in entries):
        lines.append(
            "note: a capped loader read fewer items per run (its warm-up said a full run would take over the cap); "
            "its rates and CPU per item are over those runs, whose start-up and shutdown weigh more"
        )
    lines.append(_check_line(entries))
    return "\n".join(lines)


def format_sweep(results: Mapping[int, Result]) -> str:
    """items/s (median) of every loader on every workload, one column per ``num_workers``."""
    counts = sorted(results)
    cells: dict[tuple[str, str], dict[int, str]] = {}
    for count, result in results.items():
        for e in result.entries:
            rate = _median(e, "items_per_s")
            value = f"{rate:,.0f}" if rate is not None else ("n/a" if e.status == "unavailable" else "failed")
            cells.setdefault((e.workload, e.label.split(" (capped")[0]), {})[count] = value
    rows = [("workload", "loader", *(f"{c} workers" for c in counts))]
    rows += [(w, loader, *(by.get(c, "-") for c in counts)) for (w, loader), by in cells.items()]
    return "throughput by num_workers (items/s, median):\n\n" + markdown(rows)


def versions_line(results: Iterable[Result]) -> str:
    """The versions the runs used (each run reports its own)."""
    found: dict[str, set[str]] = {}
    for result in results:
        for entry in result.entries:
            for name, version in entry.versions.items():
                found.setdefault(name, set()).add(version)
    return "versions the runs used: " + (
        ", ".join(f"{name} {' / '.join(sorted(found[name]))}" for name in sorted(found)) or "-"
    )


def format_report(results: Mapping[int, Result], workers: int) -> str:
    """The full report: a section per workload at ``workers`` workers, the sweep table
    when other worker counts ran too, and the versions."""
    tables = results[workers]
    sections = [format_section(tables, workload) for workload in tables.workloads]
    if len(results) > 1:
        sections.append(format_sweep(results))
    sections.append(versions_line(results.values()))
    return "\n\n".join(sections)


def failed_required(results: Mapping[int, Result]) -> list[str]:
    """``workload (N workers): loader`` for every failed run of a loader whose failure counts."""
    return [
        f"{e.workload} ({count} worker{'s' if count != 1 else ''}): {e.label}"
        for count, result in results.items()
        for e in result.entries
        if e.failures and e.loader in REQUIRED
    ]
