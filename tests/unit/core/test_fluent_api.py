"""The fluent API says what it takes: every functional method (``pipe.map``, ...) has the
op's own signature and a docstring (summary, Args, Returns, Example), the examples run,
and the type stub that carries the methods' types is the one the sources make."""

from __future__ import annotations

import doctest
import inspect
import pydoc
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import conveyor.pipes
import fluent_stub  # the stub's generator (tests/support)
from conveyor.core.op_index import MAP_FUNCTIONAL, MODULES, load
from conveyor.pipes import IterableWrapper, IterDataPipe, MapDataPipe

ITER_NAMES = sorted(name for _, names in MODULES.values() for name in names)
MAP_NAMES = sorted(name for names in MAP_FUNCTIONAL.values() for name in names)
KINDS = [(IterDataPipe, name) for name in ITER_NAMES] + [(MapDataPipe, name) for name in MAP_NAMES]
IDS = [f"{kind.__name__}.{name}" for kind, name in KINDS]


def run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module", autouse=True)
def every_op_loaded() -> None:
    for module in MODULES:
        load(module)


def test_every_name_of_the_index_is_registered():
    assert set(ITER_NAMES) <= set(IterDataPipe._registry())
    assert set(MAP_NAMES) <= set(MapDataPipe._registry())


@pytest.mark.parametrize(("kind", "name"), KINDS, ids=IDS)
def test_each_method_has_the_ops_own_signature(kind: type, name: str):
    method = getattr(kind, name)
    signature = inspect.signature(method)
    params = list(signature.parameters.values())
    assert params[0].name in ("self", "source")  # the pipe the method is called on
    rest = params[1:]
    anything = [inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD]
    assert [p.kind for p in rest] != anything, f"{kind.__name__}.{name}{signature} says nothing of what it takes"
    made_by = inspect.unwrap(method)
    assert list(inspect.signature(made_by).parameters)[1:] == [p.name for p in rest]
    assert method.__name__ == name
    assert method.__qualname__ == f"{kind.__name__}.{name}"


def test_the_signatures_users_see_first():
    assert list(inspect.signature(IterDataPipe.map).parameters) == ["self", "fn", "input_col", "output_col"]
    batch = inspect.signature(IterDataPipe.batch).parameters
    assert list(batch) == ["self", "batch_size", "drop_last"]
    assert batch["drop_last"].default is False
    assert inspect.signature(IterDataPipe.shuffle).parameters["buffer_size"].default == 10000
    bound = inspect.signature(IterableWrapper([1]).map)
    assert list(bound.parameters) == ["fn", "input_col", "output_col"]
    assert list(inspect.signature(MapDataPipe.map).parameters) == ["self", "fn"]


@pytest.mark.parametrize(("kind", "name"), KINDS, ids=IDS)
def test_each_method_is_documented_in_google_style(kind: type, name: str):
    method = getattr(kind, name)
    doc = inspect.getdoc(method)
    assert doc, f"{kind.__name__}.{name} has no docstring"
    summary, _, body = doc.partition("\n")
    assert summary.endswith(".") and len(summary) <= 100, summary
    sections = [line for line in body.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert "Returns:" in sections and "Example:" in sections, sections
    documented = _args_section(doc)
    params = [p for p in list(inspect.signature(method).parameters.values())[1:]]
    for param in params:
        star = "*" if param.kind is inspect.Parameter.VAR_POSITIONAL else ""
        star = "**" if param.kind is inspect.Parameter.VAR_KEYWORD else star
        assert f"{star}{param.name}" in documented, f"{kind.__name__}.{name}: Args does not name {star}{param.name}"
    assert ("Args:" in sections) == bool(params)


def _args_section(doc: str) -> set[str]:
    names: set[str] = set()
    inside = False
    for line in doc.splitlines():
        if line == "Args:":
            inside = True
        elif inside and line and not line.startswith(" "):
            break
        elif inside and line.startswith("    ") and not line.startswith("     ") and ":" in line:
            names.add(line.strip().split(":", 1)[0])
    return names


@pytest.mark.parametrize(("kind", "name"), KINDS, ids=IDS)
def test_each_methods_example_runs(kind: type, name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)  # an example that writes files writes them here
    method = getattr(kind, name)
    # Nothing in scope but what the example imports: a user can paste it as it is.
    test = doctest.DocTestParser().get_doctest(inspect.getdoc(method) or "", {}, f"{name}", None, 0)
    assert test.examples, f"{kind.__name__}.{name} has no example"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    report: list[str] = []
    runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)


def test_help_shows_the_ops_docstring():
    text = pydoc.render_doc(IterDataPipe.map, renderer=pydoc.plaintext)
    assert "map(self, fn" in text
    assert "Applies ``fn`` to each item." in text
    assert "Returns:" in text
    whole = pydoc.render_doc(IterDataPipe, renderer=pydoc.plaintext)
    assert "sharding_filter(self)" in whole and "Keeps this shard's items" in whole


