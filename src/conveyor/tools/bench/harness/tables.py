"""Markdown tables from results: the one generator of every table the benchmarks show.

The suites print their results through it, ``benchmarks/README.md`` holds its output for
each suite's newest result (between ``<!-- results: <suite> -->`` and ``<!-- /results -->``),
and a test checks that the README holds exactly what it generates from the stored files
(a block may name one file instead: ``<!-- results: <suite>/<file stem> -->``).

    python -m conveyor.tools.bench.harness.tables RESULT.json ...   # print the tables of results
    python -m conveyor.tools.bench.harness.tables --readme          # regenerate benchmarks/README.md's tables
    python -m conveyor.tools.bench.harness.tables --readme --check  # exit 1 if they differ from the results

A cell is a metric's median, formatted by its unit; the ``spread`` metrics add their
runs' min-max. The ratio column divides the subject loader's median of the result's
``ratio`` metric by the row's. Standard library only.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from conveyor.tools.bench.harness.results import RESULTS, Entry, Metric, Result, latest

README = RESULTS.parent / "README.md"
COMMAND = "python -m conveyor.tools.bench.harness.tables"
#: How a value of each unit is written (any other unit: three significant digits).
FORMATS = {
    "items/s": "{:,.0f}",
    "MB/s": "{:,.0f}",
    "µs/item": "{:,.1f}",
    "µs": "{:,.0f}",
    "ms": "{:,.1f}",
    "MiB": "{:,.1f}",
    "s": "{:,.3f}",
    "s/GB": "{:,.2f}",
    "%": "{:.1f}%",
    "Δ%": "{:+.1f}%",
    "B": "{:,.0f}",
    "count": "{:,.0f}",
    "x": "{:.3f}x",
}
BLOCK = re.compile(
    r"(?P<open><!-- results: (?P<suite>[\w-]+)(/(?P<name>[\w.-]+))? -->\n)(?P<body>.*?)(?P<close><!-- /results -->)",
    re.S,
)


def number(value: float, unit: str) -> str:
    return FORMATS.get(unit, "{:,.3g}").format(value)


def cell(metric: Metric, unit: str, spread: bool) -> str:
    text = number(metric.median, unit)
    if spread and metric.min is not None and metric.max is not None and metric.min != metric.max:
        text += f" ({number(metric.min, unit)}-{number(metric.max, unit)})"
    return text


def markdown(rows: Sequence[Sequence[str]]) -> str:
    """``rows`` (the first one the header) as a Markdown table."""
    lines = ["| " + " | ".join(row) + " |" for row in rows]
    lines.insert(1, "|" + "---|" * len(rows[0]))
    return "\n".join(lines)


def _ratio_column(result: Result) -> str | None:
    """The metric the ratio column divides, when the table has one: where the subject and
    another loader ran the same workload."""
    key = result.ratio
    if key is None or key not in result.metrics:
        return None
    loaders = {(e.workload, e.loader) for e in result.entries}
    shared = any((w, result.subject) in loaders and loader != result.subject for w, loader in loaders)
    return key if shared else None


def _row(result: Result, entry: Entry, ratio: str | None) -> list[str]:
    cells = [entry.workload, entry.label]
    if entry.status != "ok":
        why = entry.reason or (entry.failures[0] if entry.failures else "")
        cells += [f"{entry.status}: {why}"[:160]] + [""] * (len(result.columns) - 1 + (ratio is not None))
    else:
        for key in result.columns:
            metric = entry.metrics.get(key)
            unit = result.metrics[key]["unit"]
            cells.append("-" if metric is None else cell(metric, unit, key in result.spread))
        if ratio is not None:
            ours = result.median(entry.workload, result.subject, ratio)
            theirs = result.median(entry.workload, entry.loader, ratio)
            cells.append(f"{ours / theirs:.2f}x" if ours and theirs and entry.loader != result.subject else "")
    total = entry.runs + len(entry.failures)
    cells.append(f"{entry.runs}/{total}" if entry.status != "unavailable" else "-")
    return cells


def table(result: Result) -> str:
    """The table of a result: a row per entry."""
    ratio = _ratio_column(result)
    header = ["workload", "loader", *(result.metrics[key]["label"] for key in result.columns)]
    if ratio is not None:
        subject = next((e.label for e in result.entries if e.loader == result.subject), result.subject)
        header.append(f"{subject}'s {result.metrics[ratio]['label']} ÷ this")
    header.append("runs ok")
    return markdown([header, *(_row(result, entry, ratio) for entry in result.entries)])


def caption(result: Result) -> str:
    """What ran, where and when, in a line or two."""
    m = result.machine
    at = f"conveyor at `{result.commit[:7]}`" if result.commit else "conveyor at an unrecorded commit"
    if result.dirty:
        at += " (modified)"
    where = ", ".join(
        part
        for part in (
            f"{m.get('system', '')} {m.get('arch', '')}".strip(),
            f"{m['cpus']} CPUs" if m.get("cpus") else "",
            f"Python {m['python']}" if m.get("python") else "",
        )
        if part
    )
    load = f"; load {result.load[0]:.2f} at the start, {result.load[1]:.2f} at the end" if len(result.load) == 2 else ""
    repeats = result.settings.get("repeats")
    runs = {None: "", 1: "; one run each"}.get(repeats, f"; medians of {repeats} runs")
    line = f"**{result.title}**: `{result.command}`, {at}, {result.date[:10]}; {where}{load}{runs}."
    if result.source != "measured":
        line += f" Source: {result.source}."
    return line


def workloads(result: Result) -> str:
    return "; ".join(
        f"{key}: {w['items']:,} {w['describe']}" if w.get("items") else f"{key}: {w['describe']}"
        for key, w in result.workloads.items()
    )


def render(result: Result) -> str:
    """Caption, workloads, table and notes of a result, as the README shows them."""
    lines = [caption(result), "", f"Workloads: {workloads(result)}.", "", table(result)]
    found: dict[str, set[str]] = {name: {version} for name, version in result.versions.items()}
    for entry in result.entries:  # the runs' own: a peer's venv has its own packages
        for name, version in entry.versions.items():
            found.setdefault(name, set()).add(version)
    versions = ", ".join(f"{name} {' / '.join(sorted(found[name]))}" for name in sorted(found))
    if versions:
        lines += ["", f"Versions: {versions}."]
    if result.notes:
        lines += ["", *(f"- {note}" for note in result.notes)]
    return "\n".join(lines)


def readme_text(text: str, root: Path = RESULTS) -> str:
    """``text`` (a README) with each results block filled: ``<!-- results: SUITE -->`` with
    the suite's newest result, ``<!-- results: SUITE/NAME -->`` with ``SUITE/NAME.json``."""

    def fill(match: re.Match[str]) -> str:
        suite, name = match["suite"], match["name"]
        path = root / suite / f"{name}.json" if name else latest(suite, root)
        if path is None or not path.exists():
            body = f"No results of {suite} stored yet." if name is None else f"No result {suite}/{name} stored."
        else:
            body = render(Result.read(path))
        return f"{match['open']}{body}\n{match['close']}"

    return BLOCK.sub(fill, text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Markdown tables from benchmark results.")
    parser.add_argument("results", nargs="*", type=Path, help="result files to print")
    parser.add_argument("--readme", action="store_true", help=f"regenerate the tables in {README}")
    parser.add_argument("--check", action="store_true", help="with --readme: exit 1 if they are not up to date")
    options = parser.parse_args(argv)
    for path in options.results:
        print(render(Result.read(path)) + "\n")
    if options.readme:
        text = README.read_text()
        generated = readme_text(text)
        if options.check:
            if generated != text:
                print(f"{README}: tables differ from the results; regenerate them with {COMMAND} --readme")
                return 1
        elif generated != text:
            README.write_text(generated)
            print(f"{README}: tables regenerated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
