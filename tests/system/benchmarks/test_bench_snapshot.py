"""``benchmarks/bench_snapshot.py`` through its ``main()``, run tiny with conveyor's loaders
(no torchdata venv needed): every epoch delivers every item exactly once, with a state after
every batch in the snapshot runs; its result holds the machine, versions, commit, every
run's figures and the derived overheads; torchdata's rows need the peer venv. Timings are
never asserted."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from bench_helpers import suite, suite_rows

LOADERS = ("conveyor-map", "conveyor-iterable", "conveyor-dl2")


@pytest.fixture
def bench() -> Iterator[ModuleType]:
    pytest.importorskip("torch")
    with suite("bench_snapshot") as module:
        yield module


@pytest.mark.timeout(240)
def test_tiny_run_writes_its_result_and_table(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_file = tmp_path / "snapshot.json"
    argv = ["--items", "96", "--batch-size", "8", "--compute-size", "3072", "--repeats", "1"]
    argv += ["--loaders", ",".join(LOADERS), "--out", str(out_file)]
    assert bench.main(argv) == 0, capsys.readouterr().err[-3000:]
    out = capsys.readouterr().out
    assert out.rstrip().splitlines()[-1] == "verification passed: every run delivered every item as it should"
    rows = suite_rows(out)
    for loader in LOADERS:
        label = bench.SUITE.loader(loader).label
        epoch, every = rows[("epoch", label)], rows[("snapshots", label)]
        assert epoch["overhead, wall"] == "-" and re.fullmatch(r"[+-]\d+\.\d%", every["overhead, wall"]), every
        assert re.fullmatch(r"\d+\.\d%", every["in calls, % of epoch CPU"]), every
        assert re.fullmatch(r"[\d,]+", every["state bytes"]) and every["runs ok"] == "1/1", every
        assert re.search(rf"^- target \(<= 2% of the epoch\): {re.escape(label)}: wall .*: (held|missed)$", out, re.M)

    sys.path.insert(0, str(Path(bench.__file__).parent))
    from conveyor.tools.bench.harness.results import Result

    saved = Result.read(out_file)
    assert saved.settings["compute_size"] == 3072 and saved.settings["batch_size"] == 8
    for loader in LOADERS:
        snapshots = saved.entry("snapshots", loader)
        assert snapshots is not None and snapshots.status == "ok"
        m = snapshots.metrics
        assert m["calls"].median == m["batches"].median == 96 // 8  # a state after every batch
        assert m["state_bytes"].median > 0 and m["state_dict_us"].median > 0
        assert {"conveyor", "torch", "numpy", "python"} <= set(snapshots.versions)
        epoch = saved.entry("epoch", loader)
        assert epoch is not None and epoch.metrics["calls"].median == 0


def test_a_run_without_a_state_after_every_batch_fails(bench: ModuleType) -> None:
    run = {"workload": "snapshots", "extra": {"calls": 3, "batches": 4}}
    assert bench.check(run) == ["3 state_dict() calls for 4 batches"]
    assert bench.check({**run, "workload": "epoch"}) == []


def test_torchdata_runs_from_the_peer_venv(
    bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from conveyor.tools.bench.harness import orchestrate

    monkeypatch.setattr(orchestrate, "VENVS", tmp_path / "no-venvs")
    torchdata = bench.SUITE.loader("torchdata-map")
    assert torchdata.venv == "nodes" and orchestrate.interpreter(torchdata) == (None, "run benchmarks/peer_envs.sh")
    monkeypatch.setenv("PYTHONPATH", "src")
    assert "PYTHONPATH" not in orchestrate.child_env(torchdata)
    assert orchestrate.child_env(bench.SUITE.loader("conveyor-dl2"))["PYTHONPATH"] == "src"


def test_arguments_are_validated(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in [
        (["--loaders", "conveyor-map,nope"], "--loaders: unknown or none: 'nope'"),
        (["--repeats", "0"], "--repeats must be >= 1, got 0"),
        (["--compute-size", "5"], "argument --compute-size: invalid choice: 5"),
        (["--batch-size", "0"], "argument --batch-size: must be > 0, got 0"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            bench.main(argv)
        assert exit_info.value.code == 2, argv
        assert message in capsys.readouterr().err, argv
