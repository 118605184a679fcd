"""The targets ``bench_peers.py`` reports under its tables, each computed from the run's
own medians and said to be held or missed (reported, never asserted); a target whose rows
did not run, failed or are unavailable says it was not measured, and why.

- issue 18: ``small`` at least 30x torch's items/s, ``arrays`` 20x; ``compute`` at least
  90% of the bare bound's items/s at most 1.10x its CPU per item.
- the bounds, measured: ``images``: conveyor's ``DataLoader2`` at least 90% of
  the items/s of the bound that stacks the batch in shared memory (``bare-copy``: each
  image made, then copied once into its place in the shared batch) at most 1.15x its CPU
  per item, and ahead of every peer; ``conveyor.DataLoader`` at least 4.5x torch's
  ``DataLoader``. ``arrays``: through ``shared_empty``, at least 90% of the fill-in-place
  bound's items/s (``bare-fill``); made with ``np.full``, at least 90% of the one-copy
  bound's (``bare-copy``); a peak summed PSS of at most 64 MiB for both.

Standard library only.
"""

from __future__ import annotations

from conveyor.tools.bench.harness.results import Result

RATE, CPU, PSS = "items_per_s", "cpu_us_per_item", "peak_pss_mib"
#: Issue 18's targets on conveyor's items/s against torch's, per workload.
TORCH_TARGETS = {"small": 30.0, "arrays": 20.0}
#: Issue 18's targets against the bare bound (compute): share of its items/s, CPU ratio.
BARE_RATE_TARGET, BARE_CPU_TARGET = 0.90, 1.10
#: The bounds': share of a bound's items/s, images' CPU ratio, conveyor.DataLoader over
#: torch's, and the arrays' peak summed PSS.
BOUND_RATE_TARGET, IMAGES_CPU_TARGET, DATALOADER_TARGET, PSS_TARGET_MIB = 0.90, 1.15, 4.5, 64.0
PEERS = ("torch", "grain", "nodes")


def _label(result: Result, workload: str, loader: str) -> str:
    entry = result.entry(workload, loader)
    return entry.label if entry is not None else loader


def _unmeasured(result: Result, workload: str, *loaders: str) -> str:
    """Why a target over these rows has no figure ("" when every row has its medians)."""
    for loader in loaders:
        entry = result.entry(workload, loader)
        if entry is None:
            return f"{loader} not run"
        if entry.status != "ok":
            return f"{entry.label} {entry.status}" + (f": {entry.reason}" if entry.reason else "")
    return ""


def _held(ok: bool) -> str:
    return "held" if ok else "missed"


def _share(result: Result, workload: str, ours: str, bound: str, goal: float, what: str) -> str:
    """``ours``' items/s as a share of ``bound``'s, against ``goal``."""
    head = f"target: {workload}: {_label(result, workload, ours)} items/s >= {goal:.0%} of the bound's ({what})"
    why = _unmeasured(result, workload, ours, bound)
    if why:
        return f"{head}: not measured ({why})"
    mine, theirs = result.median(workload, ours, RATE), result.median(workload, bound, RATE)
    assert mine is not None and theirs is not None
    return f"{head}: {mine / theirs:.1%} ({mine:,.0f} vs {theirs:,.0f} items/s), {_held(mine / theirs >= goal)}"


def _cpu(result: Result, workload: str, ours: str, bound: str, goal: float, what: str) -> str:
    """``ours``' CPU per item over ``bound``'s, against ``goal``."""
    head = f"target: {workload}: {_label(result, workload, ours)} CPU per item <= {goal:g}x the bound's ({what})"
    why = _unmeasured(result, workload, ours, bound)
    if why:
        return f"{head}: not measured ({why})"
    mine, theirs = result.median(workload, ours, CPU), result.median(workload, bound, CPU)
    assert mine is not None and theirs is not None
    return f"{head}: {mine / theirs:.2f}x ({mine:,.1f} vs {theirs:,.1f} µs), {_held(mine / theirs <= goal)}"


def _times(result: Result, workload: str, ours: str, theirs: str, goal: float) -> str:
    """``ours``' items/s over ``theirs``', against ``goal``."""
    head = (
        f"target: {workload}: {_label(result, workload, ours)} items/s >= {goal:g}x "
        f"{_label(result, workload, theirs)}'s"
    )
    why = _unmeasured(result, workload, ours, theirs)
    if why:
        return f"{head}: not measured ({why})"
    mine, other = result.median(workload, ours, RATE), result.median(workload, theirs, RATE)
    assert mine is not None and other is not None
    return f"{head}: {mine / other:.2f}x, {_held(mine / other >= goal)}"


