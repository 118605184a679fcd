"""Imports go one way: no module imports a module that imports it back, however far round
(type-only imports under ``if TYPE_CHECKING:`` and imports inside functions count too).

Two checks: import-linter's contracts in ``pyproject.toml`` (``[tool.importlinter]``: no
cycle among the modules of any package nor between subpackages, and the layers as
folders, docs/DESIGN.md's "Layers"), and a walk of ``src/conveyor`` with :mod:`ast` that needs nothing but
Python and names the modules of any cycle it finds.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import conveyor

PACKAGE_DIR = Path(conveyor.__file__).parent
SRC_DIR = PACKAGE_DIR.parent
REPO = Path(__file__).resolve().parents[2]


def lint_imports(config_dir: Path, package_parent: Path) -> subprocess.CompletedProcess[str]:
    """Run ``lint-imports`` on the ``pyproject.toml`` in ``config_dir`` (no cache written)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(package_parent), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "from importlinter.cli import lint_imports_command; lint_imports_command()",
            "--no-cache",
            "pyproject.toml",
        ],
        cwd=config_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_import_linter_contracts_hold():
    result = lint_imports(REPO, SRC_DIR)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert "0 broken" in result.stdout


def test_the_import_linter_contracts_catch_a_cycle(tmp_path: Path):
    """The same contract types on a small package with a cycle through a type-only
    import: import-linter must refuse it (a contract that checks nothing passes too)."""
    package = tmp_path / "src" / "cyclic"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "low.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cyclic.high import High\n"
    )
    (package / "high.py").write_text("from cyclic.low import TYPE_CHECKING\nclass High: ...\n")
    (tmp_path / "pyproject.toml").write_text(
        textwrap.dedent(
            """
            [tool.importlinter]
            root_package = "cyclic"

            [[tool.importlinter.contracts]]
            name = "no cycles"
            type = "acyclic_siblings"
            ancestors = ["cyclic"]
            """
        )
    )
    result = lint_imports(tmp_path, tmp_path / "src")
    assert result.returncode != 0, result.stdout
    assert "BROKEN" in result.stdout


# --- the same rule, in plain Python -------------------------------------------------------


def module_names(package_dir: Path) -> dict[str, Path]:
    """Every module of the package at ``package_dir`` by dotted name (a package by its own)."""
    found = {}
    for path in package_dir.rglob("*.py"):
        parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that module ``name`` imports anywhere in its code (at the
    top, in functions, under ``if TYPE_CHECKING:``), as dotted names."""
    is_package = path.name == "__init__.py"
    here = name.split(".") if is_package else name.split(".")[:-1]

    def known(dotted: str) -> str | None:
        while dotted and dotted not in modules:  # ``import a.b.c`` of a name inside a.b
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(filter(None, (known(alias.name) for alias in node.names)))
        elif isinstance(node, ast.ImportFrom):
            # ``from . import x`` (level 1) is relative to this module's package, ``..`` to its parent.
            package = here[: len(here) - node.level + 1] if node.level else []
            base = ".".join([*package, node.module or ""]).strip(".")
            for alias in node.names:
                # ``from a import b``: b is module a.b, or a name defined in module a.
                target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else known(base)
                if target is not None:
                    found.add(target)
    found.discard(name)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` with more than one module (Tarjan's,
    iterative): each is a set of modules that import each other, however far round."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    modules = module_names(package_dir)
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def test_no_module_imports_a_module_that_imports_it_back():
    graph = import_graph(PACKAGE_DIR)
    assert len(graph) > 100  # the walk found the package
    described = [
        " <-> ".join(component)
        + ": "
        + "; ".join(f"{a} -> {b}" for a in component for b in sorted(graph[a]) if b in component)
        for component in cycles(graph)
    ]
    assert not described, "import cycles:\n" + "\n".join(described)


def test_the_walk_sees_a_cycle_through_a_type_only_or_a_local_import(tmp_path: Path):
    package = tmp_path / "cyclic"
    (package / "inner").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "inner" / "__init__.py").write_text("")
    (package / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .inner import b\n")
    (package / "inner" / "b.py").write_text("def f():\n    from ..c import g\n")
    (package / "c.py").write_text("import cyclic.a\n")
    (package / "d.py").write_text("from cyclic import a\n")
    graph = import_graph(package)
    assert graph["cyclic.a"] == {"cyclic.inner.b"}
    assert cycles(graph) == [["cyclic.a", "cyclic.c", "cyclic.inner.b"]]


def test_every_folder_of_the_package_is_a_regular_package():
    """import-linter reads a folder's modules only when it has an ``__init__.py``."""
    folders = {path.parent for path in PACKAGE_DIR.rglob("*.py") if "__pycache__" not in path.parts}
    assert [folder for folder in sorted(folders) if not (folder / "__init__.py").exists()] == []


def test_the_layers_contract_names_every_folder_and_module_of_the_root():
    """A new folder (or root module) outside the layers would escape the one-way rule."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in config["contracts"] if c["type"] == "layers" and "containers" not in c)["layers"]
    named = {name.strip() for layer in layers for name in layer.split("|")}
    root = {f"conveyor.{path.stem}" for path in PACKAGE_DIR.glob("*.py") if path.stem != "__init__"}
    root |= {f"conveyor.{path.parent.name}" for path in PACKAGE_DIR.glob("*/__init__.py")}
    assert named == root
