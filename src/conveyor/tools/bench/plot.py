"""``--plot``: throughput against ``num_workers``, one panel per workload, one line per loader.

matplotlib is optional (``pip install 'conveyor[bench]'``) and imported only here, when a
plot is asked for. The figure is drawn on matplotlib's Agg canvas directly, not through
``pyplot``, so that no global backend or figure state of the calling process changes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

from conveyor.tools.bench.errors import BenchError
from conveyor.tools.bench.harness.results import Result

#: The same colour for a loader in every panel.
COLOURS = {"conveyor": "tab:blue", "torch": "tab:orange", "torchdata": "tab:green"}
MARKERS = {"conveyor": "o", "torch": "s", "torchdata": "^"}


def require_matplotlib() -> None:
    """Raise :class:`BenchError` now if matplotlib is missing: better than after minutes of runs."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as err:
        raise BenchError(f"--plot needs matplotlib ({err}); install it with: pip install 'conveyor[bench]'") from err


def plot_throughput(
    results: Mapping[int, Result], path: str | Path, title: str = "conveyor bench", note: str = ""
) -> Path:
    """Draw items/s (log scale) against ``num_workers`` (the keys of ``results``) for every
    loader and workload into the PNG ``path``; loaders without numbers at a worker count
    have no point there, and a panel names the loaders that have none at all. ``note``
    (how the numbers were measured) goes into a spare panel, or under the title."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    entries = [(count, e) for count, result in sorted(results.items()) for e in result.entries]
    workloads = list(dict.fromkeys(e.workload for _, e in entries))
    loaders = list(dict.fromkeys(e.loader for _, e in entries))
    counts = sorted(results)
    if not workloads:
        raise BenchError("nothing to plot: no results")
    columns = min(3, len(workloads))
    rows = math.ceil(len(workloads) / columns)
    figure = Figure(figsize=(5.2 * columns, 3.9 * rows + 0.8), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, columns, squeeze=False).flatten()
    for ax, workload in zip(axes, workloads, strict=False):
        missing = []
        for key in loaders:
            mine = [(count, e) for count, e in entries if e.workload == workload and e.loader == key]
            points = [(count, e.metrics["items_per_s"].median) for count, e in mine if e.status == "ok"]
            name = mine[0][1].label.split(" (capped")[0]
            if not points:
                missing.append(f"{name}: {mine[0][1].status}")
                continue
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, marker=MARKERS.get(key, "o"), color=COLOURS.get(key), label=name)
        unit = "images/s" if workload == "demo" else "items/s"
        ax.set_title(workload)
        ax.set_xlabel("num_workers")
        ax.set_ylabel(f"{unit} (log)")
        ax.set_xticks(counts)
        if ax.lines:
            ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        if missing:
            ax.text(0.02, 0.02, "\n".join(missing), transform=ax.transAxes, fontsize=8, va="bottom", color="0.3")
    spare = axes[len(workloads) :]
    for ax in spare:
        ax.set_axis_off()
    if note and len(spare):
        spare[0].text(0.0, 1.0, note, transform=spare[0].transAxes, fontsize=9, va="top", wrap=True)
    elif note:
        title = f"{title}\n{note}"
    handles, labels = [], []
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    if handles:
        figure.legend(handles, labels, loc="outside lower center", ncols=len(labels))
    figure.suptitle(title)
    path = Path(path)
    try:
        figure.savefig(path, dpi=100, bbox_inches="tight")  # the title and legend whole
    except OSError as err:
        raise BenchError(f"cannot write the plot to {str(path)!r}: {err}") from err
    return path
