"""The built site in a real headless browser (Debian's ``chromium``; the README's test
command installs it where it is missing): the index renders, and the search page, run
by its own JavaScript, finds ``sharding_filter`` and ``load_state_dict``."""

from __future__ import annotations

import functools
import html.parser
import http.server
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from docs_site import build_site

# One worker runs every test of the built site: the others would wait for its build.
pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("docs-site")]


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "chromium is not installed: the README's test command installs it (apt-get install chromium)"
    return found


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[str]:
    """The site over HTTP on 127.0.0.1, as a reader's browser gets it."""
    base = tmp_path_factory.getbasetemp()
    site = build_site(base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base)
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def dom(url: str, profile: Path) -> str:
    """The page's DOM once its scripts ran (chromium's virtual time lets the search's
    timers and the index's loading finish)."""
    done = subprocess.run(
        [
            _chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            f"--user-data-dir={profile}",
            "--virtual-time-budget=20000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


class _Results(html.parser.HTMLParser):
    """The search page's results: each ``<li>``'s link and text."""

    def __init__(self) -> None:
        super().__init__()
        self.summary = ""
        self.results: list[tuple[str, str]] = []
        self._in_summary = self._in_list = False
        self._item: list[str] | None = None
        self._href = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        classes = (values.get("class") or "").split()
        if "search-summary" in classes:
            self._in_summary = True
        if tag == "ul" and "search" in classes:
            self._in_list = True
        if self._in_list and tag == "li":
            self._item, self._href = [], ""
        if self._item is not None and tag == "a" and not self._href:
            self._href = values.get("href") or ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "p":
            self._in_summary = False
        if tag == "li" and self._item is not None:
            self.results.append((self._href, "".join(self._item)))
            self._item = None
        if tag == "ul":
            self._in_list = False

    def handle_data(self, data: str) -> None:
        if self._in_summary:
            self.summary += data
        if self._item is not None:
            self._item.append(data)


def search(base: str, query: str, profile: Path) -> _Results:
    parsed = _Results()
    parsed.feed(dom(f"{base}/search.html?q={query}", profile))
    return parsed


def test_index_renders(served, tmp_path):
    page = dom(f"{served}/index.html", tmp_path)
    assert "<h1>conveyor" in page
    for section in ("Getting started", "Concepts", "How-to guides", "Migration", "API reference", "Performance"):
        assert section in page, section
    assert 'class="sidebar-tree"' in page  # the theme's navigation rendered


@pytest.mark.parametrize(
    ("query", "object_anchor"),
    [
        ("sharding_filter", "#conveyor.pipes.IterDataPipe.sharding_filter"),
        ("load_state_dict", "#conveyor.DataLoader2.load_state_dict"),
    ],
)
def test_search_finds(served, tmp_path, query, object_anchor):
    found = search(served, query, tmp_path)
    assert found.results, f"no results for {query!r}; summary: {found.summary!r}"
    assert "found" in found.summary and not found.summary.startswith("Your search did not match"), found.summary
    anchors = [href for href, _ in found.results]
    assert any(href.endswith(object_anchor) for href in anchors), anchors[:10]
    assert sum(query in text for _, text in found.results) >= 2, found.results[:5]
