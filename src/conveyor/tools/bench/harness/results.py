"""The results of a suite's run, as saved under ``benchmarks/results/<suite>/``: one JSON
file per run, in one schema for every suite (``SCHEMA``; ``benchmarks/results/README.md``
describes it field by field). The tables in ``benchmarks/README.md`` are generated from
these files (``tables``), and so can any other page.

A result holds what ran (suite, command, settings), where and on what (machine,
versions, commit, date, the machine's load), and one entry per workload and loader:
its status, its checked runs' count, the versions its runs used, and its metrics, each
with the values of every run, their median and their min-max. Metric definitions
(label and unit) travel in the file, so a reader needs nothing else to render it.

Standard library only.
"""

from __future__ import annotations

import datetime
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = "conveyor-benchmarks/1"
MIB = 1 << 20


def checkout_of(path: Path) -> Path | None:
    """The conveyor source checkout holding ``path`` (the folder with ``src/conveyor`` and
    ``benchmarks/results``), or None: an installed conveyor has no results folder, and
    no commit of its own."""
    for folder in Path(path).resolve().parents:
        if (folder / "src" / "conveyor").is_dir() and (folder / "benchmarks" / "results").is_dir():
            return folder
    return None


#: The checkout this harness runs from, when it does (src/ layout, an editable install).
CHECKOUT = checkout_of(Path(__file__))
#: Where results are read and saved: the checkout's, else ``benchmarks/results`` under the
#: current folder (the tables of a checkout made with an installed conveyor, from its root).
RESULTS = CHECKOUT / "benchmarks" / "results" if CHECKOUT is not None else Path("benchmarks", "results")

#: The metrics every run yields (a suite adds its own: ``Suite.metrics``), key -> (label, unit).
STANDARD_METRICS: dict[str, tuple[str, str]] = {
    "items_per_s": ("items/s", "items/s"),
    "mb_per_s": ("MB/s", "MB/s"),
    "cpu_s_per_gb": ("CPU s/GB", "s/GB"),
    "cpu_us_per_item": ("CPU µs/item", "µs/item"),
    "first_item_ms": ("first item ms", "ms"),
    "peak_pss_mib": ("peak PSS MiB", "MiB"),
    "peak_rss_mib": ("peak RSS MiB", "MiB"),
    "rss_before_mib": ("RSS before the loader MiB", "MiB"),
    "processes": ("processes", "count"),
    "wall_s": ("wall s", "s"),
    "cpu_s": ("CPU s", "s"),
    "items": ("items per run", "count"),
    "delivered": ("items delivered", "count"),
}
STATUSES = ("ok", "failed", "unavailable")


@dataclass
class Metric:
    """One metric of one entry: its median over the runs, their min and max, and every
    run's value in the order the runs were made (``values`` is empty for figures
    transcribed from a report that kept only the median, or a range)."""

    median: float
    min: float | None = None
    max: float | None = None
    values: list[float] = field(default_factory=list)

    @classmethod
    def of(cls, values: Sequence[float]) -> Metric:
        return cls(statistics.median(values), min(values), max(values), list(values))


@dataclass
class Entry:
    """One loader on one workload: ``status`` is ``ok`` (every metric from its checked
    runs), ``failed`` (no run passed its checks: ``failures`` say why) or ``unavailable``
    (it could not run here: ``reason``). ``runs`` counts the checked runs; ``failures``
    lists the runs that failed, even when others passed."""

    workload: str
    loader: str
    label: str
    status: str
    runs: int = 0
    reason: str = ""
    failures: list[str] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, Metric] = field(default_factory=dict)
    details: list[dict[str, Any]] = field(default_factory=list)  # the runs' figures that are not numbers


