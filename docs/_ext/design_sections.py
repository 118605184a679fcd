"""The Internals pages: ``docs/DESIGN.md`` read at build time, a page a layer.

DESIGN.md stays the one text (it is edited with the code); each internals page names the
``##`` sections it shows in :data:`PAGES`, and ``{design-page} <page>`` renders them, a
``###`` heading inside a section as a bold line (a heading nested in a directive is not
allowed). ``{design-page} rest`` renders every section no page names, so a section added
to DESIGN.md appears on the site without an edit here. A section that no longer exists
fails the build, naming it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.errors import ExtensionError
from sphinx.util.docutils import SphinxDirective

DESIGN = Path(__file__).resolve().parent.parent / "DESIGN.md"

#: Each internals page's ``##`` sections, in the order it shows them.
PAGES: dict[str, list[str]] = {
    "layers": ["Layers", "The direction of imports"],
    "item-path": ["One item's path"],
    "core": ["Layer: errors", "Layer: core"],
    "statistics": ["Layer: observe"],
    "distributed": ["Layer: distributed"],
    "pipes": ["Layer: pipes", "Pipes and passes"],
    "real-data": ["Real data: storage, archives, formats"],
    "workers": ["Layer: workers", "Failures: in order, deaths at once", "Shutdown sequence"],
    "reading-services": ["Layer: reading_service"],
    "loaders": ["Layer: loader", "Layer: torch_compat"],
    "tools": ["Layer: tools | graph | random | samplers"],
    "state": ["State: how each op resumes exactly"],
    "decisions": [
        "Decisions taken where the first map was silent",
        "Invariants (each has a test)",
        "Where we aim past every peer",
        "Performance, measured, never assumed",
    ],
}
#: Sections shown elsewhere on the site: "What the user does" is the Getting started page.
SHOWN_ELSEWHERE = {"What the user does"}


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


def section_lines(text: str, section: str) -> list[str]:
    """The lines of one ``##`` section, its ``###`` headings as bold lines."""
    found = sections(text)
    if section not in found:
        raise ExtensionError(f"docs/DESIGN.md has no section '## {section}' (named in docs/_ext/design_sections.py)")
    return [f"**{line[4:].strip()}**" if line.startswith("### ") else line for line in found[section]]


def rest_sections(text: str) -> list[str]:
    named = {section for parts in PAGES.values() for section in parts}
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
                lines += [f"**{title}**", "", *section_lines(text, title), ""]
            if not lines:
                lines = ["Every section of the design notes is on one of the pages above."]
        elif page in PAGES:
            for section in PAGES[page]:
                lines += [*section_lines(text, section), ""]
        else:
            raise self.error(f"unknown internals page {page!r}: one of {sorted(PAGES)} or 'rest'")
        holder = nodes.container()
        self.state.nested_parse(StringList(lines, source=str(DESIGN)), 0, holder)
        return holder.children


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("design-page", DesignPage)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
