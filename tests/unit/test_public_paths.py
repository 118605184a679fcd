"""The public face: what the README, docs/ and examples/ import keeps working, each public
module names its public names in ``__all__``, and everything else says it is internal.

The public modules are ``conveyor``, ``conveyor.pipes``, ``conveyor.graph``,
``conveyor.errors``, ``conveyor.samplers``, ``conveyor.random`` and
``conveyor.reading_service``; the layers under them (``core``, ``pipes.io``, ``workers``,
``loader``, ...) are internal (docs/DESIGN.md, "Layers").
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path
from typing import Any

import pytest

import conveyor

REPO = Path(__file__).resolve().parents[2]
PACKAGE_DIR = Path(conveyor.__file__).parent

PUBLIC_MODULES = [
    "conveyor",
    "conveyor.pipes",
    "conveyor.graph",
    "conveyor.errors",
    "conveyor.samplers",
    "conveyor.random",
    "conveyor.reading_service",
]
#: Names the README's tables give for a public module without an import line.
DOCUMENTED_NAMES = {
    "conveyor.graph": [
        "traverse",
        "traverse_dps",
        "list_dps",
        "find_dps",
        "replace_dp",
        "remove_dp",
        "apply_sharding",
        "apply_random_seed",
        "set_datapipes_seed",
        "set_graph_random_seed",
        "SHARDING_PRIORITIES",
        "to_dot",
        "to_mermaid",
    ],
    "conveyor.samplers": ["RandomSampler", "SequentialSampler", "BatchSampler", "StatefulDistributedSampler"],
    "conveyor.random": ["SeedGenerator"],
    "conveyor": ["DataLoader", "DataLoader2", "SeedGenerator", "Stateful", "PauseIteration", "PrefetchTimeoutError"],
}
#: The package's root: the public modules and the layers' folders, nothing else.
ROOT_MODULES = {"__init__.py", "errors.py", "graph.py", "random.py", "samplers.py"}
ROOT_PACKAGES = {"pipes", "reading_service"}
INTERNAL_PACKAGES = {"core", "observe", "distributed", "workers", "loader", "torch_compat", "tools"}


def documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "examples").glob("*.py"))]


def imports_in_python(source: str) -> list[tuple[str, list[str]]]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "conveyor":
            found.append((node.module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names if alias.name.split(".")[0] == "conveyor"]
    return found


_FROM = re.compile(r"^\s*from (conveyor(?:\.\w+)*) import \(?([\w, ]+)\)?", re.MULTILINE)
_IMPORT = re.compile(r"^\s*import (conveyor(?:\.\w+)*)\s*$", re.MULTILINE)
_DOTTED = re.compile(r"`(conveyor(?:\.\w+)+)(?:\(\w*\)|\.\*)?`")


def imports_in_markdown(text: str) -> list[tuple[str, list[str]]]:
    found = [(m.group(1), [n.strip() for n in m.group(2).split(",") if n.strip()]) for m in _FROM.finditer(text)]
    return found + [(m.group(1), []) for m in _IMPORT.finditer(text)]


def documented_imports() -> list[tuple[str, str, list[str]]]:
    found = []
    for path in documents():
        text = path.read_text()
        pairs = imports_in_python(text) if path.suffix == ".py" else imports_in_markdown(text)
        found += [(path.name, module, names) for module, names in pairs]
    return found


def test_the_documents_show_imports():
    """The scan reads what it should: the README's and the examples' imports are there."""
    modules = {module for _, module, _ in documented_imports()}
    assert {"conveyor", "conveyor.pipes"} <= modules
    assert len(documented_imports()) >= 10


@pytest.mark.parametrize(("where", "module", "names"), documented_imports())
def test_every_documented_import_works(where: str, module: str, names: list[str]):
    imported = importlib.import_module(module)
    for name in names:
        if getattr(imported, name, None) is None:  # `from conveyor import graph`: a submodule
            importlib.import_module(f"{module}.{name}")
        assert getattr(imported, name, None) is not None, f"{where}: from {module} import {name}"


def test_every_documented_public_name_resolves():
    for module, names in DOCUMENTED_NAMES.items():
        imported = importlib.import_module(module)
        for name in names:
            assert getattr(imported, name, None) is not None, f"{module}.{name}"
            assert name in imported.__all__, f"{module}.__all__ lacks {name}"


def test_every_public_dotted_name_the_readme_and_guides_show_resolves():
    """``conveyor.graph.to_dot(pipe)``, ``conveyor.samplers``, ``conveyor.errors.WorkerError``..."""
    shown = set()
    pages = [p for p in sorted((REPO / "docs").rglob("*.md")) if "_build" not in p.parts and p.name != "DESIGN.md"]
    for path in [REPO / "README.md", *pages]:
        shown |= {m.group(1) for m in _DOTTED.finditer(path.read_text())}
    assert {"conveyor.graph.to_dot", "conveyor.samplers"} <= shown
    for dotted in sorted(shown - STATE_FORMATS):
        assert resolves(dotted), dotted


#: Names of state formats (strings in a state's "format" key), not Python names.
STATE_FORMATS = {"conveyor.ranks"}


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` names a module, or attributes reached from the longest
    importable module prefix (``conveyor.DataLoader.state_dict``)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            found = getattr(found, name, None)
            if found is None:
                return False
        return True
    return False


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_each_public_module_declares_its_names(module: str):
    imported = importlib.import_module(module)
    assert isinstance(imported.__all__, list) and imported.__all__
    assert len(set(imported.__all__)) == len(imported.__all__)
    for name in imported.__all__:
        assert getattr(imported, name, None) is not None, f"{module}.{name}"


def test_the_root_holds_only_the_public_face_and_the_layers():
    modules = {path.name for path in PACKAGE_DIR.glob("*.py")}
    packages = {path.parent.name for path in PACKAGE_DIR.glob("*/__init__.py")}
    assert modules == ROOT_MODULES
    assert packages == ROOT_PACKAGES | INTERNAL_PACKAGES


def test_every_internal_package_says_so():
    internal = [
        path
        for path in PACKAGE_DIR.rglob("__init__.py")
        if path.parent.relative_to(PACKAGE_DIR).parts[:1] in {(name,) for name in INTERNAL_PACKAGES}
        or path.parent.relative_to(PACKAGE_DIR).parts[:2] in {("pipes", "io"), ("pipes", "torch")}
    ]
    assert len(internal) >= len(INTERNAL_PACKAGES) + 2
    unmarked = [str(path.relative_to(PACKAGE_DIR)) for path in internal if "Internal" not in path.read_text()]
    assert unmarked == []