@dataclass
class Result:
    """A suite's run (see the module)."""

    suite: str
    title: str
    command: str
    date: str  # ISO 8601, with the time and offset when measured
    commit: str | None  # the repository's HEAD, 40 hex digits
    dirty: bool | None  # whether src/ or benchmarks/ differed from it
    machine: dict[str, Any]
    versions: dict[str, str]  # the orchestrator's; each entry has its runs'
    settings: dict[str, Any]
    subject: str  # the loader the others are compared with
    columns: list[str]  # the metrics a table shows, in order
    spread: list[str]  # those shown with their min-max
    metrics: dict[str, dict[str, str]]  # key -> {"label", "unit"}
    workloads: dict[str, dict[str, Any]]  # key -> {"describe", "items", "unit"}
    entries: list[Entry]
    notes: list[str] = field(default_factory=list)
    ratio: str | None = None  # the metric of the ratio column: the subject's median over each row's
    load: list[float] = field(default_factory=list)  # the machine's load average at the start and the end
    seconds: float | None = None
    source: str = "measured"  # or where transcribed figures came from
    schema: str = SCHEMA

    def entry(self, workload: str, loader: str) -> Entry | None:
        return next((e for e in self.entries if e.workload == workload and e.loader == loader), None)

    def median(self, workload: str, loader: str, metric: str) -> float | None:
        """The median of ``metric`` for an entry that ran, else None."""
        entry = self.entry(workload, loader)
        if entry is None or entry.status != "ok" or metric not in entry.metrics:
            return None
        return entry.metrics[metric].median

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Result:
        raw = json.loads(text)
        problems = validate(raw)
        if problems:
            raise ValueError("not a benchmark result: " + "; ".join(problems))
        entries = [
            Entry(**{**e, "metrics": {k: Metric(**m) for k, m in e["metrics"].items()}}) for e in raw.pop("entries")
        ]
        return cls(**raw, entries=entries)

    @classmethod
    def read(cls, path: Path) -> Result:
        return cls.from_json(Path(path).read_text())

    def save(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json())
        return path

    def default_path(self, root: Path = RESULTS) -> Path:
        """``<root>/<suite>/<date>-<commit>.json``, numbered when taken."""
        stem = f"{self.date[:10]}-{(self.commit or 'unknown')[:7]}"
        path = root / self.suite / f"{stem}.json"
        number = 2
        while path.exists():
            path = root / self.suite / f"{stem}-{number}.json"
            number += 1
        return path


_REQUIRED = {
    "schema": str,
    "suite": str,
    "title": str,
    "command": str,
    "date": str,
    "machine": dict,
    "versions": dict,
    "settings": dict,
    "subject": str,
    "columns": list,
    "spread": list,
    "metrics": dict,
    "workloads": dict,
    "entries": list,
}


def validate(raw: Mapping[str, Any]) -> list[str]:
    """What keeps ``raw`` (a parsed file) from being a result of this schema; empty if nothing."""
    problems = [
        f"{key}: missing or not a {kind.__name__}"
        for key, kind in _REQUIRED.items()
        if not isinstance(raw.get(key), kind)
    ]
    if problems:
        return problems
    if raw["schema"] != SCHEMA:
        return [f"schema {raw['schema']!r}, expected {SCHEMA!r}"]
    for key in raw["columns"]:
        if key not in raw["metrics"]:
            problems.append(f"column {key!r} has no metric definition")
    for entry in raw["entries"]:
        where = f"entry {entry.get('workload')}/{entry.get('loader')}"
        if entry.get("status") not in STATUSES:
            problems.append(f"{where}: status {entry.get('status')!r}, not one of {STATUSES}")
        if entry.get("workload") not in raw["workloads"]:
            problems.append(f"{where}: unknown workload")
        for key, metric in entry.get("metrics", {}).items():
            if key not in raw["metrics"]:
                problems.append(f"{where}: metric {key!r} has no definition")
            elif not isinstance(metric, dict) or not isinstance(metric.get("median"), int | float):
                problems.append(f"{where}: metric {key!r} has no median")
    return problems


def latest(suite: str, root: Path = RESULTS) -> Path | None:
    """The newest result of ``suite`` under ``root`` (by date, then name)."""
    found = []
    for path in (root / suite).glob("*.json"):
        found.append((json.loads(path.read_text()).get("date", ""), path.name, path))
    return max(found)[2] if found else None


# --- where and on what a run ran ------------------------------------------------------------


def machine() -> dict[str, Any]:
    """The machine as the results describe it."""
    model = ""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            model = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "")
    except OSError:
        model = platform.processor()  # not Linux: what the platform says
    return {
        "system": f"{platform.system()} {platform.release()}",
        "arch": platform.machine(),
        "cpu": model,
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "python": platform.python_version(),
        "start_method": multiprocessing.get_start_method(),
    }


def commit(checkout: Path | None) -> tuple[str | None, bool | None]:
    """The checkout's HEAD and whether its ``src/`` or ``benchmarks/`` differ from it
    (``None``, ``None`` without a checkout, or outside a git repository)."""
    if checkout is None:
        return None, None

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(checkout), *args], capture_output=True, text=True, check=False)
        except OSError:
            return None  # no git here
        return done.stdout.strip() if done.returncode == 0 else None

    head = git("rev-parse", "HEAD")
    if not head:
        return None, None
    status = git("status", "--porcelain", "--untracked-files=no", "--", "src", "benchmarks")
    return head, bool(status)


def now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def metric_definitions(keys: Iterable[str], extra: Mapping[str, tuple[str, str]]) -> dict[str, dict[str, str]]:
    """``{key: {"label", "unit"}}`` for ``keys``, from the standard metrics and ``extra``."""
    known = {**STANDARD_METRICS, **extra}
    return {key: {"label": known[key][0], "unit": known[key][1]} for key in keys}
