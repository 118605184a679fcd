"""Reading ``conveyor bench``'s report in tests; loading a benchmark suite (a script of
``benchmarks/``) as a module, running its ``main()`` and reading the table it prints."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

RATIO = re.compile(r"\d+\.\d\dx")
#: The workloads whose items are bulk data: their tables have a MiB/s column.
BULK = ("numpy", "tensor", "demo")


@contextmanager
def loaded_script(path: Path) -> Iterator[ModuleType]:
    """A benchmark script imported as a module named after its file, registered in
    ``sys.modules`` while in use (its dataclasses look their module up there), with its
    folder first on ``sys.path`` meanwhile, as when it runs as a script (it imports the
    modules beside it)."""
    folder = str(path.parent)
    sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]
        sys.path.remove(folder)


@contextmanager
def suite(name: str) -> Iterator[ModuleType]:
    """``benchmarks/<name>.py`` as a module, with the environment as it was once done (a
    suite's settings hand values to its runs through the environment)."""
    saved = dict(os.environ)
    try:
        with loaded_script(BENCHMARKS / f"{name}.py") as module:
            yield module
    finally:
        os.environ.clear()
        os.environ.update(saved)


def suite_rows(out: str) -> dict[tuple[str, str], dict[str, str]]:
    """The results table a suite printed: ``{(workload, loader label): {column: cell}}``."""
    lines = [line for line in out.splitlines() if line.startswith("| ")]
    assert lines and lines[0].startswith("| workload | loader |"), out[-3000:]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[1:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[(cells[0], cells[1])] = dict(zip(header[2:], cells[2:], strict=True))
    return rows


def torchdata_importable() -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            importlib.import_module("torchdata.dataloader2")
    except Exception:  # missing, or broken against this torch: the bench reports it as unavailable
        return False
    return True


def section(out: str, workload: str) -> str:
    """``workload``'s part of the report, from its title on."""
    return out.split(f"\n{workload}: ", 1)[1]


def table_rows(out: str, workload: str) -> list[list[str]]:
    """The cells of every row of ``workload``'s table (header and separator excluded)."""
    block = section(out, workload).splitlines()[2:]
    lines = block[: next((i for i, line in enumerate(block) if not line.startswith("|")), len(block))]
    assert lines[0].startswith("| loader ") and lines[1].startswith("|---")
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


def row(rows: list[list[str]], prefix: str) -> list[str]:
    found = [r for r in rows if r[0].startswith(prefix)]
    assert len(found) == 1, (prefix, rows)
    return found[0]


def check_passing_section(out: str, workload: str) -> list[list[str]]:
    """Assert what a run where every loader passed prints for ``workload`` (one run per
    loader): the rows' numbers and their formats, the ratio rows, and the check line saying
    that every loader's runs passed. Returns the table's rows."""
    rows = table_rows(out, workload)
    conveyor = row(rows, "conveyor DataLoader2")
    assert conveyor[-1] == "ok (1 run)"
    assert re.fullmatch(r"[\d,]+", conveyor[3])  # items/s
    assert re.fullmatch(r"[\d,]+" if workload in BULK else "-", conveyor[4])  # MiB/s
    assert re.fullmatch(r"\d+\.\d\d", conveyor[5])  # CPU s
    assert re.fullmatch(r"[\d,]+\.\d", conveyor[6])  # CPU µs/item
    assert re.fullmatch(r"[\d,]+\.\d", conveyor[7])  # first item ms
    assert re.fullmatch(r"[\d,]+\.\d", conveyor[8])  # peak PSS MiB
    assert row(rows, "torch ")[-1] == "ok (1 run)"
    compared = [row(rows, "ratio conveyor vs torch ")]
    torchdata = row(rows, "torchdata")
    if torchdata_importable():
        assert torchdata[-1] == "ok (1 run)"
        compared.append(row(rows, "ratio conveyor vs torchdata"))
    else:
        assert torchdata[-1].startswith("unavailable: ")
        assert row(rows, "ratio conveyor vs torchdata")[-1] == "torchdata unavailable"
    for ratios in compared:
        assert all(RATIO.fullmatch(ratios[i]) for i in (3, 6, 7, 8)), ratios  # items/s, CPU/item, first item, PSS
        assert RATIO.fullmatch(ratios[4]) if workload in BULK else ratios[4] == "-", ratios  # MiB/s
    check = section(out, workload).split("\ncheck: ", 1)[1].splitlines()[0]
    assert check.startswith("every run of conveyor DataLoader2, torch "), check
    return rows
