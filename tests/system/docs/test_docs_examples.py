"""Every code example of the documentation runs: the Python blocks of each page (and of
the README), the scripts the pages include, and the examples in the public docstrings."""

from __future__ import annotations

import doctest
import importlib
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from docs_site import DOCS, ROOT, included_scripts, pages, python_blocks

PAGES = [page for page in pages() if python_blocks(page.read_text(encoding="utf-8"))]
SCRIPTS = sorted(
    {(page.parent / script).resolve() for page in pages() for script in included_scripts(page.read_text())}
)
PUBLIC_MODULES = (
    "conveyor",
    "conveyor.pipes",
    "conveyor.graph",
    "conveyor.errors",
    "conveyor.samplers",
    "conveyor.random",
    "conveyor.reading_service",
)


def _run(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_pages_have_examples():
    names = {_name(page) for page in PAGES}
    assert "docs/getting-started.md" in names and "README.md" in names, names
    assert len(PAGES) >= 15, names


@pytest.mark.timeout(240)
@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_page_examples_run(page, tmp_path):
    """A page's Python blocks, in order, as one script (later blocks use what earlier
    ones made), in an empty folder of their own."""
    code = "\n\n".join(python_blocks(page.read_text(encoding="utf-8")))
    script = tmp_path / "page_examples.py"
    script.write_text(code, encoding="utf-8")
    done = _run([sys.executable, str(script)], tmp_path, timeout=200)
    assert done.returncode == 0, f"{_name(page)}'s examples failed:\n{done.stdout}\n{done.stderr}"


def test_included_scripts_are_run_by_the_suite():
    """A script a page includes is run here (under docs/) or by a test of its own."""
    tests = "\n".join(path.read_text(encoding="utf-8") for path in (ROOT / "tests").rglob("test_*.py"))
    for script in SCRIPTS:
        assert script.exists(), f"a page includes {script}, which does not exist"
        if DOCS not in script.parents:
            assert script.name in tests, f"no test runs {_name(script)}, which a page shows"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("script", [s for s in SCRIPTS if DOCS in s.parents], ids=_name)
def test_included_scripts_run(script, tmp_path):
    done = _run([sys.executable, str(script)], tmp_path, timeout=200)
    assert done.returncode == 0, f"{_name(script)} failed:\n{done.stdout}\n{done.stderr}"


def _public_objects() -> list[object]:
    found: list[object] = []
    for name in PUBLIC_MODULES:
        module = importlib.import_module(name)
        found.append(module)
        names = getattr(module, "__all__", None) or [
            n for n, v in vars(module).items() if not n.startswith("_") and getattr(v, "__module__", None) == name
        ]
        found += [getattr(module, n) for n in names]
    pipes = importlib.import_module("conveyor.pipes")
    for kind in (pipes.IterDataPipe, pipes.MapDataPipe):
        found += [value for key, value in vars(kind).items() if not key.startswith("_") and inspect.isfunction(value)]
    return found


def test_docstring_examples_run(tmp_path, monkeypatch):
    """The ``>>>`` examples of every public name's docstring (its methods' too), and no
    example written any other way: an ``Example:`` section holds doctest lines."""
    monkeypatch.chdir(tmp_path)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    seen: set[int] = set()
    not_doctests = []
    for obj in _public_objects():
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        name = getattr(obj, "__qualname__", getattr(obj, "__name__", repr(obj)))
        for test in finder.find(obj, name, globs={}):
            runner.run(test)
        for member in [obj, *vars(obj).values()] if inspect.isclass(obj) else [obj]:
            doc = inspect.getdoc(member) if callable(member) or inspect.ismodule(member) else None
            if doc and re.search(r"^Examples?:\s*$", doc, flags=re.M) and ">>>" not in doc:
                not_doctests.append(getattr(member, "__qualname__", name))
    results = runner.summarize(verbose=False)
    assert results.failed == 0, f"{results.failed} of {results.attempted} docstring examples failed (output above)"
    assert not not_doctests, f"Example sections without '>>>' lines (write them as doctests): {not_doctests}"
