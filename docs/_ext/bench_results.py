"""The one reader of ``benchmarks/results/*.json`` for the site's Performance pages.

Everything the pages know about a results file's layout is here: a change of the
benchmarks' JSON schema is a change of this module alone. A results file is read into
a :class:`Run` (when, where, the command that reproduces it, the settings) with its rows
already chosen for display: the table's columns and the charts' metrics.

Today's layout (``benchmarks/bench_snapshot.py`` writes it)::

    {"benchmark": "bench_snapshot", "date": ISO 8601, "git": {"commit": sha, "dirty": bool},
     "machine": {...}, "versions": {...}, "command": "python benchmarks/...",
     "settings": {...}, "rows": [{"case": id, "label": text, "unavailable": None | text,
                                  "summary": {metric: number, ...}, ...}, ...]}
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parents[2]
RESULTS = REPOSITORY / "benchmarks" / "results"

#: Per benchmark: the summary metrics shown as columns (key, heading) and the ones charted.
#: A benchmark not listed shows every numeric metric and charts the first two.
PRESENTATION: dict[str, dict[str, list[Any]]] = {
    "bench_snapshot": {
        "columns": [
            ("state_dict_us", "state_dict() µs"),
            ("serialise_us", "serialising µs"),
            ("call_cpu_us", "CPU per call µs"),
            ("in_calls_pct", "in calls, % of the epoch"),
            ("wall_overhead_paired_pct", "wall overhead % (paired)"),
            ("cpu_overhead_pct", "CPU overhead %"),
            ("state_bytes", "state bytes"),
        ],
        "charts": ["call_us", "in_calls_pct"],
    },
}
#: Chart titles for the metrics charted (a metric not listed is titled by its key).
METRIC_TITLES = {
    "call_us": "µs per state_dict() and its serialisation (wall)",
    "in_calls_pct": "time in those calls, % of the epoch",
}


@dataclass
class Row:
    label: str
    metrics: dict[str, float]
    unavailable: str | None = None


@dataclass
class Run:
    """One results file, ready to show."""

    name: str  # the file's stem
    benchmark: str
    title: str
    method: str  # how it is measured: the benchmark script's docstring
    date: str
    commit: str
    command: str
    machine: dict[str, Any]
    versions: dict[str, Any]
    settings: dict[str, Any]
    rows: list[Row]
    columns: list[tuple[str, str]] = field(default_factory=list)
    charts: list[tuple[str, str]] = field(default_factory=list)  # (metric, title)

    def table(self) -> tuple[list[str], list[list[str]]]:
        """The results table: a header and, per row, its label and formatted metrics."""
        header = ["loader", *(title for _, title in self.columns)]
        body = []
        for row in self.rows:
            if row.unavailable:
                body.append([row.label, *(["unavailable"] + [""] * (len(self.columns) - 1))])
            else:
                body.append([row.label, *(number(row.metrics.get(key)) for key, _ in self.columns)])
        return header, body

    def chart_values(self, metric: str) -> list[tuple[str, float]]:
        return [(row.label, row.metrics[metric]) for row in self.rows if metric in row.metrics]


def number(value: Any) -> str:
    """A metric as the tables show it."""
    if value is None:
        return ""
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def load_run(path: Path) -> Run:
    """Read one results file; ``ValueError`` naming the file when it is not in the layout above."""
    data = json.loads(path.read_text(encoding="utf-8"))
    try:
        benchmark = data["benchmark"]
        rows = [
            Row(
                row.get("label") or row["case"],
                {k: v for k, v in (row.get("summary") or {}).items() if _is_number(v)},
                row.get("unavailable"),
            )
            for row in data["rows"]
        ]
        method = _script_docstring(benchmark)
        run = Run(
            name=path.stem,
            benchmark=benchmark,
            title=re.split(r"[:.]", method.split("\n\n")[0])[0].replace("\n", " ").strip() or benchmark,
            method=method,
            date=data["date"],
            commit=(data.get("git") or {}).get("commit", ""),
            command=data["command"],
            machine=dict(data.get("machine") or {}),
            versions=dict(data.get("versions") or {}),
            settings=dict(data.get("settings") or {}),
            rows=rows,
        )
    except (KeyError, TypeError) as error:
        raise ValueError(
            f"{path}: not a benchmark results file as docs/_ext/bench_results.py reads them ({error!r})"
        ) from error
    _choose_display(run)
    return run


def load_runs(directory: Path = RESULTS) -> list[Run]:
    """Every results file in ``directory``, by name."""
    return [load_run(path) for path in sorted(directory.glob("*.json"))]


def _choose_display(run: Run) -> None:
    present = {key for row in run.rows for key in row.metrics}
    spec = PRESENTATION.get(run.benchmark)
    if spec is None:
        keys = [key for row in run.rows for key in row.metrics]
        ordered = list(dict.fromkeys(keys))
        run.columns = [(key, key) for key in ordered]
        charted = ordered[:2]
    else:
        run.columns = [(key, title) for key, title in spec["columns"] if key in present]
        charted = [key for key in spec["charts"] if key in present]
    run.charts = [(key, METRIC_TITLES.get(key, key)) for key in charted]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _script_docstring(benchmark: str) -> str:
    script = REPOSITORY / "benchmarks" / f"{benchmark}.py"
    if not script.exists():
        return ""
    return ast.get_docstring(ast.parse(script.read_text(encoding="utf-8"))) or ""
