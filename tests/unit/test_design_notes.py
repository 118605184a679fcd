"""docs/DESIGN.md names only what exists: every module it names (a path under
``src/conveyor``, a path inside a layer such as ``workers/parent/pool.py``, or a dotted
``conveyor.x.y`` name, whose last parts may name a top-level definition of that module),
every test, benchmark and example file it cites, and a layer section for every layer the
import contracts in pyproject.toml declare, in their order."""

from __future__ import annotations

import ast
import re
import tomllib
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DESIGN = REPO / "docs" / "DESIGN.md"
SRC = REPO / "src"
PACKAGE = SRC / "conveyor"

#: ``src/conveyor/a/b.py``, or a path that starts at one of the package's folders.
_FOLDERS = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists())
_PATH = re.compile(r"(?<![\w/.])((?:src/conveyor/|(?:" + "|".join(_FOLDERS) + r")/)[\w/]+\.pyi?)\b")
#: A repository file outside the package: a test, a benchmark, an example.
_REPO_FILE = re.compile(r"(?<![\w/.])((?:tests|benchmarks|examples|docs)/[\w/.-]+\.(?:py|md|sh))\b")
#: ``conveyor.a.b.c``.
_DOTTED = re.compile(r"(?<![\w.\"'])(conveyor(?:\.\w+)+)(?![\w/\"'])")
#: `` `module.Name` ``, a module of the package by its last part and a name in it.
_SHORT = re.compile(r"`([a-z_]+)\.(?!pyi?`)([A-Za-z_]\w*)")


def _text() -> str:
    return DESIGN.read_text(encoding="utf-8")


def _package_path(path: str) -> Path:
    return REPO / path if path.startswith("src/") else PACKAGE / path


def test_every_module_path_exists():
    missing = sorted({path for path in _PATH.findall(_text()) if not _package_path(path).is_file()})
    assert not missing, f"docs/DESIGN.md names modules that do not exist: {missing}"


def test_every_repository_file_exists():
    missing = sorted({path for path in _REPO_FILE.findall(_text()) if not (REPO / path).is_file()})
    assert not missing, f"docs/DESIGN.md cites files that do not exist: {missing}"


def _module_file(parts: list[str]) -> Path | None:
    base = SRC.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@cache
def _top_level_names(path: Path) -> frozenset[str]:
    """What a module defines, imports or exports (``__all__``) at its top level, in
    ``if`` and ``try`` blocks there too."""
    names: set[str] = set()
    body = list(ast.parse(path.read_text(encoding="utf-8")).body)
    while body:
        node = body.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found = {n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)}
            names |= found
            if "__all__" in found and node.value is not None:
                names.update(c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.If | ast.Try):
            body += node.body + node.orelse + getattr(node, "handlers", []) + getattr(node, "finalbody", [])
        elif isinstance(node, ast.ExceptHandler):
            body += node.body
    return frozenset(str(name) for name in names)


def _resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a module of the package, or a module and a name it defines."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        module = _module_file(parts[:end])
        if module is None:
            continue
        rest = parts[end:]
        return not rest or rest[0] in _top_level_names(module)
    return False


def test_every_dotted_module_resolves():
    named = {name.rstrip(".") for name in _DOTTED.findall(_text())}
    missing = sorted(name for name in named if not _resolves(name))
    assert not missing, f"docs/DESIGN.md names modules (or their names) that do not exist: {missing}"


def _layer_contract() -> list[list[str]]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    for contract in config["tool"]["importlinter"]["contracts"]:
        if contract["type"] == "layers" and "containers" not in contract:
            return [[name.strip() for name in layer.split("|")] for layer in contract["layers"]]
    pytest.fail("pyproject.toml declares no layers contract for conveyor's layers")


def test_the_layer_sections_follow_the_contract():
    """Every layer of the contract has a ``## Layer:`` section (one per folder; the
    public faces may share one), each named once, bottom to top in the contract's order."""
    titles = re.findall(r"^## Layer: (.+)$", _text(), flags=re.MULTILINE)
    contract = _layer_contract()
    row_of = {name.removeprefix("conveyor."): row for row, layer in enumerate(contract) for name in layer}
    named = [part.strip() for title in titles for part in title.split("|")]
    assert sorted(named) == sorted(row_of), f"'## Layer:' sections {titles} are not pyproject.toml's layers"
    rows = [row_of[name] for name in named]
    assert rows == sorted(rows, reverse=True), f"'## Layer:' sections {titles} are not bottom to top"


def test_the_direction_of_imports_matches_the_contract():
    """The diagram in "The direction of imports" lists the contract's layers, top to bottom."""
    text = _text()
    section = text.split("## The direction of imports", 1)[1].split("\n## ", 1)[0]
    diagram = section.split("```text", 1)[1].split("```", 1)[0]
    rows = [line.split("  ", 1)[0].strip() for line in diagram.strip().splitlines() if line.strip()]
    layers = [row for row in rows if row and not row.startswith(("^", "|", "v"))]
    expected = [" | ".join(name.removeprefix("conveyor.") for name in layer) for layer in _layer_contract()]
    assert layers == expected, f"the diagram's layers {layers} are not pyproject.toml's {expected}"


def test_every_module_and_name_resolves():
    """`` `passes.PipeToOpen` ``, `` `intake.settle_sharding` ``: where the first part is
    the last part of one of the package's modules, the second is a name one of them has."""
    modules: dict[str, list[Path]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.stem != "__init__":  # a package's name is checked as a path or a dotted name
            modules.setdefault(path.stem, []).append(path)
    missing = sorted(
        {
            f"{module}.{name}"
            for module, name in _SHORT.findall(_text())
            if module in modules and not any(name in _top_level_names(path) for path in modules[module])
        }
    )
    assert not missing, f"docs/DESIGN.md names what its modules do not have: {missing}"
