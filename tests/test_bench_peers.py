"""``benchmarks/bench_peers.py``, run tiny with the loaders that need no peer venv
(conveyor, torch, the bare bound): it prints a row per loader and workload and passes its
exactly-once check; a run that delivers a wrong set fails it (exit 1); the check itself
catches missing, repeated, malformed and wrong items; the measurement counts the CPU of a
descendant orphaned before it ends. Timings are never asserted."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPT = BENCHMARKS / "bench_peers.py"
NUMBER = r"[\d,]+(\.\d)?"


@pytest.fixture
def peers_work(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import peers_work

    yield peers_work


def table_rows(out: str, workload: str) -> dict[str, list[str]]:
    """The cells of ``workload``'s table, by loader label."""
    block = out.split(f"\n{workload}: ", 1)[1].splitlines()[1:]
    lines = block[: next(i for i, line in enumerate(block) if not line.startswith("|"))]
    assert lines[0].startswith("| loader ") and lines[1].startswith("|---"), lines
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    return {row[0]: row[1:] for row in rows}


def run_bench(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(SCRIPT), "--quick", *args]
    return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=110, check=False)


@pytest.mark.timeout(120)
def test_quick_run_reports_every_row_and_passes_its_check(tmp_path: Path) -> None:
    done = run_bench(tmp_path, "--loaders", "conveyor,torch,bare")
    out = done.stdout
    assert done.returncode == 0, done.stderr[-3000:]
    assert "settings: workloads=small,arrays,compute loaders=bare,conveyor,torch workers=2 repeats=1 quick;" in out
    sized = re.search(r"^compute op sized for ~200 µs: ([\d,]+) samples, [\d,.]+ µs per call measured here$", out, re.M)
    assert sized, out[:2000]
    samples = sized.group(1)
    op_line = rf"^compute op: [\d,.]+ µs of CPU per item \({samples} samples\), measured over 400 items"
    assert re.search(op_line, out, re.M)
    spread_free = rf"{NUMBER}"  # one run: no spread
    for workload, labels in {
        "small": ["conveyor DataLoader2", "torch DataLoader"],
        "arrays": ["conveyor DataLoader2", "torch DataLoader"],
        "compute": ["bare bound: 2 forked processes", "conveyor DataLoader2", "torch DataLoader"],
    }.items():
        rows = table_rows(out, workload)
        assert list(rows) == labels, (workload, rows)  # no Grain or nodes row: not asked for
        for label, (rate, ratio, cpu, first, pss) in rows.items():
            assert re.fullmatch(spread_free, rate) and re.fullmatch(spread_free, cpu), (label, rate, cpu)
            assert re.fullmatch(r"\d+\.\d\dx", ratio), (label, ratio)
            assert re.fullmatch(NUMBER, pss), (label, pss)
            assert first == "-" if label.startswith("bare") else re.fullmatch(NUMBER, first), (label, first)
        assert rows["conveyor DataLoader2"][1] == "1.00x"
    assert re.search(r"^conveyor vs the bare bound: [\d.]+% of its items/s .*; CPU per item [\d.]+x", out, re.M)
    assert re.search(r"^small: conveyor items/s >= 30x torch's: [\d.]+x, (held|missed)$", out, re.M)
    assert re.search(r"^compute: conveyor CPU per item <= 1.1x the bare work's: [\d.]+x, (held|missed)$", out, re.M)
    assert "failed:" not in out
    assert out.rstrip().splitlines()[-1] == "verification passed: every run delivered every item exactly once"


@pytest.mark.timeout(120)
def test_a_run_missing_an_item_fails_the_benchmark(tmp_path: Path) -> None:
    done = run_bench(tmp_path, "--workloads", "compute", "--loaders", "conveyor,bare", "--drop-one", "conveyor")
    out = done.stdout
    assert done.returncode == 1, (out, done.stderr[-3000:])
    rows = table_rows(out, "compute")
    assert rows["conveyor DataLoader2"][0].startswith("failed: run 1: 399 item(s) delivered for 400 ids: 1 id(s)")
    assert re.fullmatch(NUMBER, rows["bare bound: 2 forked processes"][0])  # the other loader still counts
    assert "conveyor vs the bare bound: not measured" in out
    assert re.search(r"^failed: conveyor run 1: .*1 id\(s\) never delivered, 0 delivered more than once", out, re.M)
    assert "checksum" in out
    assert out.rstrip().splitlines()[-1] == "verification FAILED: see the failed runs above"


