"""The Performance pages, generated from ``benchmarks/results/*.json`` at every build.

Each results file becomes ``docs/performance/results/<file>.rst``: the machine, the
versions, the command that reproduces it, the settings, how it is measured (the
benchmark script's docstring), the results table and matplotlib charts (SVG, inline).
A new run of a benchmark writes its JSON file again; the next build shows it, with no
page edited by hand. What a file holds is read by :mod:`bench_results` alone.
"""

from __future__ import annotations

import base64
import io
import re
from pathlib import Path
from typing import Any

import bench_results
from sphinx.application import Sphinx

OUT = Path(__file__).resolve().parent.parent / "performance" / "results"


def chart_svg(title: str, values: list[tuple[str, float]]) -> str:
    """A horizontal bar chart of ``values`` as SVG text (text kept as text)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    pyplot.rcParams["svg.fonttype"] = "none"
    pyplot.rcParams["svg.hashsalt"] = "conveyor"  # the same input draws the same file
    figure, axes = pyplot.subplots(figsize=(7.5, 0.45 * len(values) + 1.2))
    labels = [label for label, _ in values]
    numbers = [value for _, value in values]
    colours = ["#2a7ab0" if label.startswith("conveyor") else "#9a9a9a" for label in labels]
    axes.barh(range(len(values)), numbers, color=colours)
    axes.set_yticks(range(len(values)), labels)
    axes.invert_yaxis()
    axes.set_title(title, fontsize=10)
    for index, value in enumerate(numbers):
        axes.annotate(
            bench_results.number(value), (value, index), xytext=(3, 0), textcoords="offset points", va="center"
        )
    axes.margins(x=0.15)
    axes.spines[["top", "right"]].set_visible(False)
    figure.tight_layout()
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", metadata={"Date": None})
    pyplot.close(figure)
    return buffer.getvalue()


def page(run: bench_results.Run) -> str:
    """The reStructuredText page of one results file."""
    title = f"{run.title} ({run.name}.json)"
    lines = [title, "=" * len(title), ""]
    lines += [f"Measured on {run.date[:10]} at commit ``{run.commit[:10]}``. Reproduce it with:", ""]
    lines += [".. code-block:: bash", "", f"   {run.command}", ""]
    header, body = run.table()
    lines += ["Results", "-------", ""]
    lines += _list_table(header, body)
    for metric, chart_title in run.charts:
        svg = chart_svg(chart_title, run.chart_values(metric))
        data = base64.b64encode(svg.encode("utf-8")).decode("ascii")
        lines += [".. raw:: html", ""]
        image = f'<img alt="{chart_title}" src="data:image/svg+xml;base64,{data}"/>'
        lines += [f'   <figure class="bench-chart">{image}</figure>', ""]
    lines += ["The machine", "-----------", ""]
    lines += _field_table({**run.machine, **{f"{k} version": v for k, v in run.versions.items()}})
    lines += ["Settings", "--------", ""]
    lines += _field_table(run.settings)
    if run.method:
        lines += ["How it is measured", "------------------", ""]
        lines += _method(run.method)
    return "\n".join(lines) + "\n"


def _list_table(header: list[str], body: list[list[str]]) -> list[str]:
    lines = [".. list-table::", "   :header-rows: 1", ""]
    for row in [header, *body]:
        lines.append(f"   * - {row[0]}")
        lines += [f"     - {cell}" if cell else "     -" for cell in row[1:]]
    return [*lines, ""]


def _field_table(values: dict[str, Any]) -> list[str]:
    return _plain([[key.replace("_", " "), _value(value)] for key, value in values.items()])


def _plain(rows: list[list[str]]) -> list[str]:
    lines = [".. list-table::", "   :widths: 30 70", ""]
    for key, value in rows:
        lines += [f"   * - {key}", f"     - {value}" if value else "     -"]
    return [*lines, ""]


def _value(value: Any) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return bench_results.number(value)
    return f"``{value}``" if str(value) else ""


_COMMAND = re.compile(r"^\s+(python|bash|\.venv)\b")


def _method(text: str) -> list[str]:
    """The benchmark script's docstring as reStructuredText: its indented command lines
    as a code block."""
    lines: list[str] = []
    block: list[str] = []
    for line in text.splitlines():
        if _COMMAND.match(line) or (block and line.startswith("        ")):
            block.append(line)
            continue
        if block:
            lines += [".. code-block:: bash", "", *("   " + b.strip() for b in block), ""]
            block = []
        lines.append(line)
    if block:
        lines += [".. code-block:: bash", "", *("   " + b.strip() for b in block), ""]
    return [*lines, ""]


def generate(results: Path = bench_results.RESULTS, out: Path = OUT) -> list[Path]:
    """Write a page per results file into ``out`` (files unchanged are not rewritten, so
    Sphinx rebuilds only what changed) and remove pages whose file is gone."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for run in bench_results.load_runs(results):
        target = out / f"{run.name}.rst"
        text = page(run)
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            target.write_text(text, encoding="utf-8")
        written.append(target)
    for stale in set(out.glob("*.rst")) - set(written):
        stale.unlink()
    return written


def _on_builder_inited(app: Sphinx) -> None:
    generate()


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("builder-inited", _on_builder_inited)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
