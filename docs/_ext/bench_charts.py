"""The Performance pages' charts: a result's metrics per loader, as SVG drawn by matplotlib.

A result gets a chart of its throughput (items/s, or MB/s for bulk data) and one of its
CPU cost (µs per item, or s per GB), each with a panel per workload and a bar per loader
that measured it: the peers' loaders (torch's ``DataLoader``, Grain, torchdata,
webdataset, Hugging Face datasets) grey, the bounds with no loader hatched, conveyor's
loaders blue; a bar's whisker is its runs' min-max. A result with neither metric (a shutdown's
milliseconds, a merge's) charts the time metrics of its table instead.

The figures are drawn on matplotlib's own canvas (no ``pyplot``, no global state), with
the text kept as text and the SVG's ids fixed, so the same result draws the same file.
"""

from __future__ import annotations

import io
import textwrap
from typing import Any

import bench_results

#: Charted first, the first of each group a result has.
THROUGHPUT = ("items_per_s", "mb_per_s")
CPU = ("cpu_us_per_item", "cpu_s_per_gb")
#: Where higher is better; for every other unit charted, lower is.
HIGHER_IS_BETTER = {"items/s", "MB/s"}
#: The units of the time metrics charted when a result has neither throughput nor CPU.
TIME_UNITS = {"ms", "s", "µs"}
BLUE, GREY, BOUND = "#2a7ab0", "#9a9a9a", "#d9d9d9"


def charted(result: Any) -> list[str]:
    """The metrics of ``result`` its page charts, in order."""
    present = {key for entry in result.entries if entry.status == "ok" for key in entry.metrics}
    chosen = [next(key for key in group if key in present) for group in (THROUGHPUT, CPU) if present & set(group)]
    if chosen:
        return chosen
    return [key for key in result.columns if key in present and result.metrics[key]["unit"] in TIME_UNITS]


def title(result: Any, metric: str) -> str:
    definition = result.metrics[metric]
    better = "higher" if definition["unit"] in HIGHER_IS_BETTER else "lower"
    return f"{definition['label']} per loader ({better} is better)"


def _is_bound(entry: Any) -> bool:
    return entry.loader in ("bare", "none") or entry.loader.startswith("bound") or "bound" in entry.label


#: The peers' loaders, by the start of their key or label; any other loader that is not a
#: bound is one of conveyor's (its configurations included: autotune's, distribution's).
PEERS = ("torch", "grain", "nodes", "webdataset", "hf", "hugging face")


def _is_peer(entry: Any) -> bool:
    return entry.loader.lower().startswith(PEERS) or entry.label.lower().startswith(PEERS)


def chart_svg(result: Any, metric: str) -> str:
    """The chart of ``metric`` as SVG text."""
    import matplotlib

    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "conveyor"}):
        draw(result, metric).savefig(buffer, format="svg", metadata={"Date": None})
    return buffer.getvalue()


def draw(result: Any, metric: str) -> Any:
    """The chart of ``metric`` (a matplotlib ``Figure``): a panel per workload with a bar
    per loader that measured it."""
    from matplotlib.backends.backend_svg import FigureCanvasSVG
    from matplotlib.figure import Figure

    panels = []
    for workload in result.workloads:
        entries = [e for e in result.entries if e.workload == workload and e.status == "ok" and metric in e.metrics]
        if entries:
            panels.append((workload, entries))
    bars = sum(len(entries) for _, entries in panels)
    chart = Figure(figsize=(8, 0.34 * bars + 0.62 * len(panels) + 0.5), layout="constrained")
    FigureCanvasSVG(chart)
    axes = chart.subplots(len(panels), 1, squeeze=False, height_ratios=[len(e) + 1.2 for _, e in panels])[:, 0]
    for ax, (workload, entries) in zip(axes, panels, strict=True):
        _panel(ax, workload, entries, metric, result.metrics[metric]["unit"])
    chart.suptitle(title(result, metric), fontsize=10)
    return chart


def _panel(ax: Any, workload: str, entries: list[Any], metric: str, unit: str) -> None:
    from matplotlib.ticker import StrMethodFormatter

    figures = [entry.metrics[metric] for entry in entries]
    values = [m.median for m in figures]
    low = [max(m.median - m.min, 0.0) if m.min is not None else 0.0 for m in figures]
    high = [max(m.max - m.median, 0.0) if m.max is not None else 0.0 for m in figures]
    positions = list(range(len(entries)))
    colours = [GREY if _is_peer(e) else BOUND if _is_bound(e) else BLUE for e in entries]
    bars = ax.barh(positions, values, color=colours, edgecolor="#555555", linewidth=0.4, height=0.7)
    for bar, entry in zip(bars, entries, strict=True):
        bar.set_hatch("//" if _is_bound(entry) else "")
    spread = [i for i in positions if low[i] or high[i]]
    if spread:
        whiskers = [[low[i] for i in spread], [high[i] for i in spread]]
        ax.errorbar([values[i] for i in spread], spread, xerr=whiskers, fmt="none", ecolor="#333333", capsize=2)
    ax.set_yticks(positions, [textwrap.fill(entry.label, 40) for entry in entries], fontsize=8)
    ax.invert_yaxis()
    ax.set_title(workload, loc="left", fontsize=9, fontweight="bold")
    for i, value in enumerate(values):
        where = (max(value, 0.0) + high[i], i)
        text = bench_results.tables.number(value, unit)
        ax.annotate(text, where, xytext=(4, 0), textcoords="offset points", va="center", fontsize=8)
    ax.margins(x=0.22)
    ax.tick_params(axis="x", labelsize=7)
    ax.xaxis.set_major_formatter(StrMethodFormatter("{x:,g}"))
    ax.spines[["top", "right"]].set_visible(False)
