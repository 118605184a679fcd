"""Running the benchmark: every loader on every workload, for each ``num_workers``.

For one workload and one ``num_workers``, each loader first makes one small warm-up run
(imports, first-call caches, page faults are not what is compared), in turn; then the
timed runs alternate between the loaders (conveyor, torch, torchdata, conveyor, ...), so
that a slow phase of a shared machine hits all of them rather than one. A loader whose
full run would take longer than ``cap_seconds`` (estimated from its warm-up) reads fewer
items per run and says so.

:func:`run_benchmark` returns plain results and prints nothing on stdout, so that other
front ends (the ``benchmarks/`` scripts) can drive it and format the results their way.
"""

from __future__ import annotations

import statistics
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TextIO

from conveyor.tools.bench.errors import CheckFailed
from conveyor.tools.bench.loaders import Loader, available_loaders, torch_problem
from conveyor.tools.bench.measure import Run, measure_once
from conveyor.tools.bench.workloads import MIB, Prepared, Workload

#: Error texts longer than this are shortened in the table (stderr has the whole traceback).
MAX_REASON = 110


@dataclass
class Result:
    """One loader on one workload at one ``num_workers``: its runs, or why it has none."""

    workload: Workload
    workers: int
    loader: Loader
    items: int  # per run (fewer than asked when capped)
    runs: list[Run] = field(default_factory=list)
    unavailable: str = ""  # "unavailable: <reason>" for the loader or the whole workload
    error: str = ""  # "failed (<when>): <reason>"
    capped: str = ""  # a note when the runs read fewer items than asked

    @property
    def ok(self) -> bool:
        return not self.unavailable and not self.error and bool(self.runs)

    @property
    def status(self) -> str:
        """The row's check cell: ``ok (N runs)``, or why there are no numbers."""
        if self.unavailable:
            return self.unavailable
        if self.error:
            return self.error if len(self.error) <= MAX_REASON else self.error[: MAX_REASON - 3] + "..."
        return f"ok ({len(self.runs)} run{'s' if len(self.runs) != 1 else ''})"

    def median(self, what: str) -> float:
        """The median of a :class:`~conveyor.tools.bench.measure.Run` field over the runs."""
        return statistics.median(getattr(run, what) for run in self.runs)

    @property
    def samples(self) -> int:
        """Samples per run, as the runs counted them (the demo's images)."""
        return self.runs[0].items

    @property
    def rate(self) -> float:
        """Items per second: items per run over the median wall time."""
        return self.samples / self.median("wall_s")

    @property
    def mib_rate(self) -> float | None:
        """MiB per second, or None for workloads that are not bulk data."""
        return self.rate * self.workload.bytes_per_item / MIB if self.workload.bytes_per_item else None

    @property
    def cpu_per_item(self) -> float:
        """Median CPU seconds per run over the items per run."""
        return self.median("cpu_s") / self.samples

    @property
    def spread(self) -> float:
        """(max - min) / median of the runs' items/s: the noise of the measurement."""
        rates = [run.items / run.wall_s for run in self.runs]
        return (max(rates) - min(rates)) / statistics.median(rates)

    @property
    def fingerprints(self) -> list[str]:
        """The distinct check fingerprints of the runs (one when they agree)."""
        return list(dict.fromkeys(run.fingerprint for run in self.runs))


def _reason(err: BaseException) -> str:
    text = f"check: {err}" if isinstance(err, CheckFailed) else f"{type(err).__name__}: {err}"
    return " ".join(text.split())


def _fail(result: Result, err: BaseException, when: str, errors: TextIO) -> None:
    result.error = f"failed ({when}): {_reason(err)}"
    print(f"conveyor bench: {result.loader.name} on {result.workload.name}, {when}:", file=errors)
    traceback.print_exception(err, file=errors)


