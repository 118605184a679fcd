"""The documentation site: it builds with warnings as errors and nitpicky references, its
links resolve, its reference holds every public name with a summary and its parameters,
and its performance pages follow the result files."""

from __future__ import annotations

import enum
import html
import html.parser
import importlib
import inspect
import json
import os
import posixpath
import re
import shutil
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from docs_site import DOCS, build_site

sys.path.insert(0, str(DOCS / "_ext"))
import bench_results
import op_catalogue
import performance_pages
from public_api import DOCSTRINGS_FILE, PUBLIC_MODULES, public_names

# One worker runs every test of the built site: the others would wait for its build.
pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("docs-site")]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    return build_site(shared)


class _Page(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if values.get("id"):
            self.ids.add(values["id"])
        if tag == "a" and values.get("name"):
            self.ids.add(values["name"])
        for key in ("href", "src"):
            if tag in ("a", "link", "img", "script") and values.get(key):
                self.links.append(values[key])


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def test_site_builds_with_warnings_as_errors(site):
    assert (site / "index.html").exists()
    for page in ("getting-started", "concepts/checkpoint-format", "guides/trainers", "migration/torchdata", "api/ops"):
        assert (site / f"{page}.html").exists(), page


def test_every_internal_link_resolves(site):
    pages = {path: _parse(path) for path in site.rglob("*.html")}
    broken = []
    for path, page in pages.items():
        for link in page.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith(("mailto:", "data:", "javascript:")):
                continue
            target = path if not parts.path else (path.parent / unquote(parts.path)).resolve()
            if not target.exists():
                broken.append(f"{path.relative_to(site)} -> {link}")
            elif parts.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else _parse(target).ids
                if unquote(parts.fragment) not in ids:
                    broken.append(f"{path.relative_to(site)} -> {link} (no such anchor)")
    assert not broken, "broken links:\n" + "\n".join(broken[:50])


def _inventory(site: Path) -> dict[str, str]:
    from sphinx.util.inventory import InventoryFile

    with open(site / "objects.inv", "rb") as stream:
        data = InventoryFile.load(stream, "", posixpath.join)
    return {name: role for role, entries in data.items() if role.startswith("py:") for name in entries}


def _expected_names() -> list[str]:
    """Every name the public modules export, and every functional op on the pipe classes."""
    names = []
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        names += [f"{module_name}.{name}" for name in public_names(module)]
    names += [f"conveyor.pipes.{kind}.{name}" for name, kind, _ in op_catalogue.functional_rows()]
    return names


def test_every_public_name_is_in_the_inventory(site):
    inventory = _inventory(site)
    missing = [name for name in _expected_names() if name not in inventory]
    assert not missing, f"public names missing from objects.inv: {missing}"


def _object(full: str) -> object:
    module_name, _, rest = full.partition(".")
    for module_name in sorted(PUBLIC_MODULES, key=len, reverse=True):
        if full.startswith(module_name + "."):
            rest = full[len(module_name) + 1 :]
            break
    value: object = importlib.import_module(module_name)
    for part in rest.split("."):
        value = inspect.getattr_static(value, part) if inspect.isclass(value) else getattr(value, part)
    return value


def _parameters(value: object) -> list[str]:
    """The parameters a docstring must document: all but ``self``/``cls`` and a bare
    ``*args``/``**kwargs`` that only passes arguments on."""
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if not callable(value) or inspect.ismodule(value):
        return []
    if inspect.isclass(value) and issubclass(value, enum.Enum):
        # an enum (SHARDING_PRIORITIES) is used by its members, never called with Enum's
        # functional-API parameters (value, names, module, ...): nothing to describe
        return []
    try:
        signature = inspect.signature(value)
    except (TypeError, ValueError):
        return []
    names = []
    for parameter in signature.parameters.values():
        if parameter.name in ("self", "cls"):
            continue
        variadic = parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
        if variadic and parameter.name in ("args", "kwargs"):
            continue
        names.append(parameter.name)
    return names


def _documented(lines: list[str], name: str) -> bool:
    return any(re.match(rf"^:param (?:[^:]*\s)?(?:\\?\*){{0,2}}{re.escape(name)}:", line) for line in lines)


def test_every_public_name_has_a_summary_and_documents_its_parameters(site):
    """Each public name, as the site renders it: a summary line, and each parameter of its
    signature under ``Args:`` (napoleon's ``:param name:``). Functional ops count too."""
    docstrings = json.loads((site / DOCSTRINGS_FILE).read_text(encoding="utf-8"))
    problems = []
    for full in _expected_names():
        value = _object(full)
        if inspect.isclass(value) and value.__name__ != full.rsplit(".", 1)[1]:
            # an alias (PrototypeMultiProcessingReadingService): the site says "alias of" the class
            full = next((name for name in _expected_names() if name.endswith("." + value.__name__)), full)
        entry = docstrings.get(full)
        lines = entry["lines"] if entry else []
        if not any(line.strip() for line in lines):
            problems.append(f"{full}: no docstring on the site")
            continue
        if inspect.ismodule(value):
            continue
        undocumented = [p for p in _parameters(value) if not _documented(lines, p)]
        if undocumented:
            problems.append(f"{full}: parameters without a description: {undocumented}")
    assert not problems, f"{len(problems)} public names are not fully documented:\n" + "\n".join(problems)


def test_op_catalogue_lists_every_op_from_the_index(site):
    text = (site / "api" / "ops.html").read_text(encoding="utf-8")
    classes = op_catalogue.class_rows()
    assert len(classes) >= 80
    for name, _, _ in classes:
        assert f'id="conveyor.pipes.{name}"' not in text  # linked to the reference, not documented twice
        assert f"#conveyor.pipes.{name}" in text, name
    for name, kind, _ in op_catalogue.functional_rows():
        assert f"#conveyor.pipes.{kind}.{name}" in text, name


def _table_rows(result) -> list[list[str]]:
    """The rows of a result's table as the harness renders it (the README's too), header
    and separator left out."""
    lines = bench_results.tables.table(result).splitlines()[2:]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


def test_performance_pages_show_the_result_files(site):
    """A page per suite: its newest result and those benchmarks/README.md shows, each with
    its table, its charts, the command, the date, the commit and the machine."""
    suites = bench_results.suites()
    assert {"peers", "real_data", "torch_dataloader", "transport", "snapshot"} <= {s.name for s in suites}
    index = _text(site / "performance" / "index.html")
    for suite in suites:
        path = site / "performance" / "results" / f"{suite.name}.html"
        page = _text(path)
        assert suite.title in index, suite.name
        assert suite.shown[0].newest and suite.shown[0].path == bench_results.results.latest(suite.name)
        charts = 0
        for shown in suite.shown:
            result = shown.result
            assert result.command in page and result.date in page and result.commit in page, shown.name
            assert f"benchmarks/results/{shown.name}.json" in page
            for value in result.machine.values():
                assert str(value) in page, (shown.name, value)
            for row in _table_rows(result):
                assert all(cell in page for cell in row if cell), (shown.name, row)
            charts += len(performance_pages.bench_charts.charted(result))
        assert path.read_text(encoding="utf-8").count("data:image/svg+xml;base64,") == charts >= len(suite.shown)
    real_data = _text(site / "performance" / "results" / "real_data.html")
    for loader in ("webdataset WebLoader", "Hugging Face datasets", "torch DataLoader", "(bound)"):
        assert loader in real_data, loader
    peers = _text(site / "performance" / "results" / "peers.html")
    for loader in ("Grain", "torchdata.nodes", "torch DataLoader", "bare bound"):
        assert loader in peers, loader


def _text(path: Path) -> str:
    """A page's text, tags taken out, and the quotes Sphinx makes typographic made plain."""
    text = html.unescape(re.sub(r"<[^>]+>", "", path.read_text(encoding="utf-8")))
    return text.translate(str.maketrans("\u2018\u2019\u201c\u201d", "''\"\""))


def test_a_new_run_changes_the_tables_and_charts(tmp_path):
    """A suite's new result, saved beside the others, replaces the newest on its page:
    the table and the charts change, with no page edited by hand; the other suites' pages
    stay as they were."""
    results = tmp_path / "results"
    shutil.copytree(bench_results.RESULTS, results)
    before = {path.name: path.read_text() for path in performance_pages.generate(results, tmp_path / "before")}
    previous = bench_results.results.latest("peers", results)
    data = json.loads(previous.read_text())
    data["date"], data["commit"] = "2099-01-01T00:00:00+00:00", "f" * 40
    data["command"] += " --repeats 7"
    entry = next(e for e in data["entries"] if e["loader"] == data["subject"] and e["status"] == "ok")
    for metric in ("items_per_s", "cpu_us_per_item"):  # the two charted metrics
        entry["metrics"][metric] = {"median": 98765.4, "min": 98000.0, "max": 99000.0, "values": [98000.0, 98765.4]}
    (results / "peers" / "2099-01-01-fffffff.json").write_text(json.dumps(data))
    after = {path.name: path.read_text() for path in performance_pages.generate(results, tmp_path / "after")}
    page = "peers.md"
    assert "98,765" in after[page] and "98,765" not in before[page]
    assert "--repeats 7" in after[page] and "2099-01-01" in after[page]
    assert previous.stem not in after[page], "the newest result replaces the one before"
    charts = [re.findall(r"base64,([A-Za-z0-9+/=]+)", text) for text in (before[page], after[page])]
    assert len(charts[1]) == len(charts[0]) == 2
    assert all(old != new for old, new in zip(*charts, strict=True)), "both charts must change"
    assert all(before[name] == after[name] for name in before if name not in (page, performance_pages.SUITES_FILE))
    assert "2099-01-01" in after[performance_pages.SUITES_FILE]


def test_readme_is_a_visitors_page_and_contributing_holds_the_loop():
    root = DOCS.parent
    readme = (root / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    for marker in (
        "<!-- demo-command -->",
        "<!-- test-command -->",
        "<!-- quick-test-command -->",
        "<!-- docs-command -->",
    ):
        assert readme.count(marker) == 1, marker
    quick_command = readme.split("<!-- quick-test-command -->", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    assert "tests/unit tests/integration" in quick_command and "--hypothesis-profile quick" in quick_command
    docs_command = readme.split("<!-- docs-command -->", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    assert "sphinx-build -W -n docs" in docs_command
    test_command = readme.split("<!-- test-command -->", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    assert test_command.strip().startswith(".ci/system-packages && ")
    assert "chromium" in (root / ".ci" / "system-packages").read_text()
    assert "graphviz" in (root / ".ci" / "system-packages").read_text()
    contributing = (root / "CONTRIBUTING.md").read_text(encoding="utf-8")
    for topic in ("--cpu-hogs 2", ".ci/other-pythons", ".ci/run", "docs/"):
        assert topic in contributing, topic
