"""``benchmarks/bench_snapshot.py``, run tiny with conveyor's loaders only (no torchdata
venv needed): its ``main()`` writes JSON holding the machine, versions, commit and every
run, each epoch delivered every item exactly once, and ``--table`` prints the table from
that JSON; the other conveyor loaders' epochs (run in this process, to keep the test
short: each fresh process imports torch) deliver every item once too, with a state after
every batch. A run that delivers a wrong set is refused by the check. Timings are never
asserted."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from bench_helpers import loaded_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_snapshot.py"
#: The loader main() runs (each run is a fresh process); the others run in this process.
MAIN_CASE = "conveyor-map"


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    pytest.importorskip("torch")
    with loaded_script(SCRIPT) as module:
        yield module


@pytest.mark.timeout(180)
def test_tiny_run_writes_its_json_and_table(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "snapshot.json"
    argv = ["--items", "96", "--batch-size", "8", "--repeats", "1", "--compute-size", "3072"]
    argv += ["--loaders", MAIN_CASE, "--out", str(out)]
    assert bench.main(argv) == 0, capsys.readouterr().err[-3000:]
    printed = capsys.readouterr().out
    assert printed.rstrip().endswith("verification passed for every run")

    result = json.loads(out.read_text())
    assert result["benchmark"] == "bench_snapshot"
    assert re.fullmatch(r"[0-9a-f]{40}", result["git"]["commit"]) and isinstance(result["git"]["dirty"], bool)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d", result["date"])
    assert {"system", "machine", "cpu", "cpus_usable", "python", "start_method"} <= set(result["machine"])
    assert {"conveyor", "torch", "numpy"} <= set(result["versions"])
    settings = result["settings"]
    assert (settings["items"], settings["batch_size"], settings["workers"], settings["repeats"]) == (96, 8, 2, 1)
    assert settings["compute_size"] == 3072
    assert result["command"] == "python benchmarks/bench_snapshot.py " + " ".join(argv)

    assert [row["case"] for row in result["rows"]] == [MAIN_CASE]
    for row in result["rows"]:
        assert row["unavailable"] is None and row["failures"] == [], row["failures"]
        assert row["serialiser"] == "json.dumps"
        assert {"conveyor", "torch", "numpy", "python"} <= set(row["versions"])
        for mode in ("off", "every"):
            (run,) = row["runs"][mode]
            for tally, n in ((run["tally"], 96), (run["warmup"]["tally"], settings["warmup_items"])):
                # every item delivered exactly once, none malformed
                assert (tally["count"], tally["once"], tally["missing"], tally["bad"]) == (n, n, 0, 0), (mode, tally)
            assert run["stray"] == 0 and run["warmup"]["stray"] == 0
            assert run["calls"] == (run["batches"] if mode == "every" else 0)
            assert run["wall_s"] > 0 and run["cpu_s"] > 0
        summary = row["summary"]
        assert summary["calls"] >= 96 // 8
        assert summary["state_bytes"] > 0 and summary["state_dict_us"] > 0 and summary["call_us"] > 0
        for key in ("wall_overhead_pct", "wall_overhead_paired_pct", "cpu_overhead_pct", "in_calls_pct"):
            assert isinstance(summary[key], float)

    assert bench.main(["--table", str(out)]) == 0
    table = capsys.readouterr().out
    assert table.startswith(result["date"])
    for row in result["rows"]:
        line = next(line for line in table.splitlines() if line.startswith(f"| {row['label']} |"))
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        assert len(cells) == len(bench.HEADER) and cells[-1] == "2/2", cells
        assert cells[1] == "`json.dumps`" and re.fullmatch(r"[+-]\d+\.\d% \([+-]\d+\.\d%\)", cells[4]), cells


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", ["conveyor-iterable", "conveyor-dl2"])
def test_every_conveyor_loader_delivers_every_item_once(bench: ModuleType, case: str) -> None:
    run = bench.epoch(case, "every", 100, 8)  # short last batches: each worker has 50 items
    assert run["tally"]["count"] == run["tally"]["once"] == 100 and run["tally"]["bad"] == 0, run["tally"]
    expected = bench.expected_checksum("compute", 100, None)
    assert bench.check_delivery(run["tally"], 100, expected) == []
    assert run["calls"] == run["batches"] and run["stray"] == 0
    assert run["state_bytes"] > 0


def test_a_wrong_delivery_fails_the_run(bench: ModuleType) -> None:
    tally = bench.Tally("compute", 3)
    for i in (0, 1, 1):
        tally.see(bench.compute(i))
    expected = bench.expected_checksum("compute", 3, None)
    problems = bench.check_delivery(tally.summary(), 3, expected)
    assert problems and "1 id(s) never delivered, 1 delivered more than once" in problems[0]


def test_arguments_are_validated(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in [
        (["--loaders", "conveyor-map,nope"], "--loaders: unknown or none: 'nope'"),
        (["--repeats", "0"], "--repeats must be >= 1, got 0"),
        (["--compute-size", "5"], "--compute-size must be one of"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            bench.main(argv)
        assert exit_info.value.code == 2, argv
        assert message in capsys.readouterr().err, argv


def test_torchdata_runs_from_the_peer_venv(bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench.peers, "VENVS", tmp_path / "no-venvs")
    assert bench.interpreter("torchdata-map") == (None, "run benchmarks/peer_envs.sh")
    assert bench.interpreter("conveyor-map")[0] is not None
    monkeypatch.setenv("PYTHONPATH", "src")
    assert "PYTHONPATH" not in bench.child_env("torchdata-iterable")
    assert bench.child_env("conveyor-dl2")["PYTHONPATH"] == "src"
