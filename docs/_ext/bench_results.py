"""The one reader of ``benchmarks/results/`` for the site's Performance pages.

The results are files of the benchmarks' harness (``conveyor.tools.bench.harness``), one
per run of a suite, ``benchmarks/results/<suite>/<file>.json``, in the schema
``results/README.md`` documents. They are read, and their tables rendered, by the
harness's own ``results`` and ``tables`` modules: the same code that writes the tables of
``benchmarks/README.md``, so the site's tables and the README's agree. Those two modules
use the standard library only; this module imports nothing of ``benchmarks/`` (the suites
and the runs' modules need torch and the peers' venvs, the site does not).

What a suite's page shows is decided here: the suite's newest result, then every result
of the suite that ``benchmarks/README.md`` names in a block of its own
(``<!-- results: <suite>/<file> -->``), in the README's order.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conveyor.tools.bench.harness import results, tables

REPOSITORY = Path(__file__).resolve().parents[2]
BENCHMARKS = REPOSITORY / "benchmarks"
RESULTS = BENCHMARKS / "results"
README = BENCHMARKS / "README.md"

Result = results.Result
#: The schema the harness reads: a result of another schema is refused, saying so.
SCHEMA: str = results.SCHEMA


@dataclass
class Shown:
    """A result a suite's page shows."""

    path: Path
    result: Any  # harness.results.Result
    newest: bool  # the suite's newest result

    @property
    def name(self) -> str:
        """``<suite>/<file stem>``, as ``benchmarks/README.md`` names it."""
        return f"{self.path.parent.name}/{self.path.stem}"


@dataclass
class Suite:
    """A suite of the benchmarks and the results its page shows, the newest first."""

    name: str  # the folder's, and the result's ``suite``
    shown: list[Shown]
    script: Path | None  # benchmarks/bench_<suite>.py, when the suite has one
    method: str  # how it is measured: the script's docstring

    @property
    def title(self) -> str:
        return self.shown[0].result.title


def read(path: Path) -> Any:
    """One result file; ``ValueError`` naming the file when it does not fit the schema."""
    try:
        return Result.read(path)
    except (ValueError, TypeError, KeyError) as error:
        schema = "benchmarks/results/README.md"
        raise ValueError(f"{path}: not a {SCHEMA} result as {schema} describes it ({error})") from error


def named_in_readme(readme: Path = README) -> list[tuple[str, str | None]]:
    """The README's results blocks in order: (suite, file stem or None for the newest)."""
    if not readme.exists():
        return []
    return [(match["suite"], match["name"]) for match in tables.BLOCK.finditer(readme.read_text(encoding="utf-8"))]


def suites(root: Path = RESULTS, readme: Path = README) -> list[Suite]:
    """Every suite with a result under ``root``, in the order ``readme`` first names them
    (the others after, by name), each with the results its page shows."""
    blocks = named_in_readme(readme)
    folders = {path.name for path in root.iterdir() if path.is_dir() and any(path.glob("*.json"))}
    order = [suite for suite in dict.fromkeys(suite for suite, _ in blocks) if suite in folders]
    order += sorted(folders - set(order))
    found = []
    for name in order:
        newest = results.latest(name, root)
        paths = [newest]
        for suite, stem in blocks:
            if suite == name and stem is not None:
                path = root / suite / f"{stem}.json"
                if not path.exists():
                    raise ValueError(f"{readme} shows the result {suite}/{stem}, which {root} does not hold")
                paths.append(path)
        shown = [Shown(path, read(path), path == newest) for path in dict.fromkeys(paths)]
        script = BENCHMARKS / f"bench_{name}.py"
        found.append(Suite(name, shown, script if script.exists() else None, _docstring(script)))
    return found


def script_of(command: str) -> Path | None:
    """The repository's script a recorded command runs (``benchmarks/bench_x.py``), if any."""
    for word in command.split():
        if word.endswith(".py") and not Path(word).is_absolute():
            return REPOSITORY / word
    return None


def _docstring(script: Path) -> str:
    if not script.exists():
        return ""
    return ast.get_docstring(ast.parse(script.read_text(encoding="utf-8"))) or ""
