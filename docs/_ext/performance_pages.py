"""The Performance pages, generated from ``benchmarks/results/`` at every build.

Each suite of the benchmarks becomes ``docs/performance/results/<suite>.md``: for each
result it shows (:mod:`bench_results` chooses them: the newest, then those
``benchmarks/README.md`` shows), the tables as the README has them (rendered by the
harness's ``harness.tables``), the command that reproduces it, the date, the commit, the
machine, the versions and the settings, and the charts (:mod:`bench_charts`); then how the
suite measures (its script's docstring). ``suites.txt`` beside them holds the index's
list of suites (``docs/performance/index.md`` includes it). A new run saved by a suite is
shown at the next build, with no page edited by hand.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import bench_charts
import bench_results
from sphinx.application import Sphinx

OUT = Path(__file__).resolve().parent.parent / "performance" / "results"
#: The index's list of suites, included by ``docs/performance/index.md``.
SUITES_FILE = "suites.txt"
GENERATED = "% Generated from benchmarks/results/ by docs/_ext/performance_pages.py at every build: do not edit."


def chart_html(result: Any, metric: str) -> str:
    """The chart of ``metric`` as an inline image (no file to keep beside the page)."""
    svg = bench_charts.chart_svg(result, metric)
    data = base64.b64encode(svg.encode("utf-8")).decode("ascii")
    alt = bench_charts.title(result, metric).replace('"', "&quot;")
    return f'<figure class="bench-chart"><img alt="{alt}" src="data:image/svg+xml;base64,{data}"/></figure>'


def page(suite: bench_results.Suite) -> str:
    """The MyST Markdown page of a suite."""
    script = f"`benchmarks/{suite.script.name}`" if suite.script else "no script of the harness"
    lines = [GENERATED, "", f"# {suite.title}", ""]
    lines += [
        f"The suite `{suite.name}` ({script}). Its newest result comes first"
        + (", then the earlier ones `benchmarks/README.md` shows." if len(suite.shown) > 1 else "."),
        "How every run is measured: {doc}`../index`.",
        "",
    ]
    for shown in suite.shown:
        lines += _result(shown)
    if suite.method:
        lines += ["## How this suite measures", "", f"From the docstring of `benchmarks/{suite.script.name}`:", ""]
        lines += ["```{eval-rst}", *_method(suite.method), "```", ""]
    return "\n".join(lines)


def _result(shown: bench_results.Shown) -> list[str]:
    result = shown.result
    commit = (result.commit or "unrecorded commit")[:7]
    heading = f"{result.date[:10]}, conveyor at {commit}" + (" (the newest)" if shown.newest else "")
    lines = [f"## {heading}", "", bench_results.tables.render(result), ""]
    for metric in bench_charts.charted(result):
        lines += ["```{raw} html", chart_html(result, metric), "```", ""]
    lines += ["Reproduce it from the repository's root:", "", "```bash", result.command, "```", ""]
    script = bench_results.script_of(result.command)
    if script is not None and not script.exists():
        lines += [f"`{script.relative_to(bench_results.REPOSITORY)}` no longer exists: the notes above say what"]
        lines += ["runs the same measurement today.", ""]
    lines += [*(f"- {item}" for item in _details(shown)), ""]
    return lines


def _details(shown: bench_results.Shown) -> list[str]:
    """Where, when and how the result was measured, every field of it."""
    result = shown.result
    machine = result.machine
    commit = f"`{result.commit}`" if result.commit else "not recorded"
    if result.dirty:
        commit += ", with `src/` or `benchmarks/` modified"
    where = [
        machine.get("system"),
        machine.get("arch"),
        machine.get("cpu"),
        f"{machine['cpus']} CPUs" if machine.get("cpus") else None,
        f"Python {machine['python']}" if machine.get("python") else None,
        f"start method {machine['start_method']}" if machine.get("start_method") else None,
    ]
    details = [
        f"**Date**: {result.date}",
        f"**Commit**: {commit}",
        f"**Machine**: {', '.join(str(part) for part in where if part) or 'not recorded'}",
        f"**Versions**: {_versions(result)}",
        f"**Settings**: {', '.join(f'{k} `{_value(v)}`' for k, v in result.settings.items()) or 'none recorded'}",
    ]
    if len(result.load) == 2:
        details.append(f"**Load average**: {result.load[0]:.2f} at the start, {result.load[1]:.2f} at the end")
    if result.seconds is not None:
        details.append(f"**The whole run took**: {result.seconds:,.0f} s")
    details.append(f"**Figures**: {result.source}")
    details.append(f"**Result file**: `benchmarks/results/{shown.name}.json`")
    return details


def _versions(result: Any) -> str:
    found: dict[str, set[str]] = {name: {version} for name, version in result.versions.items()}
    for entry in result.entries:
        for name, version in entry.versions.items():
            found.setdefault(name, set()).add(version)
    return ", ".join(f"{name} {' / '.join(sorted(found[name]))}" for name in sorted(found)) or "not recorded"


def _value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


_COMMAND = re.compile(r"^\s+(python|bash|\.venv)\b")


def _method(text: str) -> list[str]:
    """A suite's docstring as reStructuredText: its indented command lines as a code block."""
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
    return lines


def suites_list(suites: list[bench_results.Suite]) -> str:
    """The index's list of suites: a table of each one's newest result, and the toctree."""
    rows = ["| results | suite | newest run |", "|---|---|---|"]
    for suite in suites:
        newest = suite.shown[0].result
        script = f"`{suite.script.name}`" if suite.script else f"`{suite.name}`"
        commit = f", conveyor at `{newest.commit[:7]}`" if newest.commit else ""
        rows.append(f"| {{doc}}`results/{suite.name}` | {script} | {newest.date[:10]}{commit} |")
    toctree = ["```{toctree}", ":hidden:", "", *(f"results/{suite.name}" for suite in suites), "```"]
    return "\n".join([*rows, "", *toctree, ""])


def generate(results: Path = bench_results.RESULTS, out: Path = OUT, readme: Path = bench_results.README) -> list[Path]:
    """Write a page per suite into ``out``, and the index's list of suites (files unchanged
    are not rewritten), and remove the pages of suites that are gone."""
    out.mkdir(parents=True, exist_ok=True)
    suites = bench_results.suites(results, readme)
    texts = {out / f"{suite.name}.md": page(suite) for suite in suites}
    texts[out / SUITES_FILE] = suites_list(suites)
    for target, text in texts.items():
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            target.write_text(text, encoding="utf-8")
    for stale in (set(out.glob("*.md")) | set(out.glob("*.rst"))) - set(texts):
        stale.unlink()
    return list(texts)


def _on_builder_inited(app: Sphinx) -> None:
    generate()


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("builder-inited", _on_builder_inited)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
