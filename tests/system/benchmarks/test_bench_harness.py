"""The harness every benchmark runs on (``conveyor.tools.bench.harness``): its tally catches
missing, repeated, malformed and wrong items; a run fails when a loader raises, spoils its
last item at its shutdown or leaves a process behind it, and a capped run says so; its
measurement counts the CPU of a descendant orphaned before it ends, and leaves the
process as it found it; results keep one schema, which refuses what does not fit it; the
tables are generated from results, and ``benchmarks/README.md`` holds exactly what the
generator makes of the stored results. Timings are never asserted."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import conveyor.tools.bench.harness
from bench_helpers import BENCHMARKS, loaded_script
from conveyor.tools.bench.harness import orchestrate
from conveyor.tools.bench.harness.declare import Loader
from conveyor.tools.bench.harness.orchestrate import build_result, interpreter, run_suite
from conveyor.tools.bench.harness.results import RESULTS, Entry, Metric, Result, metric_definitions, validate
from conveyor.tools.bench.harness.tables import COMMAND, README, readme_text, render
from conveyor.tools.bench.harness.tally import Tally, check_delivery


@pytest.fixture(scope="module", autouse=True)
def importable() -> Iterator[None]:
    """The peers' workloads (``benchmarks/work``) importable, as in a suite's run."""
    sys.path.insert(0, str(BENCHMARKS))
    yield
    sys.path.remove(str(BENCHMARKS))


def test_the_tally_catches_missing_repeated_malformed_and_wrong_items() -> None:

    tally = Tally(3)
    for i in (2, 0, 1):
        tally.see(i)
    assert check_delivery(tally.summary(), 3, None) == []

    tally = Tally(3)
    for item in (0, 1, 1, "2", 7):  # id 1 twice, id 2 never (a str instead), 7 outside
        tally.see(item)
    problems = check_delivery(tally.summary(), 3, None)
    assert problems[0] == "5 item(s) delivered for 3 ids: 1 id(s) never delivered, 1 delivered more than once"
    assert (
        problems[1]
        == "2 malformed item(s): item 4: expected an int, got '2'; item 5: expected an id in range(3), got 7"
    )

    tally = Tally(2, times=3)  # three epochs: each id three times
    for _ in range(3):
        tally.ids([0, 1])
    assert check_delivery(tally.summary(), 2, None) == []
    tally.id(0)
    assert "1 delivered other than 3 times" in check_delivery(tally.summary(), 2, None)[0]


def test_the_checksum_is_exact_for_ints_and_order_free_for_floats() -> None:

    ints, floats = Tally(2), Tally(2)
    for i in (0, 1):
        ints.add(10 + i)
        floats.add(0.1 * (i + 1))
        ints.id(i)
        floats.id(i)
    assert check_delivery(ints.summary(), 2, 21) == []
    assert check_delivery(ints.summary(), 2, 22) == ["checksum 21 != 22: some values are wrong"]
    assert check_delivery(floats.summary(), 2, math.fsum([0.2, 0.1])) == []
    assert check_delivery(floats.summary(), 2, 0.4)[0].endswith("some values are wrong")


def test_a_tally_may_expect_fewer_ids_or_no_checksum() -> None:

    summary = {"count": 2, "right": 2, "missing": 1, "bad": 0, "checksum": None, "problems": [], "expected": 2}
    assert check_delivery(summary, 3, 99) == []  # two of three ids expected, no sum to compare
    summary["right"] = 1
    assert check_delivery(summary, 3, 99)[0].startswith("2 item(s) delivered for 2 ids")


def test_the_peer_workloads_check_their_items() -> None:
    from work import compute as w

    tally = w.tally_for("small", 3)
    for item in (1, 2, 2):  # id 1 twice, id 2 never
        tally.see(item)
    problems = check_delivery(tally.summary(), 3, w.expected_checksum("small", 3))
    assert "1 id(s) never delivered, 1 delivered more than once" in problems[0]
    assert problems[1] == "checksum 5 != 6: some values are wrong"

    tally = w.tally_for("arrays", 2)
    tally.see(w.array_mib(0))
    spoiled = w.array_mib(1)
    spoiled[-1] = 7
    tally.see(spoiled)
    problems = check_delivery(tally.summary(), 2, w.expected_checksum("arrays", 2))
    assert "1 malformed item(s): item 2: expected an int64 array of 131072 equal elements, got ndarray" in problems

    tally = w.tally_for("compute", 2)
    tally.see(w.compute(0))
    tally.see([1, w.compute_value(1) + 1.0])  # a list is a pair (torch's default_convert); its value is wrong
    problems = check_delivery(tally.summary(), 2, w.expected_checksum("compute", 2))
    assert len(problems) == 1 and problems[0].startswith("checksum ") and problems[0].endswith("some values are wrong")


def test_the_images_batches_name_their_ids_and_are_checked() -> None:
    import numpy as np

    from work import compute as w

    batch = w.stack_images([5, 70_000, 3])
    made = np.empty_like(batch)
    for j, i in enumerate((5, 70_000, 3)):
        w.fill_image(i, made[j])
    assert np.array_equal(made, batch)  # the bounds' in-place work makes the loaders' items
    tally = w.tally_for("images", 70_001)
    tally.see(batch)
    assert tally.summary()["checksum"] == 70_008 and tally.counts[70_000] == 1 and tally.counts[5] == 1

    tally = w.tally_for("images", 4)
    tally.see(w.stack_images([0, 1]))
    spoiled = w.stack_images([2, 3])
    spoiled[1, 112, 112, 1] += 1  # image 3's middle byte
    tally.see(spoiled)
    tally.see(np.zeros((2, 224, 224), np.uint8))  # not images
    summary = tally.summary()
    assert summary["bad"] == 2
    assert summary["problems"][0] == "item 2: expected images filled with their id's value, got 'batch 2'"
    assert summary["problems"][1].startswith("item 3: expected a batch of <= 64 images, got 'ndarray (2, 224, 224)'")
    assert "2 id(s) never delivered" in check_delivery(summary, 4, w.expected_checksum("images", 4))[0]


def test_a_loader_may_need_a_name_its_library_does_not_have_yet() -> None:

    assert interpreter(Loader("a", "a", needs=("json:dumps",))) == (Path(sys.executable), "")
    assert interpreter(Loader("b", "b", needs=("json:no_such_name",))) == (
        None,
        "json.no_such_name not found: not in this version",
    )
    assert interpreter(Loader("c", "c", needs=("no_such_module_here:x",)))[0] is None


def test_the_compute_op_is_sized_from_its_measured_cost() -> None:
    from work import compute as w

    # The two lengths nearest by the scaled estimate are measured, and the closer wins: at
    # either end those are the two extreme lengths, which a loaded machine may rank either way.
    assert w.size_for(1e-9)[0] in w.COMPUTE_SIZES[:2] and w.size_for(1.0)[0] in w.COMPUTE_SIZES[-2:]
    size, seconds = w.size_for(w.op_seconds(8192))
    assert size in w.COMPUTE_SIZES and seconds > 0
    assert w.compute_value(3, 4096) != w.compute_value(3, 8192)  # the size is the work
    assert w.expected_checksum("compute", 3, 4096) == math.fsum(w.compute_value(i, 4096) for i in range(3))


@pytest.mark.timeout(60)
def test_the_cpu_of_an_orphaned_descendant_is_counted() -> None:
    """The child forks a grandchild and exits at once; the grandchild burns 0.3 s of CPU,
    re-parented to the measuring process (run in a process of its own: it reaps its
    children), which is no subreaper once the run is measured."""
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
        import ctypes, json, os, sys
        from conveyor.tools.bench.harness import measure
        result = measure.measure_child([sys.executable, "-c", {burn!r}], dict(os.environ), 30)
        flag = ctypes.c_int(-1)
        ctypes.CDLL(None).prctl(37, ctypes.byref(flag), 0, 0, 0)  # PR_GET_CHILD_SUBREAPER
        print(json.dumps([result.exit_code, result.cpu_s, result.peak_pss_bytes, result.peak_rss_bytes,
                          result.processes, result.samples, result.problems, flag.value]))
        """
    )
    done = subprocess.run([sys.executable, "-c", measure], capture_output=True, text=True, timeout=50, check=True)
    exit_code, cpu_s, pss, rss, processes, samples, problems, subreaper = json.loads(done.stdout)
    assert exit_code == 0 and problems == []
    assert cpu_s >= 0.3  # the grandchild's CPU, which the child never reaped
    assert 0 < pss <= rss and processes >= 1 and samples >= 1
    assert subreaper == 0


