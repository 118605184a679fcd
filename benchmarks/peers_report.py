"""The tables and target lines ``bench_peers.py`` prints, from the runs it collected."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

MIB = 1 << 20
#: Loaders whose items/s and CPU per item cells show the spread (min-max) of their runs.
SPREAD = ("bare", "conveyor")
#: Issue 18's targets on conveyor's items/s against torch's, per workload.
TORCH_TARGETS = {"small": 30.0, "arrays": 20.0}
#: Issue 18's targets against the bare bound (compute): share of its items/s, CPU ratio.
BARE_RATE_TARGET, BARE_CPU_TARGET = 0.90, 1.10
HEADER = ("loader", "items/s", "ratio (conveyor/this)", "CPU µs/item", "first item ms", "peak PSS MiB")


@dataclass(frozen=True)
class Run:
    """One checked run's numbers."""

    wall_s: float  # loader creation to the end of its shutdown
    first_s: float | None  # loader creation to the first item (None: the bare bound has none)
    cpu_s: float  # CPU of the run's processes over the same span
    peak_pss_bytes: int
    samples: int  # how many times the memory was sampled


@dataclass
class Row:
    """One loader on one workload: its checked runs, its failures, or why it did not run."""

    loader: str
    label: str
    items: int
    runs: list[Run] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    unavailable: str | None = None

    def rates(self) -> list[float]:
        return [self.items / run.wall_s for run in self.runs]

    def cpu_us(self) -> list[float]:
        return [run.cpu_s / self.items * 1e6 for run in self.runs]

    @property
    def rate(self) -> float:
        """Items per second: the items over the median wall time."""
        return self.items / statistics.median(run.wall_s for run in self.runs)

    @property
    def cpu_per_item_us(self) -> float:
        return statistics.median(self.cpu_us())

    @property
    def first_ms(self) -> float | None:
        firsts = [run.first_s for run in self.runs if run.first_s is not None]
        return statistics.median(firsts) * 1e3 if firsts else None

    @property
    def pss_mib(self) -> float:
        return statistics.median(run.peak_pss_bytes for run in self.runs) / MIB


def _spread(values: Sequence[float], digits: int) -> str:
    return f" ({min(values):,.{digits}f}-{max(values):,.{digits}f})" if len(values) > 1 else ""


def _cells(row: Row, conveyor: Row | None) -> list[str]:
    if row.unavailable is not None:
        return [row.label, f"unavailable: {row.unavailable}", "", "", "", ""]
    if not row.runs:
        return [row.label, "failed: " + row.failures[0][:150], "", "", "", ""]
    spread = row.loader in SPREAD
    rate = f"{row.rate:,.0f}" + (_spread(row.rates(), 0) if spread else "")
    cpu = f"{row.cpu_per_item_us:,.1f}" + (_spread(row.cpu_us(), 1) if spread else "")
    ratio = f"{conveyor.rate / row.rate:.2f}x" if conveyor is not None and conveyor.runs else "-"
    first = "-" if row.first_ms is None else f"{row.first_ms:,.1f}"
    return [row.label, rate, ratio, cpu, first, f"{row.pss_mib:,.1f}"]


def table(rows: Sequence[Row]) -> str:
    """The Markdown table of one workload's rows."""
    conveyor = next((row for row in rows if row.loader == "conveyor"), None)
    body = [_cells(row, conveyor) for row in rows]
    widths = [max(len(line[i]) for line in [list(HEADER), *body]) for i in range(len(HEADER))]
    lines = [
        "| " + " | ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)) + " |"
        for line in [list(HEADER), *body]
    ]
    lines.insert(1, "|" + "|".join("-" * (width + 2) for width in widths) + "|")
    return "\n".join(lines)


def _measured(rows: Sequence[Row], loader: str) -> Row | None:
    return next((row for row in rows if row.loader == loader and row.runs), None)


def bare_lines(rows: Sequence[Row]) -> list[str]:
    """conveyor against the bare bound (compute): its share of the bound's items/s and
    its CPU per item over the bare work's, with the spread of their runs."""
    conveyor, bare = _measured(rows, "conveyor"), _measured(rows, "bare")
    if conveyor is None or bare is None:
        return ["conveyor vs the bare bound: not measured (a row failed or was not run)"]
    share = conveyor.rate / bare.rate
    cpu = conveyor.cpu_per_item_us / bare.cpu_per_item_us
    return [
        f"conveyor vs the bare bound: {share:.1%} of its items/s (conveyor {conveyor.rate:,.0f}, "
        f"bare {bare.rate:,.0f} items/s; medians); CPU per item {cpu:.2f}x the bare work's "
        f"({conveyor.cpu_per_item_us:,.1f} vs {bare.cpu_per_item_us:,.1f} µs)"
    ]


def target_lines(sections: dict[str, Sequence[Row]]) -> list[str]:
    """Issue 18's targets that this run measured, and whether each held (never asserted)."""
    lines = []
    for workload, goal in TORCH_TARGETS.items():
        conveyor, torch = (_measured(sections.get(workload, ()), key) for key in ("conveyor", "torch"))
        if conveyor is not None and torch is not None:
            ratio = conveyor.rate / torch.rate
            held = "held" if ratio >= goal else "missed"
            lines.append(f"{workload}: conveyor items/s >= {goal:g}x torch's: {ratio:.2f}x, {held}")
    rows = sections.get("compute", ())
    conveyor, bare = _measured(rows, "conveyor"), _measured(rows, "bare")
    if conveyor is not None and bare is not None:
        share = conveyor.rate / bare.rate
        cpu = conveyor.cpu_per_item_us / bare.cpu_per_item_us
        lines.append(
            f"compute: conveyor items/s >= {BARE_RATE_TARGET:.0%} of the bare bound's: {share:.1%}, "
            f"{'held' if share >= BARE_RATE_TARGET else 'missed'}"
        )
        lines.append(
            f"compute: conveyor CPU per item <= {BARE_CPU_TARGET:g}x the bare work's: {cpu:.2f}x, "
            f"{'held' if cpu <= BARE_CPU_TARGET else 'missed'}"
        )
    return lines
