"""The Internals pages: ``docs/DESIGN.md`` read at build time, a page a layer.

DESIGN.md stays the one text (it is edited with the code); each internals page names
the parts it shows (a ``##`` section, or one numbered layer of "Layers" by its bold
title) in :data:`PAGES`, and ``{design-page} <page>`` renders them. ``{design-page}
rest`` renders every section no page names, so a section added to DESIGN.md appears on
the site without an edit here. A part that no longer exists fails the build, naming it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.errors import ExtensionError
from sphinx.util.docutils import SphinxDirective

DESIGN = Path(__file__).resolve().parent.parent / "DESIGN.md"

#: Each internals page's parts: ``(section title, layer title or None)``.
PAGES: dict[str, list[tuple[str, str | None]]] = {
    "layers": [("Layers (data flows top to bottom)", "")],
    "pipes": [("Layers (data flows top to bottom)", "Pipes"), ("Pipes and passes", None)],
    "graph-tools": [("Layers (data flows top to bottom)", "Graph tools")],
    "randomness": [("Layers (data flows top to bottom)", "Randomness")],
    "reading-services": [("Layers (data flows top to bottom)", "Reading services")],
    "workers": [
        ("Layers (data flows top to bottom)", "Worker runtime"),
        ("Failures: in order, deaths at once", None),
        ("Shutdown sequence", None),
    ],
    "distributed": [("Layers (data flows top to bottom)", "Distributed")],
    "loaders": [
        ("Layers (data flows top to bottom)", "DataLoader2"),
        ("Layers (data flows top to bottom)", "`conveyor.DataLoader`"),
    ],
    "statistics": [("Layers (data flows top to bottom)", "Statistics")],
    "state": [("State: how each op resumes exactly", None)],
    "real-data": [("Real data: storage, archives, formats", None)],
    "decisions": [
        ("Decisions taken where the first map was silent", None),
        ("Invariants (each has a test)", None),
        ("Where we aim past every peer", None),
        ("Performance, measured, never assumed", None),
    ],
}
#: Sections shown elsewhere on the site: "What the user does" is the Getting started page.
SHOWN_ELSEWHERE = {"What the user does"}

_LAYER = re.compile(r"^\d+\. \*\*(.+?)\*\*")


def sections(text: str) -> dict[str, list[str]]:
    """DESIGN.md's ``##`` sections: title -> the lines under it."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("## "):
            current = found.setdefault(line[3:].strip(), [])
        elif current is not None:
            current.append(line)
    return found


def layers(lines: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """A section's text before its first numbered item, and each item (by its bold
    title) with its number taken off and its continuation lines dedented."""
    intro: list[str] = []
    items: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in lines:
        match = _LAYER.match(line)
        if match:
            current = items.setdefault(match.group(1), [])
            current.append(line[line.index("**") :])
        elif current is None:
            intro.append(line)
        else:
            current.append(line[3:] if line.startswith("   ") else line)
    return intro, items


def part_lines(text: str, section: str, layer: str | None) -> list[str]:
    """The lines of one part of DESIGN.md: a section, its intro (``layer == ""``) or one
    of its numbered layers."""
    found = sections(text)
    if section not in found:
        raise ExtensionError(f"docs/DESIGN.md has no section '## {section}' (named in docs/_ext/design_sections.py)")
    if layer is None:
        return found[section]
    intro, items = layers(found[section])
    if layer == "":
        return intro
    if layer not in items:
        raise ExtensionError(
            f"docs/DESIGN.md's section '{section}' has no layer '{layer}' (named in docs/_ext/design_sections.py)"
        )
    return items[layer]


def rest_sections(text: str) -> list[str]:
    named = {section for parts in PAGES.values() for section, _ in parts}
    return [title for title in sections(text) if title not in named and title not in SHOWN_ELSEWHERE]


class DesignPage(SphinxDirective):
    """``{design-page} <page>``: the parts of DESIGN.md that page shows."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        page = self.arguments[0]
        self.env.note_dependency(str(DESIGN))
        text = DESIGN.read_text(encoding="utf-8")
        lines: list[str] = []
        if page == "rest":
            for title in rest_sections(text):
                lines += [f"**{title}**", "", *sections(text)[title], ""]
            if not lines:
                lines = ["Every section of the design notes is on one of the pages above."]
        elif page in PAGES:
            for section, layer in PAGES[page]:
                lines += [*part_lines(text, section, layer), ""]
        else:
            raise self.error(f"unknown internals page {page!r}: one of {sorted(PAGES)} or 'rest'")
        holder = nodes.container()
        self.state.nested_parse(StringList(lines, source=str(DESIGN)), 0, holder)
        return holder.children


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("design-page", DesignPage)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