def result(**changes: Any) -> Any:
    entries = [
        Entry("w", "ours", "our loader", "ok", runs=3, metrics={"items_per_s": Metric.of([900.0, 1000.0, 1200.0])}),
        Entry("w", "theirs", "their loader", "ok", runs=2, failures=["run 2: exit code 1: boom"],
              metrics={"items_per_s": Metric.of([100.0, 100.0])}),
        Entry("w", "peer", "a peer", "unavailable", reason="run benchmarks/peer_envs.sh"),
    ]  # fmt: skip
    found = Result(
        suite="demo",
        title="A suite",
        command="python benchmarks/bench_demo.py",
        date="2026-12-05T01:02:03+00:00",
        commit="0123456789abcdef0123456789abcdef01234567",
        dirty=False,
        machine={"system": "Linux 6.1", "arch": "x86_64", "cpus": 2, "python": "3.11.7"},
        versions={"numpy": "2.4.6"},
        settings={"repeats": 3},
        subject="ours",
        columns=["items_per_s"],
        spread=["items_per_s"],
        ratio="items_per_s",
        metrics=metric_definitions(["items_per_s"], {}),
        workloads={"w": {"describe": "things", "items": 1000, "unit": "items"}},
        entries=entries,
        notes=["a note"],
        load=[1.0, 2.0],
    )
    for key, value in changes.items():
        setattr(found, key, value)
    return found