def test_missing_peer_venvs_are_rows_or_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_peers

    monkeypatch.setattr(bench_peers, "VENVS", tmp_path / "no-venvs")
    assert bench_peers.interpreter("grain") == (None, "run benchmarks/peer_envs.sh")
    assert bench_peers.interpreter("conveyor") == (Path(sys.executable), "")
    assert bench_peers.main(["--quick", "--loaders", "nodes", "--require-peers"]) == 2
    assert "no venv for nodes under" in capsys.readouterr().err
    # no run starts: every loader asked for is unavailable
    assert bench_peers.main(["--quick", "--workloads", "small", "--loaders", "grain,nodes"]) == 0
    rows = table_rows(capsys.readouterr().out, "small")
    assert rows == {
        "Grain mp_prefetch": ["unavailable: run benchmarks/peer_envs.sh", "", "", "", ""],
        "torchdata.nodes ParallelMapper": ["unavailable: run benchmarks/peer_envs.sh", "", "", "", ""],
    }
    env = bench_peers.child_env("nodes")
    assert "PYTHONPATH" not in env and bench_peers.child_env("conveyor") == dict(os.environ)


def test_the_check_catches_missing_repeated_malformed_and_wrong_items(peers_work) -> None:
    w = peers_work
    tally = w.Tally("small", 3)
    for i in range(3):
        tally.see(w.plus_one(i))
    assert w.check_delivery(tally.summary(), 3, w.expected_checksum("small", 3)) == []

    tally = w.Tally("small", 3)
    for item in (1, 2, 2, "3"):  # id 1 twice, id 2 never (a str instead)
        tally.see(item)
    problems = w.check_delivery(tally.summary(), 3, w.expected_checksum("small", 3))
    assert problems[0] == "4 item(s) delivered for 3 ids: 1 id(s) never delivered, 1 delivered more than once"
    assert problems[1] == "1 malformed item(s): item 4: expected an int, got '3'"
    assert problems[2] == "checksum 5 != 6: some values are wrong"

    tally = w.Tally("arrays", 2)
    tally.see(w.array_mib(0))
    spoiled = w.array_mib(1)
    spoiled[-1] = 7
    tally.see(spoiled)
    problems = w.check_delivery(tally.summary(), 2, w.expected_checksum("arrays", 2))
    assert "1 malformed item(s): item 2: expected an int64 array of 131072 equal elements, got ndarray" in problems

    tally = w.Tally("compute", 2)
    tally.see(w.compute(0))
    tally.see([1, w.compute_value(1) + 1.0])  # a list is a pair (torch's default_convert); its value is wrong
    problems = w.check_delivery(tally.summary(), 2, w.expected_checksum("compute", 2))
    assert len(problems) == 1 and problems[0].startswith("checksum ") and problems[0].endswith("some values are wrong")


def test_the_compute_op_is_sized_from_its_measured_cost(peers_work) -> None:
    w = peers_work
    # The two lengths nearest by the scaled estimate are measured, and the closer wins: at
    # either end those are the two extreme lengths, which a loaded machine may rank either way.
    assert w.size_for(1e-9)[0] in w.COMPUTE_SIZES[:2] and w.size_for(1.0)[0] in w.COMPUTE_SIZES[-2:]
    size, seconds = w.size_for(w.op_seconds(8192))
    assert size in w.COMPUTE_SIZES and seconds > 0
    assert w.compute_value(3, 4096) != w.compute_value(3, 8192)  # the size is the work
    assert w.expected_checksum("compute", 3, 4096) == math.fsum(w.compute_value(i, 4096) for i in range(3))


def test_bare_tallies_merge_across_workers(peers_work) -> None:
    import pickle

    w = peers_work
    halves = [w.Tally("compute", 4), w.Tally("compute", 4)]
    for i in range(4):
        halves[i % 2].see(w.compute(i))
    merged = w.Tally("compute", 4)
    for half in halves:
        merged.merge(pickle.loads(pickle.dumps(half)))  # as the bare workers send them
    assert w.check_delivery(merged.summary(), 4, w.expected_checksum("compute", 4)) == []
    assert merged.summary()["count"] == 4 and np.isfinite(merged.summary()["checksum"])


@pytest.mark.timeout(60)
def test_the_cpu_of_an_orphaned_descendant_is_counted(tmp_path: Path) -> None:
    """The child forks a grandchild and exits at once; the grandchild burns 0.3 s of CPU,
    re-parented to the measuring process (run in a process of its own: it becomes a
    subreaper and reaps its children)."""
    burn = textwrap.dedent(
        """
        import os, time
        if os.fork() == 0:
            while time.process_time() < 0.3:
                pass
            os._exit(0)
        os._exit(0)
        """
    )
    measure = textwrap.dedent(
        f"""
        import json, os, sys
        sys.path.insert(0, {str(BENCHMARKS)!r})
        import peers_measure
        result = peers_measure.measure_child([sys.executable, "-c", {burn!r}], dict(os.environ), 30)
        print(json.dumps([result.exit_code, result.cpu_s, result.peak_pss_bytes, result.samples, result.problems]))
        """
    )
    done = subprocess.run([sys.executable, "-c", measure], capture_output=True, text=True, timeout=50, check=True)
    exit_code, cpu_s, peak, samples, problems = json.loads(done.stdout)
    assert exit_code == 0 and problems == []
    assert cpu_s >= 0.3  # the grandchild's CPU, which the child never reaped
    assert peak > 0 and samples >= 1