def _significant(n: int, digits: int = 2) -> int:
    """``n`` rounded down to ``digits`` significant digits (96,000 rather than 96,341)."""
    scale = 10 ** max(0, len(str(n)) - digits)
    return max(1, n // scale * scale)


def warm_up(result: Result, prepared: Prepared, cap_seconds: float, errors: TextIO) -> None:
    """One small run; caps ``result.items`` when a full run would take over ``cap_seconds``."""
    workload, n, workers = result.workload, result.items, result.workers
    if workload.resizable:
        # Big enough that the per-item estimate is not all start-up noise, small enough to be cheap.
        n_warm = min(n, max(8 * max(workers, 1), n // 20))
        prepared = workload.prepare(n_warm)
    else:
        n_warm = n
    try:
        warm = measure_once(result.loader, prepared, workers)
    except Exception as err:  # any failure of the loader is reported in its row, not raised
        _fail(result, err, "warm-up", errors)
        return
    if not workload.resizable:
        return
    # Start-up and shutdown once, the steady part per item.
    per_item = (warm.last_s - warm.first_s) / max(1, n_warm - 1)
    estimate = warm.wall_s + per_item * (n - n_warm)
    if estimate > cap_seconds and per_item > 0:
        fixed = warm.wall_s - per_item * (n_warm - 1)
        result.items = _significant(max(n_warm, int((cap_seconds - fixed) / per_item)))
        result.capped = (
            f"{result.loader.name}: capped at {result.items:,} of {n:,} items per run (a full run would take "
            f"~{estimate:.0f} s, over the cap of {cap_seconds:g} s); its rates and CPU per item are over the capped "
            "runs, whose fixed start-up and shutdown cost is spread over fewer items"
        )


def run_workload(
    workload: Workload,
    items: int,
    workers: int,
    repeats: int,
    loaders: Sequence[Loader],
    cap_seconds: float,
    errors: TextIO,
) -> list[Result]:
    """Every loader ``repeats`` times on ``items`` items of ``workload`` with ``workers``
    workers, after one warm-up each, alternating between loaders."""
    results = [Result(workload, workers, loader, items, unavailable=loader.unavailable) for loader in loaders]
    problem = torch_problem() if workload.needs_torch else ""
    if problem:
        for result in results:
            result.unavailable = f"unavailable: the {workload.name} workload needs torch ({problem})"
        return results
    try:
        prepared = workload.prepare(items)
    except Exception as err:  # e.g. an unusable demo data dir: every row says so
        for result in results:
            _fail(result, err, "prepare", errors)
        return results
    runnable = [r for r in results if not r.unavailable]
    for result in runnable:
        result.items = prepared.items
        warm_up(result, prepared, cap_seconds, errors)
    for repeat in range(repeats):
        for result in runnable:
            if result.error:
                continue
            sized = prepared if result.items == prepared.items else workload.prepare(result.items)
            try:
                result.runs.append(measure_once(result.loader, sized, workers))
            except Exception as err:  # reported in the row; the other loaders go on
                _fail(result, err, f"run {repeat + 1}", errors)
    return results


def run_benchmark(
    workloads: Sequence[Workload],
    workers: Sequence[int],
    repeats: int,
    items: Mapping[str, int],
    *,
    loaders: Sequence[Loader] | None = None,
    cap_seconds: float = 60.0,
    log: Callable[[str], None] | None = None,
    errors: TextIO | None = None,
) -> list[Result]:
    """Run ``workloads`` (``items[name]`` items per run) for each ``num_workers`` in
    ``workers``, ``repeats`` timed runs per loader (default: :func:`available_loaders`).
    ``log`` gets a line as each workload starts; tracebacks of failures go to ``errors``
    (default stderr). Returns one :class:`Result` per workload, worker count and loader."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if any(w < 0 for w in workers):
        raise ValueError(f"worker counts must be >= 0, got {list(workers)}")
    loaders = list(loaders) if loaders is not None else available_loaders()
    errors = errors if errors is not None else sys.stderr
    results: list[Result] = []
    for count in workers:
        for workload in workloads:
            if log is not None:
                log(f"{workload.name}: {items[workload.name]:,} items, {count} workers, {repeats} run(s) per loader")
            results.extend(run_workload(workload, items[workload.name], count, repeats, loaders, cap_seconds, errors))
    return results