def test_a_result_round_trips_and_its_table_says_everything() -> None:

    saved = result()
    again = Result.from_json(saved.to_json())
    assert again == saved
    text = render(again)
    assert text.splitlines()[0] == (
        "**A suite**: `python benchmarks/bench_demo.py`, conveyor at `0123456`, 2026-12-05; Linux 6.1 x86_64, "
        "2 CPUs, Python 3.11.7; load 1.00 at the start, 2.00 at the end; medians of 3 runs."
    )
    assert "| w | our loader | 1,000 (900-1,200) |  | 3/3 |" in text
    assert "| w | their loader | 100 | 10.00x | 2/3 |" in text  # the failed run counts against it
    assert "| w | a peer | unavailable: run benchmarks/peer_envs.sh |  | - |" in text
    assert "our loader's items/s ÷ this" in text.splitlines()[4]
    assert text.endswith("- a note")


def test_results_that_do_not_fit_the_schema_are_refused() -> None:

    raw = json.loads(result().to_json())
    assert validate(raw) == []
    bad = {**raw, "schema": "something/0"}
    assert validate(bad) == ["schema 'something/0', expected 'conveyor-benchmarks/1'"]
    bad = {**raw, "entries": [{**raw["entries"][0], "status": "fine", "metrics": {"nope": {"median": 1}}}]}
    assert validate(bad) == ["entry w/ours: status 'fine', not one of ('ok', 'failed', 'unavailable')",
                             "entry w/ours: metric 'nope' has no definition"]  # fmt: skip
    with pytest.raises(ValueError, match="columns: missing or not a list"):
        Result.from_json(json.dumps({key: value for key, value in raw.items() if key != "columns"}))


def test_readme_blocks_are_filled_from_the_newest_result(tmp_path: Path) -> None:

    older, newer = result(date="2026-12-01"), result(date="2026-12-05T01:02:03+00:00", notes=["newer"])
    older.save(tmp_path / "demo" / "a.json")
    newer.save(tmp_path / "demo" / "b.json")
    text = "# Title\n<!-- results: demo -->\nstale\n<!-- /results -->\nand <!-- results: none -->\n<!-- /results -->\n"
    filled = readme_text(text, tmp_path)
    assert filled == (
        f"# Title\n<!-- results: demo -->\n{render(newer)}\n<!-- /results -->\n"
        "and <!-- results: none -->\nNo results of none stored yet.\n<!-- /results -->\n"
    )
    named = readme_text("<!-- results: demo/a -->\n<!-- /results -->", tmp_path)  # one file by name
    assert named == f"<!-- results: demo/a -->\n{render(older)}\n<!-- /results -->"


def test_the_readme_holds_the_tables_of_the_stored_results() -> None:
    """``benchmarks/README.md`` as ``python -m conveyor.tools.bench.harness.tables --readme`` writes it."""
    text = README.read_text()
    assert "<!-- results: peers -->" in text
    assert readme_text(text) == text, f"run: {COMMAND} --readme"


def test_every_stored_result_fits_the_schema() -> None:

    paths = sorted(RESULTS.glob("*/*.json"))
    assert paths
    for path in paths:
        found = Result.read(path)
        assert found.suite == path.parent.name, path
        assert render(found).startswith(f"**{found.title}**"), path


STAND_INS = '''
"""Stand-in loaders of the harness's tests: one right, one raising, one spoiling its last
item at its shutdown, one leaving a process behind it, one slow enough to be capped."""

import multiprocessing
import time

import numpy as np

from conveyor.tools.bench.harness.declare import Loader, Opened, Suite, Workload
from conveyor.tools.bench.harness.tally import Tally


class ArrayTally(Tally):
    def see(self, item):
        self.count += 1
        if item[0] != item[-1]:
            self.wrong(list(item), "an array of one value")
            return
        self.id(int(item[0]))


def arrays(context):
    return [np.full(16, i) for i in range(context.items)]


def right(context):
    return Opened(arrays(context), lambda: None)


def raises(context):
    raise RuntimeError("boom")


def spoils(context):
    items = arrays(context)

    def close():
        items[-1][:] = 0  # a buffer the loader reuses once it shut down

    return Opened(items, close)


def strays(context):
    multiprocessing.Process(target=time.sleep, args=(0.5,), daemon=True).start()
    return Opened(arrays(context), lambda: None)


def slow(context):
    def items():
        for item in arrays(context):
            time.sleep(0.01)
            yield item

    return Opened(items(), lambda: None)


SUITE = Suite(
    name="stand-ins",
    title="stand-in loaders",
    path=__file__,
    workloads=(Workload("arrays", 400, 400, "arrays of 16 ints", tally=lambda context: ArrayTally(context.items)),),
    loaders=tuple(Loader(f.__name__, f.__name__, open=f) for f in (right, raises, spoils, strays, slow)),
    subject="right",
)
'''


