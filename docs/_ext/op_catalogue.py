"""The op catalogue: tables made from conveyor's op index at build time, not by hand.

The op index (``conveyor.pipes``' table of where each op lives: for each op module, the
public names it exports and the functional names it registers) is the one list of ops;
``.. op-catalogue::`` renders it as two tables: every functional name (``pipe.map``,
``pipe.batch``, ...) on ``IterDataPipe`` and ``MapDataPipe`` with the first sentence of
its docstring, and every public pipe class and function with its functional names.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles


def op_index() -> Any:
    """The op index module, wherever the package keeps it (found through the function
    ``conveyor.pipes`` resolves its names with, else by its module name)."""
    pipes = importlib.import_module("conveyor.pipes")
    resolver = getattr(pipes, "public_name", None)
    module = sys.modules.get(getattr(resolver, "__module__", ""), None)
    if module is not None and hasattr(module, "MODULES"):
        return module
    for name, candidate in list(sys.modules.items()):
        if name.startswith("conveyor.") and name.endswith(".op_index") and hasattr(candidate, "MODULES"):
            return candidate
    raise RuntimeError("conveyor's op index (the module with MODULES) was not found")


def summary(obj: Any) -> str:
    """The first sentence of ``obj``'s docstring, on one line."""
    doc = inspect.getdoc(obj) or ""
    paragraph = " ".join(doc.split("\n\n", 1)[0].split())
    end = paragraph.find(". ")
    return paragraph if end < 0 else paragraph[: end + 1]


def functional_rows() -> list[tuple[str, str, str]]:
    """``(functional name, the class it is a method of, summary)`` for every op."""
    index = op_index()
    pipes = _loaded_pipes()
    rows = []
    kinds = [("IterDataPipe", {m: f for m, (_, f) in index.MODULES.items()})]
    kinds.append(("MapDataPipe", dict(getattr(index, "MAP_FUNCTIONAL", {}))))
    for kind_name, by_module in kinds:
        kind = getattr(pipes, kind_name)
        for functional in by_module.values():
            for name in functional:
                rows.append((name, kind_name, summary(getattr(kind, name))))
    return sorted(rows)


def class_rows() -> list[tuple[str, str, str]]:
    """``(public name, its module's functional names, summary)`` for every public name
    the op index lists."""
    index = op_index()
    pipes = importlib.import_module("conveyor.pipes")
    rows = []
    for names, functional in index.MODULES.values():
        for name in names:
            rows.append((name, ", ".join(f"``{f}``" for f in functional), summary(getattr(pipes, name))))
    return sorted(rows, key=lambda row: row[0].lower())


def _cell(text: str) -> str:
    return text.replace("\n", " ") or "\\-"


def _table(title: str, header: tuple[str, ...], rows: list[tuple[str, ...]], widths: str) -> list[str]:
    lines = [f".. list-table:: {title}", "   :header-rows: 1", f"   :widths: {widths}", ""]
    for row in [header, *rows]:
        lines.append(f"   * - {_cell(row[0])}")
        lines += [f"     - {_cell(cell)}" for cell in row[1:]]
    return [*lines, ""]


class OpCatalogue(SphinxDirective):
    """``.. op-catalogue::``: the functional names and the pipe classes, from the op index."""

    def run(self) -> list[nodes.Node]:
        functional = [
            (f":py:meth:`~conveyor.pipes.{kind}.{name}`", f":py:class:`~conveyor.pipes.{kind}`", text)
            for name, kind, text in functional_rows()
        ]
        classes = [
            (
                f":py:{'class' if inspect.isclass(_public(name)) else 'func'}:`~conveyor.pipes.{name}`",
                names,
                text,
            )
            for name, names, text in class_rows()
        ]
        lines = _table("Functional names", ("op", "a method of", "what it does"), functional, "20 15 65")
        lines += _table("Pipe classes and functions", ("name", "its module's ops", "what it is"), classes, "20 25 55")
        holder = nodes.section()
        holder.document = self.state.document
        nested_parse_with_titles(self.state, StringList(lines, source="<op-catalogue>"), holder)
        return holder.children


def _public(name: str) -> Any:
    return getattr(importlib.import_module("conveyor.pipes"), name)


def _loaded_pipes() -> Any:
    """``conveyor.pipes`` with every op module imported, so each functional name is its
    op's own method (before, it is a stand-in that imports the module at its first call)."""
    pipes = importlib.import_module("conveyor.pipes")
    for name in pipes.__all__:
        getattr(pipes, name)
    return pipes


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("op-catalogue", OpCatalogue)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
