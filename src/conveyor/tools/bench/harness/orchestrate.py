"""Running a suite: every loader on every workload it applies to, each run a fresh
process measured from outside (``measure``), its items checked (``tally``), and the runs
gathered into a ``results.Result``.

Runs follow the suite's schedule (by default, per workload, every loader once per repeat
in turn). A run that fails (a crash, a timeout, a wrong delivery, a process left behind)
is reported in its entry and never retried. A loader whose interpreter is missing (a
peer's venv not made yet) or whose libraries cannot be imported is an entry saying so.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conveyor.tools.bench.harness.declare import Context, Loader, Suite, Workload
from conveyor.tools.bench.harness.measure import measure_child
from conveyor.tools.bench.harness.results import (
    MIB,
    Entry,
    Metric,
    Result,
    checkout_of,
    commit,
    machine,
    metric_definitions,
    now,
)
from conveyor.tools.bench.harness.tally import check_delivery
from conveyor.tools.bench.harness.zygote import Zygote

CHILD = Path(__file__).resolve().parent / "child.py"
#: Where the peers' venvs are, when not beside the suite (tests).
VENVS: Path | None = None
#: Seconds one run may take before its processes are killed and it counts as failed.
RUN_TIMEOUT_S = 600.0
#: Tests only: when set, a run of a loader in this interpreter is forked from this zygote
#: (``zygote``) instead of starting a fresh interpreter, sparing each run the imports;
#: its figures then leave out the run's own start-up. Suites that wrap their runs'
#: commands (``Suite.command``) and peers' interpreters still start fresh ones.
ZYGOTE: Zygote | None = None


@dataclass
class Row:
    """One loader on one workload while the suite runs: its checked runs' figures, its
    failures, or why it cannot run."""

    workload: Workload
    loader: Loader
    items: int
    runs: list[dict[str, Any]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    unavailable: str = ""
    versions: dict[str, str] = field(default_factory=dict)


def venvs_of(suite: Suite) -> Path:
    """Where the peers' venvs of ``suite`` are: :data:`VENVS`, else beside the suite's file
    (``benchmarks/peer_envs.sh`` makes them in ``benchmarks/.venvs``)."""
    return VENVS if VENVS is not None else Path(suite.path).resolve().parent / ".venvs"


def interpreter(loader: Loader, venvs: Path | None = None) -> tuple[Path | None, str]:
    """The Python that runs ``loader`` (a peer's from ``venvs``, by default :data:`VENVS`
    or ``benchmarks/.venvs``), or ``None`` and why it is unavailable."""
    if loader.venv is not None:  # peer_envs.sh writes the stamp last, once the venv is complete
        venv = (venvs or VENVS or Path("benchmarks", ".venvs")) / loader.venv
        complete = (venv / ".peer-requirements").exists()
        return (venv / "bin" / "python", "") if complete else (None, "run benchmarks/peer_envs.sh")
    missing = [name for name in loader.needs if ":" not in name and importlib.util.find_spec(name) is None]
    if missing:
        return None, f"{', '.join(missing)} not installed for {sys.executable}"
    lacking = [need for need in loader.needs if ":" in need and not has_attribute(*need.split(":", 1))]
    if lacking:
        return None, f"{', '.join(n.replace(':', '.') for n in lacking)} not found: not in this version"
    why = loader.unavailable() if loader.unavailable is not None else ""
    return (None, why) if why else (Path(sys.executable), "")


def has_attribute(module: str, name: str) -> bool:
    """Whether ``module`` (imported here if this interpreter finds it) has ``name``: a
    loader that needs a function its library does not have yet cannot run."""
    if importlib.util.find_spec(module) is None:
        return False
    return hasattr(importlib.import_module(module), name)


def child_env(loader: Loader) -> dict[str, str]:
    """The run's environment: this one's; a peer's without this project's paths."""
    env = dict(os.environ)
    if loader.venv is not None:
        env.pop("PYTHONPATH", None)
        env.pop("PYTHONHOME", None)
    return env


class Expected:
    """What an epoch's checksum must be, per size: worked out once per workload and size
    (a capped run's too), in this process."""

    def __init__(self, workload: Workload, settings: Mapping[str, Any]) -> None:
        self.workload, self.settings = workload, {**workload.settings, **settings}
        self.found: dict[tuple[int, bool], Any] = {}

    def __call__(self, items: int, warmup: bool) -> Any:
        if (items, warmup) not in self.found:
            context = Context(self.workload, None, items, self.settings, warmup)
            self.found[(items, warmup)] = self.workload.expected(context)
        return self.found[(items, warmup)]


def _stage_problems(stage: Mapping[str, Any]) -> list[str]:
    problems = []
    if stage["stray"]:
        problems.append(f"{stage['stray']} worker process(es) still running after the loader's shutdown")
    if stage.get("last_changed"):
        problems.append("the last item read differently after the loader's shutdown (its memory reused or freed)")
    return problems


def run_once(
    suite: Suite,
    row: Row,
    python: Path,
    settings: Mapping[str, Any],
    expected: Expected,
    drop_one: bool = False,
    cap_seconds: float | None = None,
) -> dict[str, Any] | str:
    """One measured, checked run: its figures, or what was wrong with it."""
    workload, loader = row.workload, row.loader
    n, warm = row.items, workload.warmup(row.items)
    argv = [suite.module or suite.path, "--workload", workload.key, "--loader", loader.key]
    argv += ["--items", str(n), "--warmup-items", str(warm), "--settings", json.dumps(dict(settings))]
    argv += ["--drop-one"] if drop_one else []
    argv += ["--cap-seconds", str(cap_seconds)] if cap_seconds is not None else []
    command = [str(python), str(CHILD), *argv]
    if suite.command is not None:
        wrapped = suite.command(workload, command)
        if isinstance(wrapped, str):
            return wrapped
        measured = measure_child(wrapped, child_env(loader), RUN_TIMEOUT_S)
    elif ZYGOTE is not None and python == Path(sys.executable):
        measured = ZYGOTE.measure(argv, child_env(loader), RUN_TIMEOUT_S)
    else:
        measured = measure_child(command, child_env(loader), RUN_TIMEOUT_S)
    lines = measured.stdout.strip().splitlines()
    if measured.exit_code != 0 or not lines:
        sys.stderr.write(measured.stderr_tail)
        last = [line for line in measured.stderr_tail.splitlines() if line.strip()][-1:] or [""]
        return "; ".join([*measured.problems, f"exit code {measured.exit_code}: {last[0][:200]}"])
    result = json.loads(lines[-1])
    n = result.get("items", n)  # fewer when capped
    problems = list(measured.problems)
    problems += check_delivery(result["tally"], n, expected(n, False))
    problems += ["warm-up: " + p for p in check_delivery(result["warmup"]["tally"], warm, expected(warm, True))]
    problems += _stage_problems(result) + ["warm-up: " + p for p in _stage_problems(result["warmup"])]
    if suite.check is not None:
        problems += suite.check(result)
    if problems:
        return "; ".join(problems)
    row.versions = result["versions"]
    cpu_s = result["cpu_s"] if result["cpu_s"] is not None else measured.cpu_s - result["cpu_before_s"]
    figures = {k: v for k, v in result["extra"].items() if v is None or isinstance(v, int | float)}
    details = {k: v for k, v in result["extra"].items() if k not in figures}
    tally = result["tally"]
    return {
        "items": tally.get("expected", n) * tally["times"],
        "asked": row.items,
        "capped": n < row.items,
        "delivered": tally["count"],
        "wall_s": result["wall_s"],
        "first_s": result["first_s"],
        "cpu_s": cpu_s,
        "peak_pss_bytes": measured.peak_pss_bytes,
        "peak_rss_bytes": measured.peak_rss_bytes,
        "rss_before_bytes": result["rss_before_bytes"],
        "processes": measured.processes,
        "samples": measured.samples,
        **figures,
        **({"details": details} if details else {}),
    }


def run_suite(
    suite: Suite,
    workloads: Sequence[Workload],
    loaders: Sequence[Loader],
    repeats: int,
    quick: bool,
    settings: Mapping[str, Any],
    drop_one: str = "",
    items: int | None = None,
    log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
    cap_seconds: float | None = None,
) -> list[Row]:
    """Every run of the schedule; a row per workload and loader that applies to it.
    ``items``: every workload's epoch, instead of its own (or its quick) size.
    ``cap_seconds``: a run of a cappable workload whose warm-up says its epoch would take
    longer reads fewer items (its entry's label says how many)."""
    rows = {
        (w.key, loader.key): Row(w, loader, items or w.count(quick))
        for w in workloads
        for loader in loaders
        if loader.runs(w.key)
    }
    pythons: dict[str, Path | None] = {}
    for loader in loaders:
        pythons[loader.key], why = interpreter(loader, venvs_of(suite))
        for row in rows.values():
            if row.loader is loader and why:
                row.unavailable = why
    for workload in workloads:
        cannot = suite.command(workload, []) if suite.command is not None else []
        for row in rows.values():
            if row.workload is workload and isinstance(cannot, str):
                row.unavailable = cannot
    expected = {w.key: Expected(w, settings) for w in workloads}
    for slot in suite.schedule(workloads, loaders, repeats):
        row = rows[(slot.workload.key, slot.loader.key)]
        python = pythons[row.loader.key]
        if python is None or row.unavailable:
            continue
        drop = row.loader.key == drop_one
        outcome = run_once(suite, row, python, settings, expected[row.workload.key], drop, cap_seconds)
        if isinstance(outcome, dict):
            row.runs.append(outcome)
            progress = f"{outcome['wall_s']:.2f} s, {outcome['samples']} memory samples"
        else:
            row.failures.append(f"run {slot.repeat + 1}: {outcome}")
            progress = f"FAILED: {outcome[:300]}"
        log(f"  {slot.workload.key} run {slot.repeat + 1}/{repeats}: {row.loader.key} {progress}")
    return list(rows.values())


def metrics_of(row: Row, extra_keys: Sequence[str]) -> dict[str, Metric]:
    """The metrics of a row's checked runs (each from every run's figures)."""
    runs = row.runs
    found: dict[str, list[float]] = {
        "items_per_s": [r["items"] / r["wall_s"] for r in runs],
        "cpu_us_per_item": [r["cpu_s"] / r["items"] * 1e6 for r in runs],
        "peak_pss_mib": [r["peak_pss_bytes"] / MIB for r in runs],
        "peak_rss_mib": [r["peak_rss_bytes"] / MIB for r in runs],
        "rss_before_mib": [r["rss_before_bytes"] / MIB for r in runs],
        "processes": [r["processes"] for r in runs],
        "wall_s": [r["wall_s"] for r in runs],
        "cpu_s": [r["cpu_s"] for r in runs],
        "items": [r["items"] for r in runs],
        "delivered": [r["delivered"] for r in runs],
    }
    firsts = [r["first_s"] * 1e3 for r in runs if r["first_s"] is not None]
    if len(firsts) == len(runs):
        found["first_item_ms"] = firsts
    if row.workload.item_bytes:
        found["mb_per_s"] = [r["items"] * row.workload.item_bytes / 1e6 / r["wall_s"] for r in runs]
        found["cpu_s_per_gb"] = [r["cpu_s"] / (r["items"] * row.workload.item_bytes / 1e9) for r in runs]
    for key in extra_keys:
        values = [r[key] for r in runs if r.get(key) is not None]
        if len(values) == len(runs):
            found[key] = values
    return {key: Metric.of(values) for key, values in found.items()}


def label_of(row: Row) -> str:
    """The loader as the tables name it: with the items its runs read when they were capped."""
    capped = sorted({run["items"] for run in row.runs if run.get("capped")})
    if not capped:
        return row.loader.label
    read = f"{capped[0]:,}" if len(capped) == 1 else f"{capped[0]:,}-{capped[-1]:,}"
    return f"{row.loader.label} (capped: {read} of {row.items:,} items per run)"


def entry_of(row: Row, extra_keys: Sequence[str]) -> Entry:
    if row.unavailable:
        return Entry(row.workload.key, row.loader.key, row.loader.label, "unavailable", reason=row.unavailable)
    if not row.runs:
        return Entry(row.workload.key, row.loader.key, row.loader.label, "failed", failures=row.failures)
    return Entry(
        row.workload.key,
        row.loader.key,
        label_of(row),
        "ok",
        runs=len(row.runs),
        failures=row.failures,
        versions=row.versions,
        metrics=metrics_of(row, extra_keys),
        details=[run["details"] for run in row.runs if "details" in run],
    )


def build_result(
    suite: Suite,
    rows: Sequence[Row],
    command: str,
    settings: Mapping[str, Any],
    versions: Mapping[str, str],
    load: list[float],
    seconds: float,
    date: str | None = None,
) -> Result:
    """The result of a suite's run, its derived metrics and notes included."""
    head, dirty = commit(checkout_of(Path(suite.path)))
    extra_keys = list(suite.metrics)
    result = Result(
        suite=suite.name,
        title=suite.title,
        command=command,
        date=date or now(),
        commit=head,
        dirty=dirty,
        machine=machine(),
        versions=dict(versions),
        settings=dict(settings),
        subject=suite.subject,
        columns=list(suite.columns),
        spread=list(suite.spread),
        ratio=suite.ratio,
        metrics={},  # defined below, once every metric is known
        workloads={
            w.key: {"describe": w.describe, "items": row.items, "unit": w.unit}
            for w, row in ((row.workload, row) for row in rows)
        },
        entries=[entry_of(row, extra_keys) for row in rows],
        load=load,
        seconds=round(seconds, 1),
    )
    if suite.derive is not None:
        suite.derive(result)
    result.metrics = metric_definitions(
        dict.fromkeys([*result.columns, *(k for e in result.entries for k in e.metrics)]), suite.metrics
    )
    if suite.notes is not None:
        result.notes = suite.notes(result)
    return result