def test_a_methods_signature_reads_before_its_module_is_imported():
    out = run(
        """
        import inspect, sys
        from conveyor.pipes import IterDataPipe
        print("conveyor.pipes.io.text_formats" in sys.modules)
        print(list(inspect.signature(IterDataPipe.parse_csv).parameters)[:3])
        print("conveyor.pipes.io.text_formats" in sys.modules, "conveyor.pipes.images" in sys.modules)
        print(IterDataPipe.__dict__["parse_csv"].__module__)
        """
    )
    assert out.splitlines() == [
        "False",
        "['self', 'skip_lines', 'decode']",
        "True False",
        "conveyor.pipes.io.text_formats",
    ]


def test_a_users_op_class_gets_its_init_signature_and_docstring():
    @IterDataPipe.register_functional("add_for_signature_test", aliases={"n": "amount"})
    class Adder(IterDataPipe[int]):
        """Adds ``amount`` to each item."""

        def __init__(self, source: IterDataPipe[int], amount: int = 1) -> None:
            self.source = source
            self.amount = amount

        def __iter__(self) -> Any:
            for x in self.source:
                yield x + self.amount

    method = IterDataPipe.add_for_signature_test  # type: ignore[attr-defined]
    assert str(inspect.signature(method)) == "(self, amount: 'int' = 1)"
    assert inspect.getdoc(method) == "Adds ``amount`` to each item."
    source = IterableWrapper([1, 2])
    assert list(source.add_for_signature_test(n=10)) == list(source.add_for_signature_test(10)) == [11, 12]  # type: ignore[attr-defined]


def test_an_op_class_carries_its_methods_args():
    """An op class built by a documented function (``builds=``) gets that function's
    ``Args:`` entries, after a line for its input; the method's own docstring is kept."""
    from conveyor.pipes import Mapper, Zipper

    doc = inspect.getdoc(Mapper)
    assert doc.startswith("Yields ``fn(item)``.")
    method_args = inspect.getdoc(IterDataPipe.map).split("Args:\n", 1)[1].split("\n\n", 1)[0]
    class_args = doc.split("Args:\n", 1)[1]
    assert class_args.splitlines()[0] == "    source: The pipe it reads: the one ``.map()`` is called on."
    assert class_args.rstrip().endswith(method_args.rstrip())
    zipper = inspect.getdoc(Zipper).split("Args:\n", 1)[1]
    assert zipper.strip().startswith("*sources: The pipes it reads")
    assert "*others" not in zipper  # the method's entry for a parameter the class does not take

    class Plain(IterDataPipe[int]):
        """Yields nothing."""

        def __init__(self, source: IterDataPipe[int], step: int = 1) -> None:
            self.source = source
            self.step = step

    def plain(source: IterDataPipe[int], step: int = 1) -> IterDataPipe[int]:
        """Builds a plain pipe.

        Args:
            step: How far to step.

        Returns:
            The pipe.
        """
        return Plain(source, step)

    IterDataPipe.register_functional("plain_for_doc_test", builds=Plain)(plain)
    assert inspect.getdoc(Plain).endswith(
        "Args:\n    source: The pipe it reads: the one ``.plain_for_doc_test()`` is called on.\n"
        "    step: How far to step."
    )
    assert inspect.getdoc(IterDataPipe.plain_for_doc_test).startswith("Builds a plain pipe.")  # type: ignore[attr-defined]


def test_a_users_op_function_gets_its_signature_and_docstring():
    def double(source: IterDataPipe[int], times: int = 2) -> IterDataPipe[int]:
        """Multiplies each item by ``times``."""
        return source.map(lambda x: x * times)

    IterDataPipe.register_functional("double_for_signature_test")(double)
    method = IterDataPipe.double_for_signature_test  # type: ignore[attr-defined]
    assert list(inspect.signature(method).parameters) == ["self", "times"]
    assert inspect.getdoc(method) == "Multiplies each item by ``times``."
    assert double.__name__ == "double"  # the user's function itself is left as it was
    assert list(IterableWrapper([1, 2]).double_for_signature_test(3)) == [3, 6]  # type: ignore[attr-defined]


def test_the_stub_is_the_one_the_sources_make():
    """``base.pyi`` is generated: after changing ``base.py`` or an op's method, run
    ``python tests/support/fluent_stub.py``."""
    path = fluent_stub.stub_path()
    assert path.read_text() == fluent_stub.render(), f"{path} is stale: run python tests/support/fluent_stub.py"


def test_every_stub_has_its_module():
    """A stub whose ``.py`` moved away would describe a module that no longer exists."""
    package = Path(conveyor.pipes.__file__).parents[1]
    for stub in package.rglob("*.pyi"):
        assert stub.with_suffix(".py").exists(), f"{stub} has no module beside it"
