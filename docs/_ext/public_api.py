"""The API reference: every public name of conveyor's public modules, by their public path.

``.. public-api:: conveyor.graph`` documents each name the module exports (its
``__all__``; a module without one exports the classes and functions it defines) under
the module's own name, never under the internal module that defines it, so modules can
move without breaking the reference. A reference to an internal path (a type hint names
the class where it is defined: ``conveyor.pipes.base.IterDataPipe``) is resolved to the
same object's public entry. Each docstring, as rendered, is kept in the build's
environment and written to ``<outdir>/.api-docstrings.json`` for the tests that check
every public name has a summary line and documents its parameters.
"""

from __future__ import annotations

import importlib
import inspect
import json
import types
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.domains.python import PyClasslike
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

#: The modules whose names are public: the reference documents each of them.
PUBLIC_MODULES = (
    "conveyor",
    "conveyor.pipes",
    "conveyor.graph",
    "conveyor.errors",
    "conveyor.samplers",
    "conveyor.random",
    "conveyor.reading_service",
)

DOCSTRINGS_FILE = ".api-docstrings.json"


def public_names(module: Any) -> list[str]:
    """The names ``module`` exports: its ``__all__``, else the public classes and
    functions it defines itself."""
    names = getattr(module, "__all__", None)
    if names is not None:
        return list(names)
    return sorted(
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and (inspect.isclass(value) or inspect.isfunction(value))
        and getattr(value, "__module__", None) == module.__name__
    )


def _kind(value: Any) -> str:
    if inspect.ismodule(value):
        return "module"
    alias = isinstance(value, (types.GenericAlias, types.UnionType)) or type(value).__module__ == "typing"
    if alias and not inspect.isclass(value):
        return "alias"  # callable, but documented by what it stands for, not by dict's docstring
    if inspect.isclass(value) and issubclass(value, BaseException):
        return "exception"
    if inspect.isclass(value):
        return "class"
    if callable(value):
        return "function"
    return "data"


_SECTIONS = (
    ("class", "Classes"),
    ("function", "Functions"),
    ("exception", "Exceptions"),
    ("data", "Data"),
    ("alias", "Type aliases"),
    ("module", "Modules"),
)