@pytest.mark.timeout(300)
@pytest.mark.parametrize("forked", [False, True], ids=["fresh", "forked"])
def test_a_run_fails_when_its_loader_raises_spoils_its_last_item_or_leaves_a_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, forked: bool
) -> None:
    """Each stand-in in a fresh process (or, as the other tests run them, forked from the
    zygote); the slow one's warm-up says its epoch would take over the cap (each of its
    items takes at least 10 ms), so it reads fewer items."""
    if not forked:
        monkeypatch.setattr(orchestrate, "ZYGOTE", None)
    path = tmp_path / "stand_ins.py"
    path.write_text(STAND_INS)
    with loaded_script(path) as module:
        suite = module.SUITE
        rows = run_suite(suite, suite.workloads, suite.loaders, 1, False, {}, cap_seconds=1.0)
        found = build_result(suite, rows, "stand-ins", {"repeats": 1}, {}, [], 0.0)
    entries = {e.loader: e for e in found.entries}
    assert entries["right"].status == "ok" and entries["right"].metrics["items"].median == 400
    assert entries["right"].label == "right"
    for key, failure in [
        ("raises", "run 1: exit code 1: RuntimeError: boom"),
        ("spoils", "run 1: the last item read differently after the loader's shutdown (its memory reused or freed)"),
        ("strays", "run 1: 1 worker process(es) still running after the loader's shutdown"),
    ]:
        assert entries[key].status == "failed", entries[key]
        assert entries[key].failures[0].startswith(failure), entries[key]
    assert "RuntimeError: boom" in capsys.readouterr().err  # the run's traceback
    slow = entries["slow"]
    assert slow.status == "ok", slow
    read = slow.metrics["items"].median
    assert 8 <= read < 400 and slow.label == f"slow (capped: {read:,.0f} of 400 items per run)"
    assert validate(json.loads(found.to_json())) == []


def test_the_harness_imports_the_standard_library_and_itself_only() -> None:
    """A run's process imports it under a peer's interpreter, where conveyor is not installed."""
    import ast

    harness = Path(conveyor.tools.bench.harness.__file__).parent
    for path in sorted(harness.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names or name.startswith("conveyor.tools.bench.harness"), (path, name)
                assert isinstance(node, ast.ImportFrom) or top != "conveyor", (path, "from-imports only")
                assert name != "conveyor.tools.bench.harness", (path, "a module's names, not the module")


@pytest.mark.timeout(120)
def test_a_run_needs_neither_conveyor_nor_any_installed_package(tmp_path: Path) -> None:
    """``child.py`` in an interpreter without site-packages (as a peer's venv has no
    conveyor): the harness by its one name, and ``conveyor`` itself never imported."""
    suite = tmp_path / "bare_suite.py"
    suite.write_text(
        textwrap.dedent(
            """
            import sys

            from conveyor.tools.bench.harness import cli
            from conveyor.tools.bench.harness.declare import Loader, Opened, Suite, Workload
            from conveyor.tools.bench.harness.tally import Tally


            def open_range(context):
                imported = {"conveyor_imported": int("conveyor" in sys.modules)}
                return Opened(range(context.items), lambda: None, lambda: imported)


            SUITE = Suite(
                name="bare",
                title="a loader of the standard library",
                path=__file__,
                workloads=(Workload("ints", 50, 50, "ints", tally=lambda context: Tally(context.items)),),
                loaders=(Loader("range", "range", open=open_range),),
                subject="range",
            )
            assert cli.main is not None
            """
        )
    )
    child = Path(conveyor.tools.bench.harness.__file__).parent / "child.py"
    argv = [str(suite), "--workload", "ints", "--loader", "range", "--items", "50", "--warmup-items", "8"]
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(child), *argv], capture_output=True, text=True, timeout=100, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout.splitlines()[-1])
    assert check_delivery(run["tally"], 50, None) == [] and run["extra"] == {"conveyor_imported": 0}
    assert "numpy" not in run["versions"] and not run["last_changed"] and run["stray"] == 0
