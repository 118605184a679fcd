"""``benchmarks/bench_multiprocessing.py``, run tiny: run as a script it benchmarks the
multiprocessing issue's three workloads by default and prints ``conveyor bench``'s report
for them; its exit code says whether a required loader failed; its ``--workloads`` offers
only those three. How runs are measured and checked is tested in test_bench_cli.py, where
that code lives. Timings are never asserted."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from bench_helpers import check_passing_section, row, table_rows
from conveyor.tools.bench import loaders as bench_loaders
from conveyor.tools.bench import runner as bench_runner
from conveyor.tools.bench.loaders import Loader, Session

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_multiprocessing.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_multiprocessing", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(60)
def test_script_reports_the_three_workloads_by_default(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    command = [sys.executable, str(SCRIPT), "--quick", "--items", "12"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=55, check=False)
    out = done.stdout
    assert done.returncode == 0, done.stderr
    assert re.search(r"^machine: .*, start method \w+; date \d{4}-\d\d-\d\d$", out, re.M)
    assert "settings: quick=yes workloads=small,numpy,tensor workers=2 repeats=1 " in out
    assert [line.split(":")[0] for line in out.splitlines() if " run(s)" in line] == ["small", "numpy", "tensor"]
    for workload in ("small", "numpy", "tensor"):
        check_passing_section(out, workload)
    assert re.search(r"^note: torch \S+ DataLoader yields torch tensors here \(its default_convert\)", out, re.M)
    assert out.rstrip().splitlines()[-1].startswith("verification passed for every run that completed (")
    assert "FAILED" not in out


class Broken(Session):
    """A stand-in loader that raises as it is built."""

    def __init__(self, prepared: Any, workers: int):
        raise RuntimeError("boom")

    def __iter__(self) -> Iterator[Any]:
        raise AssertionError("never built")

    def close(self) -> None:
        raise AssertionError("never built")


MISSING = Loader("missing", "missing loader", "unavailable: ModuleNotFoundError: nope", required=False)


@pytest.mark.timeout(60)
def test_exit_code_is_1_only_when_a_required_loader_fails(
    bench: ModuleType, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(bench_loaders._SESSIONS, "broken", Broken)
    conveyor = Loader("conveyor", "conveyor DataLoader2")
    stand_in = Loader("broken", "torchdata stand-in", required=False)
    monkeypatch.setattr(bench_runner, "available_loaders", lambda: [conveyor, stand_in, MISSING])
    assert bench.main(["--quick", "--items", "6", "--workloads", "numpy", "--workers", "1"]) == 0
    out, err = capsys.readouterr()
    rows = table_rows(out, "numpy")
    assert row(rows, "conveyor DataLoader2")[-1] == "ok (1 run)"
    assert row(rows, "torchdata stand-in")[-1] == "failed (warm-up): RuntimeError: boom"
    assert row(rows, "missing loader")[-1] == "unavailable: ModuleNotFoundError: nope"
    assert row(rows, "ratio conveyor vs torchdata stand-in")[-1] == "broken failed"
    assert row(rows, "ratio conveyor vs missing loader")[-1] == "missing unavailable"
    assert "RuntimeError: boom" in err  # the traceback
    assert "verification passed" in out

    # conveyor is required: its failure makes the exit code 1, and every ratio row says why it has no numbers.
    monkeypatch.setitem(bench_loaders._SESSIONS, "conveyor", Broken)
    monkeypatch.setattr(bench_runner, "available_loaders", lambda: [conveyor, MISSING])
    assert bench.main(["--quick", "--items", "6", "--workloads", "numpy"]) == 1
    out = capsys.readouterr().out
    assert row(table_rows(out, "numpy"), "ratio conveyor vs missing loader")[-1] == "conveyor failed"
    assert "verification FAILED for numpy (2 workers): conveyor DataLoader2" in out


@pytest.mark.timeout(30)
def test_arguments_are_validated(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in [
        (["--workloads", "small,huge"], "unknown workload(s) huge; choose from small,numpy,tensor\n"),
        (["--workloads", "cpu"], "unknown workload(s) cpu; choose from small,numpy,tensor\n"),  # not the issue's
        (["--workers", "-1"], "argument --workers: must be >= 0, got -1"),
        (["--repeats", "0"], "argument --repeats: must be >= 1, got 0"),
        (["--cap-seconds", "0"], "argument --cap-seconds: must be > 0"),
        (["--data-dir", "d"], "unrecognized arguments: --data-dir d"),  # only the demo workload reads files
    ]:
        with pytest.raises(SystemExit) as exit_info:
            bench.main(argv)
        assert exit_info.value.code == 2, argv
        assert message in capsys.readouterr().err, argv
