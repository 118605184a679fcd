"""``benchmarks/bench_peers.py`` through its ``main()``, run tiny with the loaders that need
no peer venv (conveyor, torch, the bare bound): a row per loader and workload, the issue's
targets as text, a result file in the benchmarks' schema, and its exactly-once check; a
run that delivers a wrong set fails it (exit 1); a missing peer venv is a row, or exit 2
with ``--require-peers``. Timings are never asserted."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from bench_helpers import suite, suite_rows

NUMBER = r"[\d,]+(\.\d)?"


@pytest.fixture
def bench() -> Iterator[ModuleType]:
    with suite("bench_peers") as module:
        yield module


@pytest.mark.timeout(120)
def test_quick_run_reports_every_row_and_passes_its_check(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_file = tmp_path / "peers.json"
    assert bench.main(["--quick", "--loaders", "conveyor,torch,bare", "--out", str(out_file)]) == 0
    out = capsys.readouterr().out
    assert "settings: workloads=small,arrays,compute,images loaders=bare,conveyor,torch repeats=1 quick;" in out
    sized = re.search(r"^compute op sized for ~200 µs: ([\d,]+) samples, [\d,.]+ µs per call measured here$", out, re.M)
    assert sized, out[:2000]
    op_line = rf"^compute op: [\d,.]+ µs of CPU per item \({sized.group(1)} samples\), measured over 400 items"
    assert re.search(op_line, out, re.M)
    rows = suite_rows(out)
    expected = {
        "small": ["conveyor DataLoader2", "torch DataLoader"],
        "arrays": ["conveyor DataLoader2", "torch DataLoader"],
        "compute": ["bare bound: 2 forked processes", "conveyor DataLoader2", "torch DataLoader"],
        "images": ["conveyor DataLoader2", "torch DataLoader"],
    }
    assert list(rows) == [(w, label) for w, labels in expected.items() for label in labels]  # no Grain, no nodes
    for (_, label), cells in rows.items():
        assert all(re.fullmatch(NUMBER, cells[c]) for c in ("items/s", "CPU µs/item", "peak PSS MiB")), cells
        assert (
            cells["first item ms"] == "-" if label.startswith("bare") else re.fullmatch(NUMBER, cells["first item ms"])
        )
        ratio = cells["conveyor DataLoader2's items/s ÷ this"]
        assert ratio == "" if label.startswith("conveyor") else re.fullmatch(r"\d+\.\d\dx", ratio), cells
        assert cells["runs ok"] == "1/1"
    assert re.search(r"^- conveyor vs the bare bound: [\d.]+% of its items/s .*; CPU per item [\d.]+x", out, re.M)
    assert re.search(r"^- target: small: conveyor items/s >= 30x torch's: [\d.]+x, (held|missed)$", out, re.M)
    assert re.search(
        r"^- target: compute: conveyor CPU per item <= 1.1x the bare work's: [\d.]+x, (held|missed)$", out, re.M
    )
    assert out.rstrip().splitlines()[-1] == "verification passed: every run delivered every item as it should"

    sys.path.insert(0, str(Path(bench.__file__).parent))
    from conveyor.tools.bench.harness.results import Result

    saved = Result.read(out_file)
    assert (saved.suite, saved.subject, saved.settings["quick"], saved.settings["workers"]) == (
        "peers",
        "conveyor",
        True,
        2,
    )
    assert re.fullmatch(r"[0-9a-f]{40}", saved.commit or "") and isinstance(saved.dirty, bool)
    assert {"system", "arch", "cpu", "cpus", "python", "start_method"} <= set(saved.machine)
    conveyor = saved.entry("compute", "conveyor")
    assert conveyor is not None and conveyor.status == "ok" and conveyor.runs == 1
    assert {"conveyor", "numpy", "python"} <= set(conveyor.versions)
    assert conveyor.metrics["items_per_s"].values == [conveyor.metrics["items_per_s"].median]
    assert saved.metrics["cpu_us_per_item"] == {"label": "CPU µs/item", "unit": "µs/item"}


BOUNDS = ("bare bound: made, one copy into shared memory", "bare bound: filled in place in shared memory")
SHARED = "conveyor DataLoader2, shared_empty"


@pytest.mark.timeout(180)
def test_quick_images_and_arrays_report_the_bounds_and_their_targets(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import conveyor

    out_file = tmp_path / "peers.json"
    loaders = "bare-copy,bare-fill,conveyor,conveyor-shared,conveyor-dl,torch"
    assert bench.main(["--quick", "--workloads", "arrays,images", "--loaders", loaders, "--out", str(out_file)]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().splitlines()[-1] == "verification passed: every run delivered every item as it should"
    rows = suite_rows(out)
    expected = {
        "arrays": [*BOUNDS, "conveyor DataLoader2", SHARED, "torch DataLoader"],
        "images": [*BOUNDS, "conveyor DataLoader2", "conveyor.DataLoader", "torch DataLoader"],
    }
    assert list(rows) == [(w, label) for w, labels in expected.items() for label in labels]
    has_shared = hasattr(conveyor, "shared_empty")
    for (_, label), cells in rows.items():
        if label == SHARED and not has_shared:
            assert cells["items/s"] == "unavailable: conveyor.shared_empty not found: not in this version"
            continue
        assert cells["runs ok"] == "1/1", cells
        for column in ("items/s", "CPU µs/item", "first item ms", "peak PSS MiB"):
            assert re.fullmatch(NUMBER, cells[column]), (label, column, cells)

    sys.path.insert(0, str(Path(bench.__file__).parent))
    from conveyor.tools.bench.harness.results import Result

    saved = Result.read(out_file)
    for entry in saved.entries:
        if entry.status != "ok":
            continue
        delivered = entry.metrics["delivered"].median
        # every id checked once (else the run fails); the images come in batches of <= 64,
        # one short batch per worker at most
        assert delivered == 40 if entry.workload == "arrays" else 5 <= delivered <= 6, (entry.loader, delivered)

    shares = r"[\d.]+% \([\d,]+ vs [\d,]+ items/s\), (held|missed)"
    for line in (
        rf"images: conveyor DataLoader2 items/s >= 90% of the bound's \(bare-copy: .*\): {shares}",
        r"images: conveyor DataLoader2 CPU per item <= 1.15x the bound's \(bare-copy: .*\): [\d.]+x .*, (held|missed)",
        r"images: conveyor DataLoader2 ahead of every peer: [\d.]+x torch DataLoader's; "
        r"not measured: grain not run; nodes not run, not measured",
        r"images: conveyor.DataLoader items/s >= 4.5x torch DataLoader's: [\d.]+x, (held|missed)",
        rf"arrays: conveyor DataLoader2 items/s >= 90% of the bound's \(bare-copy: .*\): {shares}",
        r"arrays: conveyor DataLoader2 peak summed PSS <= 64 MiB: [\d.]+ MiB, (held|missed)",
        rf"arrays: {SHARED} items/s >= 90% of the bound's \(bare-fill: .*\): "
        + (shares if has_shared else r"not measured \(.*unavailable: conveyor.shared_empty not found.*\)"),
    ):
        assert re.search(rf"^- target: {line}$", out, re.M), (line, out[-3000:])


@pytest.mark.timeout(120)
def test_a_run_missing_an_item_fails_the_benchmark(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    code = bench.main(["--quick", "--workloads", "compute", "--loaders", "conveyor,bare", "--drop-one", "conveyor"])
    out = capsys.readouterr().out
    assert code == 1, out
    rows = suite_rows(out)
    failed = rows[("compute", "conveyor DataLoader2")]["items/s"]
    assert failed.startswith("failed: run 1: 399 item(s) delivered for 400 ids: 1 id(s) never"), failed
    assert re.fullmatch(
        NUMBER, rows[("compute", "bare bound: 2 forked processes")]["items/s"]
    )  # the other still counts
    assert "conveyor vs the bare bound: not measured" in out
    assert re.search(
        r"^failed: compute, conveyor run 1: .*1 id\(s\) never delivered, 0 delivered more than once", out, re.M
    )
    assert "checksum" in out
    assert out.rstrip().splitlines()[-1] == "verification FAILED: see the failed runs above"


def test_missing_peer_venvs_are_rows_or_exit_2(
    bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from conveyor.tools.bench.harness import orchestrate

    monkeypatch.setattr(orchestrate, "VENVS", tmp_path / "no-venvs")
    grain, conveyor = bench.SUITE.loader("grain"), bench.SUITE.loader("conveyor")
    assert orchestrate.interpreter(grain) == (None, "run benchmarks/peer_envs.sh")
    assert orchestrate.interpreter(conveyor) == (Path(sys.executable), "")
    assert bench.main(["--quick", "--loaders", "nodes", "--require-peers"]) == 2
    assert "no venv for nodes: run benchmarks/peer_envs.sh" in capsys.readouterr().err
    # no run starts: every loader asked for is unavailable
    assert bench.main(["--quick", "--workloads", "small", "--loaders", "grain,nodes"]) == 0
    rows = suite_rows(capsys.readouterr().out)
    for label in ("Grain mp_prefetch", "torchdata.nodes ParallelMapper"):
        assert rows[("small", label)]["items/s"] == "unavailable: run benchmarks/peer_envs.sh"
        assert rows[("small", label)]["runs ok"] == "-"
    env = orchestrate.child_env(bench.SUITE.loader("nodes"))
    assert "PYTHONPATH" not in env and orchestrate.child_env(conveyor) == dict(os.environ)


def test_bare_tallies_merge_across_workers(bench: ModuleType) -> None:
    import pickle

    from conveyor.tools.bench.harness.tally import check_delivery
    from work import compute as w

    halves = [w.tally_for("compute", 4), w.tally_for("compute", 4)]
    for i in range(4):
        halves[i % 2].see(w.compute(i))
    merged = w.tally_for("compute", 4)
    for half in halves:
        merged.merge(pickle.loads(pickle.dumps(half)))  # as the bare workers send them
    assert check_delivery(merged.summary(), 4, w.expected_checksum("compute", 4)) == []
    assert merged.summary()["count"] == 4


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workload, n", [("arrays", 11), ("images", 150)])
@pytest.mark.parametrize("how", ["copy", "fill"])
def test_the_shared_memory_bounds_deliver_every_item_once(bench: ModuleType, workload: str, n: int, how: str) -> None:
    from conveyor.tools.bench.harness.declare import Context
    from conveyor.tools.bench.harness.tally import check_delivery
    from work import bare
    from work import compute as w

    context = Context(bench.SUITE.workload(workload), None, n, {}, warmup=False)
    epoch = bare.shared_epoch(context, how)
    assert check_delivery(epoch.tally.summary(), n, w.expected_checksum(workload, n)) == []
    per_slot = bare.ARRAY_CHUNK if workload == "arrays" else w.BATCH
    assert epoch.tally.count == (n if workload == "arrays" else -(-n // per_slot))  # a batch is one item
    assert epoch.first_s is not None and 0 < epoch.first_s <= epoch.wall_s


@pytest.mark.timeout(60)
def test_a_failing_bare_worker_fails_the_bound(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    from conveyor.tools.bench.harness.declare import Context, RunError
    from work import bare

    def fill(i: int, out: object) -> None:
        if i == 5:
            raise ValueError("item 5 cannot be made")

    monkeypatch.setitem(bare.FILL_FUNCTIONS, "arrays", fill)  # the forked workers inherit it
    context = Context(bench.SUITE.workload("arrays"), None, 12, {}, warmup=False)
    with pytest.raises(RunError, match=r"^bare worker\(s\) \[1\] failed \(wait status \[256\]\); see stderr$"):
        bare.shared_epoch(context, "fill")
    assert "ValueError: item 5 cannot be made" in capfd.readouterr().err


def test_arguments_are_validated(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in [
        (
            ["--loaders", "conveyor,nope"],
            "--loaders: unknown or none: 'nope'; choose from "
            "bare,bare-copy,bare-fill,conveyor,conveyor-shared,conveyor-dl,torch,grain,nodes",
        ),
        (["--workloads", ""], "--workloads: unknown or none: ''"),
        (["--repeats", "0"], "--repeats must be >= 1, got 0"),
        (["--compute-us", "-1"], "argument --compute-us: must be >= 0, got -1"),
        (["--quick", "--save"], "--quick and --items runs are not saved with the results"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            bench.main(argv)
        assert exit_info.value.code == 2, argv
        assert message in capsys.readouterr().err, argv
