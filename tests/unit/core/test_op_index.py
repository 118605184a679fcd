"""``conveyor.pipes`` loads an op's module at the op's first use
(:mod:`conveyor.core.op_index`): the index must name every op where it lives, and a
program must not see the difference, save that ``import conveyor`` loads less."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import conveyor.pipes
from conveyor.core.op_index import MAP_FUNCTIONAL, MODULES, PUBLIC
from conveyor.pipes import IterDataPipe, MapDataPipe

PACKAGE_DIR = Path(conveyor.__file__).parent
#: Where ops live: the general ops, the real-data ops and torch's, and the core's
#: sharding points (``sharding_filter``, ``sharding_round_robin_dispatch``) and roles.
OP_FOLDERS = ("pipes", "pipes/io", "pipes/torch", "core")
#: Modules there that hold no op of their own (the contract, passes, helpers).
NOT_OPS = {"pipes.columns", "pipes.held_items", "pipes.io.cache_lock", "pipes.torch.fetching"}
NOT_OPS |= {"pipes.torch.sampler_source", "pipes.torch.torch_iterable"}
#: conveyor.DataLoader's own pipes (a batch's error in its place, an IterableDataset's batches).
NOT_OPS |= {"pipes.torch.batch_errors", "pipes.torch.iterable_batches"}
#: The core holds only these ops; every other module of it is the machinery.
CORE_OPS = {"core.dispatch", "core.op_roles", "core.sharding"}


def run(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def every_op_module() -> list[str]:
    """Every op module, named from ``conveyor`` (``pipes.batch``), each imported."""
    names = []
    for folder in OP_FOLDERS:
        prefix = folder.replace("/", ".")
        names += [f"{prefix}.{m.name}" for m in pkgutil.iter_modules([str(PACKAGE_DIR / folder)]) if not m.ispkg]
    for name in names:
        importlib.import_module(f"conveyor.{name}")
    return [name for name in names if name not in NOT_OPS and (not name.startswith("core.") or name in CORE_OPS)]


def test_the_index_names_every_op_module_and_what_it_exports():
    modules = every_op_module()
    assert sorted(MODULES) == sorted(modules)
    for name, module in PUBLIC.items():
        assert hasattr(importlib.import_module(f"conveyor.{module}"), name), (name, module)


def test_the_index_names_every_functional_name_where_it_is_registered():
    every_op_module()  # every op registered now
    iter_index = {name: module for module, (_, names) in MODULES.items() for name in names}
    assert conveyors_own(IterDataPipe._functional_names) == iter_index
    map_index = {name: module for module, names in MAP_FUNCTIONAL.items() for name in names}
    assert conveyors_own(MapDataPipe._functional_names) == map_index


def conveyors_own(functional_names: dict[str, type]) -> dict[str, str]:
    """Each functional name a conveyor module registered, and that module (``pipes.batch``);
    names a test module registered itself (``register_functional`` in test_pipes.py,
    which under ``pytest -n`` may run first in this process) are the user's, not the
    index's."""
    return {
        name: op.__module__.removeprefix("conveyor.")
        for name, op in functional_names.items()
        if op.__module__.startswith("conveyor.")
    }


def test_the_package_exports_the_index_and_types_it():
    assert sorted(conveyor.pipes.__all__) == sorted(["DataPipe", "IterDataPipe", "MapDataPipe", *PUBLIC])
    assert set(conveyor.pipes.__all__) <= set(dir(conveyor.pipes))
    tree = ast.parse((PACKAGE_DIR / "pipes" / "__init__.py").read_text())
    checked = next(node for node in tree.body if isinstance(node, ast.If))  # if TYPE_CHECKING:
    typed = {
        alias.name: node.module.removeprefix("conveyor.")
        for node in checked.body
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }
    assert typed == PUBLIC
    for name in conveyor.pipes.__all__:
        assert getattr(conveyor.pipes, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        conveyor.pipes.Nope  # noqa: B018


def test_import_conveyor_loads_no_op_it_does_not_need_and_a_first_use_loads_it():
    out = run(
        """
        import sys
        import conveyor
        from conveyor.pipes import IterDataPipe, IterableWrapper
        lazy = ["io.archives", "io.compression", "io.text_formats", "io.images", "io.webdataset", "io.parquet"]
        lazy += ["grouping", "splitters"]
        print(sorted(m for m in lazy if f"conveyor.pipes.{m}" in sys.modules))
        stub = IterDataPipe.__dict__["parse_csv"]
        print(stub.__name__, "conveyor.pipes.io.text_formats" in stub.__doc__)
        pipe = IterableWrapper([("a.csv", __import__("io").StringIO("1,2\\n3,4\\n"))]).parse_csv()
        print(type(pipe).__name__, list(pipe))
        print(IterDataPipe.__dict__["parse_csv"] is not stub, "conveyor.pipes.io.text_formats" in sys.modules)
        from conveyor.pipes import WebDataset
        print(WebDataset.__module__)
        """
    )
    assert out.splitlines() == [
        "[]",
        "parse_csv True",
        "CSVParser [['1', '2'], ['3', '4']]",
        "True True",
        "conveyor.pipes.io.webdataset",
    ]


def test_a_users_op_cannot_take_a_name_of_ours_that_is_not_loaded_yet():
    """As when every op was loaded with conveyor: the name is taken."""
    out = run(
        """
        import sys
        from conveyor.pipes import IterDataPipe
        assert "conveyor.pipes.io.text_formats" not in sys.modules
        try:
            @IterDataPipe.register_functional("parse_csv")
            class Mine(IterDataPipe):
                pass
        except ValueError as error:
            print(error)
        """
    )
    assert "functional name 'parse_csv' is already taken" in out


def test_a_users_op_registered_on_a_subclass_cannot_take_a_name_of_ours_either():
    """A subclass shares the registry of IterDataPipe (or MapDataPipe): the same names."""
    out = run(
        """
        from conveyor.pipes import IterDataPipe, MapDataPipe

        class Base(IterDataPipe):
            pass

        class MapBase(MapDataPipe):
            pass

        for kind, name in ((Base, "parse_csv"), (MapBase, "shuffle")):
            try:
                kind.register_functional(name)(type("Mine", (kind,), {}))
            except ValueError as error:
                print(error)
        """
    )
    assert "functional name 'parse_csv' is already taken" in out
    assert "functional name 'shuffle' is already taken" in out


def test_fork_and_spawn_workers_run_ops_first_used_in_the_main_process():
    out = run(
        """
        import multiprocessing, sys
        from conveyor import DataLoader2, MultiProcessingReadingService
        from conveyor.pipes import IterableWrapper

        if __name__ == "__main__":
            for method in ("fork", "spawn"):
                pipe = IterableWrapper(range(12)).sharding_filter().batch(3).unbatch().enumerate()
                service = MultiProcessingReadingService(2, multiprocessing_context=method)
                with DataLoader2(pipe, reading_service=service) as loader:
                    print(method, sorted(x for _, x in loader))
        """
    )
    assert out.splitlines() == [f"{method} {list(range(12))}" for method in ("fork", "spawn")]