class PublicApi(SphinxDirective):
    """``.. public-api:: <module>``: the module's docstring and every name it exports."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        name = self.arguments[0]
        module = importlib.import_module(name)
        by_kind: dict[str, list[str]] = {}
        for public in public_names(module):
            by_kind.setdefault(_kind(getattr(module, public)), []).append(public)
        lines = [f".. automodule:: {name}", "   :no-members:", ""]
        for kind, title in _SECTIONS:
            if kind not in by_kind:
                continue
            lines += [title, "-" * len(title), ""]
            for public in by_kind[kind]:
                entry = _entry(kind, f"{name}.{public}", getattr(module, public))
                if kind == "alias":  # no autodoc event for it: keep the line the site shows
                    store = self.env.__dict__.setdefault("conveyor_docstrings", {})
                    store[f"{name}.{public}"] = {"what": "data", "lines": [line.strip() for line in entry[3:]]}
                lines += entry
        content = StringList(lines, source=f"<public-api {name}>")
        holder = nodes.section()
        holder.document = self.state.document
        nested_parse_with_titles(self.state, content, holder)
        return holder.children


def _entry(kind: str, full: str, value: Any) -> list[str]:
    if kind == "module":
        return [f"- :py:mod:`{full}`: see its own page.", ""]
    if kind == "alias":
        module, _, name = full.rpartition(".")
        return [f".. py:data:: {name}", f"   :module: {module}", "", f"   A type alias: ``{value!r}``.", ""]
    if kind in ("class", "exception"):
        lines = [f".. auto{kind}:: {full}", "   :members:"]
        stops = _documented_bases(value)
        if stops is not None:
            lines.append(f"   :inherited-members: {', '.join(stops)}")
        settings = _op_settings(value)
        if settings:
            lines.append(f"   :exclude-members: {', '.join(settings)}")
        return [*lines, ""]
    return [f".. auto{kind}:: {full}", ""]


def _documented_bases(cls: type) -> list[str] | None:
    """The bases whose members a class's entry leaves out, or None when it inherits
    nothing to show. A class shows what it inherits from conveyor's internal bases (the
    mixins ``DataLoader2`` is made of), not what public classes or other projects'
    classes document themselves."""
    public = {id(value) for value in _all_public_values()}
    stops = [
        base.__name__ for base in cls.__mro__[1:] if id(base) in public or not base.__module__.startswith("conveyor")
    ]
    internal = [base for base in cls.__mro__[1:] if base.__name__ not in stops]
    return sorted(set(stops)) if internal else None


def _all_public_values() -> list[Any]:
    values = []
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        values += [getattr(module, name) for name in public_names(module)]
    return values


def _op_settings(cls: type) -> list[str]:
    """What the reference leaves out of a pipe class: its class attributes
    (``pass_type``, ``state_fields``, ...: the op protocol's settings) and, on an op, its
    overrides of the protocol's methods (``check_own_state``, ``substates``, ...), which
    :class:`~conveyor.pipes.IterDataPipe` documents once."""
    from conveyor.pipes import DataPipe, IterDataPipe, MapDataPipe

    if not issubclass(cls, DataPipe):
        return []
    bases = (DataPipe, IterDataPipe, MapDataPipe)
    protocol = set() if cls in bases else {name for base in bases for name in vars(base)}
    methods = (staticmethod, classmethod, property)
    own = [klass for klass in cls.__mro__ if klass not in bases and klass.__module__.startswith("conveyor")]
    return sorted(
        {
            name
            for klass in own
            for name, value in vars(klass).items()
            if not name.startswith("_")
            and (name in protocol or (not inspect.isfunction(value) and not isinstance(value, methods)))
        }
    )


def public_objects() -> dict[int, str]:
    """``id(object) -> its public name`` for every public name (the first module that
    exports an object names it) and, for classes, their members."""
    found: dict[int, str] = {}
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for public in public_names(module):
            value = getattr(module, public)
            full = f"{module_name}.{public}"
            found.setdefault(id(value), full)
            if inspect.isclass(value):
                for member, attribute in vars(value).items():
                    if not member.startswith("_"):
                        found.setdefault(id(attribute), f"{full}.{member}")
    return found


def _resolve_path(target: str) -> Any:
    """The object a dotted path names (``conveyor.pipes.base.IterDataPipe``), or
    ``_MISSING``."""
    parts = target.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attribute in parts[cut:]:
                value = (
                    inspect.getattr_static(value, attribute) if inspect.isclass(value) else getattr(value, attribute)
                )
        except AttributeError:
            return _MISSING
        return value
    return _MISSING


_MISSING = object()


def resolve_internal(app: Sphinx, env: Any, node: Any, contnode: nodes.Node) -> nodes.Node | None:
    """A reference to one of conveyor's objects by an internal path: a link to the
    object's public entry (the object itself, not its name, decides), or, for an object
    that exists but is not public (an internal module, a base class), its name as text.
    A name that exists nowhere stays unresolved, which fails the build."""
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "")
    if not target.startswith("conveyor."):
        return None
    value = _resolve_path(target)
    if value is _MISSING:
        return None
    public = _public_ids(app).get(id(value))
    if public is None or public == target:
        return contnode
    domain = env.get_domain("py")
    found = domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"], public, node, contnode)
    if found is None:
        matches = domain.resolve_any_xref(env, node["refdoc"], app.builder, public, node, contnode)
        found = matches[0][1] if matches else None
    return found


def _public_ids(app: Sphinx) -> dict[int, str]:
    cached = getattr(app, "_conveyor_public_ids", None)
    if cached is None:
        cached = public_objects()
        app._conveyor_public_ids = cached  # type: ignore[attr-defined]
    return cached


def record_docstring(app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    """Keep each docstring as the site renders it (after napoleon's conversion)."""
    store = app.env.__dict__.setdefault("conveyor_docstrings", {})
    store[name] = {"what": what, "lines": list(lines)}


def write_docstrings(app: Sphinx, exception: BaseException | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    store = app.env.__dict__.get("conveyor_docstrings", {})
    Path(app.outdir, DOCSTRINGS_FILE).write_text(json.dumps(store, indent=1, sort_keys=True), encoding="utf-8")


class PublicClasslike(PyClasslike):
    """A class documented under its public path only: autodoc's ``:canonical:`` (the
    defining module's path) is dropped, since a class exported by two public modules
    (``conveyor.DataLoader2`` beside ``conveyor.reading_service``'s services) would
    register that path twice; references to it resolve through :func:`resolve_internal`."""

    def run(self) -> list[nodes.Node]:
        self.options.pop("canonical", None)
        return super().run()


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("public-api", PublicApi)
    app.add_directive_to_domain("py", "class", PublicClasslike, override=True)
    app.add_directive_to_domain("py", "exception", PublicClasslike, override=True)
    app.connect("missing-reference", resolve_internal)
    # after napoleon (500) and the type hints (which add types, not parameters)
    app.connect("autodoc-process-docstring", record_docstring, priority=900)
    app.connect("build-finished", write_docstrings)
    return {"parallel_read_safe": False, "parallel_write_safe": True}