def _ahead(result: Result, workload: str, ours: str) -> str:
    """``ours``' items/s over every peer's that ran: ahead of each?"""
    head = f"target: {workload}: {_label(result, workload, ours)} ahead of every peer"
    why = _unmeasured(result, workload, ours)
    if why:
        return f"{head}: not measured ({why})"
    mine = result.median(workload, ours, RATE)
    assert mine is not None
    ratios, missing = [], []
    for peer in PEERS:
        why = _unmeasured(result, workload, peer)
        if why:
            missing.append(why)
            continue
        theirs = result.median(workload, peer, RATE)
        assert theirs is not None
        ratios.append((_label(result, workload, peer), mine / theirs))
    shown = ", ".join(f"{ratio:.2f}x {label}'s" for label, ratio in ratios) or "no peer measured"
    held = _held(bool(ratios) and all(ratio > 1 for _, ratio in ratios)) if not missing else "not measured"
    return f"{head}: {shown}" + (f"; not measured: {'; '.join(missing)}" if missing else "") + f", {held}"


def _pss(result: Result, workload: str, ours: str, goal: float) -> str:
    head = f"target: {workload}: {_label(result, workload, ours)} peak summed PSS <= {goal:g} MiB"
    why = _unmeasured(result, workload, ours)
    if why:
        return f"{head}: not measured ({why})"
    peak = result.median(workload, ours, PSS)
    assert peak is not None
    return f"{head}: {peak:,.1f} MiB, {_held(peak <= goal)}"


def _peers(result: Result) -> list[str]:
    lines, compute = [], []
    if "compute" in result.workloads:
        why = _unmeasured(result, "compute", "conveyor", "bare")
        if why:
            lines.append(f"conveyor vs the bare bound: not measured ({why})")
        else:
            rate, bare_rate = result.median("compute", "conveyor", RATE), result.median("compute", "bare", RATE)
            cpu, bare_cpu = result.median("compute", "conveyor", CPU), result.median("compute", "bare", CPU)
            assert rate and bare_rate and cpu and bare_cpu
            share, ratio = rate / bare_rate, cpu / bare_cpu
            lines.append(
                f"conveyor vs the bare bound: {share:.1%} of its items/s (conveyor {rate:,.0f}, bare "
                f"{bare_rate:,.0f} items/s; medians); CPU per item {ratio:.2f}x the bare work's ({cpu:,.1f} "
                f"vs {bare_cpu:,.1f} µs)"
            )
            compute = [
                f"target: compute: conveyor items/s >= {BARE_RATE_TARGET:.0%} of the bare bound's: {share:.1%}, "
                f"{_held(share >= BARE_RATE_TARGET)}",
                f"target: compute: conveyor CPU per item <= {BARE_CPU_TARGET:g}x the bare work's: {ratio:.2f}x, "
                f"{_held(ratio <= BARE_CPU_TARGET)}",
            ]
    for workload, goal in TORCH_TARGETS.items():
        ours, theirs = result.median(workload, "conveyor", RATE), result.median(workload, "torch", RATE)
        if ours and theirs:
            held = _held(ours / theirs >= goal)
            lines.append(f"target: {workload}: conveyor items/s >= {goal:g}x torch's: {ours / theirs:.2f}x, {held}")
    return lines + compute


def _bounds(result: Result) -> list[str]:
    lines = []
    if "images" in result.workloads:
        stacked = "bare-copy: each image made, then stacked into the batch in shared memory"
        lines.append(_share(result, "images", "conveyor", "bare-copy", BOUND_RATE_TARGET, stacked))
        lines.append(_cpu(result, "images", "conveyor", "bare-copy", IMAGES_CPU_TARGET, stacked))
        lines.append(_ahead(result, "images", "conveyor"))
        lines.append(_times(result, "images", "conveyor-dl", "torch", DATALOADER_TARGET))
    if "arrays" in result.workloads:
        fill, copy = "bare-fill: filled in place in shared memory", "bare-copy: np.full, one copy into shared memory"
        lines.append(_share(result, "arrays", "conveyor-shared", "bare-fill", BOUND_RATE_TARGET, fill))
        lines.append(_share(result, "arrays", "conveyor", "bare-copy", BOUND_RATE_TARGET, copy))
        lines.append(_pss(result, "arrays", "conveyor-shared", PSS_TARGET_MIB))
        lines.append(_pss(result, "arrays", "conveyor", PSS_TARGET_MIB))
    return lines


def targets(result: Result) -> list[str]:
    """The notes of a ``bench_peers`` result: conveyor against the bare bound on
    ``compute``, then every target this run's workloads have, held, missed or not measured."""
    return _peers(result) + _bounds(result)
