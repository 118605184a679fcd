"""One run: one loader, one workload, in a fresh process the orchestrator starts with that
loader's interpreter (a peer's venv, or its own).

    <python> .../conveyor/tools/bench/harness/child.py SUITE --workload W --loader L
        --items N --warmup-items M [--settings JSON] [--cap-seconds S] [--drop-one]

``SUITE`` is a suite's file (``benchmarks/bench_peers.py``: imported as a module named
after the file, its folder put on ``sys.path`` for the modules beside it) or a module's
name (``conveyor.tools.bench.suite``). The run imports the suite, the standard library,
numpy and the one loader it runs. It reads a small warm-up epoch with a loader of its own
(first-call costs: lazy imports, caches), then the timed epoch, from the loader's creation
to the end of its shutdown (its worker processes joined), and prints one JSON line: wall
time, time to the first item, its own CPU (with its reaped children's) when the timed
loader was created, what each epoch delivered (a ``tally.Tally`` summary, checked by the
orchestrator), whether the last item read the same after the shutdown, any figures of
the suite's own, and the versions it ran. It then leaves with ``os._exit``, so that
interpreter teardown is not counted in the CPU the orchestrator measures. Any worker
process still running after the shutdown is ended and counted as ``stray``.

With ``--cap-seconds``, a workload that may be capped runs fewer items in its timed epoch
when the warm-up says the full epoch would take longer (a slow peer on a large workload),
and says how many.

Run as a script, this file first makes its own folder importable as the package
``conveyor.tools.bench.harness`` (registered under that name, so that no module of it is
ever imported under a second name), without importing ``conveyor``: a peer's venv does
not have it. A spawned worker re-runs this file as ``__mp_main__``, which does the same.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.metadata
import importlib.util
import json
import multiprocessing
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

if __name__ in ("__main__", "__mp_main__"):  # a script: the harness by its package name, conveyor not imported
    _HERE = Path(__file__).resolve().parent
    if sys.path and Path(sys.path[0] or ".").resolve() == _HERE:
        del sys.path[0]  # the script's folder: its modules by their package name only
    if "conveyor.tools.bench.harness" not in sys.modules:
        _spec = importlib.util.spec_from_file_location(
            "conveyor.tools.bench.harness", _HERE / "__init__.py", submodule_search_locations=[str(_HERE)]
        )
        assert _spec is not None and _spec.loader is not None
        _package = importlib.util.module_from_spec(_spec)
        sys.modules[_spec.name] = _package
        _spec.loader.exec_module(_package)
        # Each module now, by its full name: `from conveyor.tools.bench.harness import cli`
        # would otherwise import `conveyor` itself to load it.
        for _module in sorted(_HERE.glob("*.py")):
            if _module.stem not in ("__init__", "child"):
                importlib.import_module(f"{_spec.name}.{_module.stem}")

from conveyor.tools.bench.harness.declare import Context, RunError, Suite
from conveyor.tools.bench.harness.processes import cpu_seconds, end_new_processes
from conveyor.tools.bench.harness.tally import Tally


def load_suite(where: str) -> Suite:
    """The ``SUITE`` of a suite's file or module (see the module). A file is imported as a
    module named after it, registered in ``sys.modules`` (pickled functions and spawned
    workers find it there), with its folder on ``sys.path`` (the modules beside it)."""
    if not where.endswith(".py"):
        return importlib.import_module(where).SUITE
    path = Path(where).resolve()
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    if path.stem in sys.modules:
        return sys.modules[path.stem].SUITE
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise RunError(f"cannot import a suite from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module.SUITE


def own_rss_bytes() -> int:
    """This process's resident memory (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/status") as status:
            return next((int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:")), 0)
    except OSError:
        return 0


def _reading(tally: Tally, item: Any) -> tuple[bytes, int, float, list[str]]:
    """What ``tally`` (fresh) makes of ``item`` alone: to compare one item before and after
    the loader's shutdown."""
    tally.see(item)
    return bytes(tally.counts), tally.bad, tally.checksum(), tally.problems


def loader_epoch(context: Context, drop_one: bool) -> dict[str, Any]:
    """One epoch from a new loader (``Loader.open``), timed from its creation to the end of
    its shutdown. The last item is kept through the shutdown and read again after it: a
    loader must not reuse or free the memory of an item it handed out. ``drop_one``
    leaves the first item out of the tally (tests only)."""
    assert context.loader is not None and context.loader.open is not None
    tally = context.workload.tally(context)
    before_shutdown, after_shutdown = context.workload.tally(context), context.workload.tally(context)
    see = tally.see
    gc.collect()  # the previous epoch's garbage is not this one's work
    before = set(multiprocessing.active_children())
    close = extra = None
    first_s: float | None = None
    last_s = 0.0
    read: tuple[bytes, int, float, list[str]] | None = None
    rss = own_rss_bytes()
    cpu_before = cpu_seconds()
    start = time.perf_counter()
    try:
        opened = context.loader.open(context)
        close, extra = opened.close, opened.extra
        iterator = iter(opened.items)
        last = None
        for item in iterator:
            first_s = time.perf_counter() - start
            if not drop_one:
                see(item)
            last = item
            break
        for last in iterator:
            see(last)
        last_s = time.perf_counter() - start
        if first_s is not None:
            read = _reading(before_shutdown, last)
        del iterator, opened  # released before the shutdown, as by a loop that ended its epoch
        shut, close = close, None
        shut()
        stray = end_new_processes(before)
        wall_s = time.perf_counter() - start
    finally:
        if close is not None:  # an error before the shutdown: still end the workers
            close()
        end_new_processes(before)
    changed = read is not None and _reading(after_shutdown, last) != read
    del last
    figures = dict(extra()) if extra is not None else {}
    return {
        "wall_s": wall_s,
        "first_s": first_s,
        "last_s": last_s,
        "cpu_before_s": cpu_before,
        "cpu_s": None,
        "rss_before_bytes": rss,
        "stray": stray,
        "last_changed": changed,
        "tally": tally.summary(),
        "extra": figures,
    }


def own_epoch(context: Context, drop_one: bool) -> dict[str, Any]:
    """One epoch of a loader that runs its own (``Loader.epoch``: a bound with no loader)."""
    assert context.loader is not None and context.loader.epoch is not None
    gc.collect()
    rss = own_rss_bytes()
    cpu_before = cpu_seconds()
    done = context.loader.epoch(context)
    tally = done.tally
    if drop_one:
        first = next((i for i, c in enumerate(tally.counts) if c), None)
        if first is not None:
            tally.counts[first] -= 1
            tally.count -= 1
    return {
        "wall_s": done.wall_s,
        "first_s": done.first_s,
        "last_s": None,
        "cpu_before_s": cpu_before,
        "cpu_s": done.cpu_s,
        "rss_before_bytes": rss,
        "stray": 0,
        "last_changed": False,
        "tally": tally.summary(),
        "extra": dict(done.extra),
    }


def capped(items: int, warmup: dict[str, Any], warmup_items: int, cap_s: float) -> int:
    """The items of a timed epoch that should take about ``cap_s`` seconds, judged from the
    warm-up's (its start-up and shutdown once, its steady part per item), rounded down to
    two significant digits; ``items`` when the full epoch fits."""
    if warmup["first_s"] is None or warmup["last_s"] is None or warmup_items < 2:
        return items
    per_item = (warmup["last_s"] - warmup["first_s"]) / (warmup_items - 1)
    fixed = warmup["wall_s"] - per_item * (warmup_items - 1)
    if per_item <= 0 or fixed + per_item * items <= cap_s:
        return items
    fitting = max(warmup_items, int((cap_s - fixed) / per_item))
    scale = 10 ** max(0, len(str(fitting)) - 2)
    return min(items, max(1, fitting // scale * scale))


def versions(packages: tuple[str, ...]) -> dict[str, str]:
    """The versions this run used: Python, numpy when installed, and the loader's packages
    (imported here, before any clock starts)."""
    found = {"python": platform.python_version()}
    numpy = ("numpy",) if importlib.util.find_spec("numpy") is not None else ()
    for name in (*numpy, *packages):
        module = importlib.import_module(name)
        version = getattr(module, "__version__", None)
        if version is None:
            try:
                version = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                version = "?"
        found[name] = str(version)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="One run of a benchmark suite (started by its orchestrator).")
    parser.add_argument("suite")
    parser.add_argument("--workload", required=True)
    parser.add_argument("--loader", required=True)
    parser.add_argument("--items", type=int, required=True)
    parser.add_argument("--warmup-items", type=int, required=True)
    parser.add_argument("--settings", default="{}", help="the suite's settings for every run, as JSON")
    parser.add_argument("--cap-seconds", type=float, help="run fewer items when the epoch would take longer")
    parser.add_argument("--drop-one", action="store_true", help="tests only: leave one item out of the tally")
    options = parser.parse_args(argv)
    suite = load_suite(options.suite)
    workload, loader = suite.workload(options.workload), suite.loader(options.loader)
    if not loader.runs(workload.key):
        raise RunError(f"{loader.key} does not run the {workload.key} workload")
    settings = {**workload.settings, **json.loads(options.settings)}
    found = versions(loader.packages)
    epoch = own_epoch if loader.epoch is not None else loader_epoch
    warm = Context(workload, loader, options.warmup_items, settings, warmup=True)
    warmup = epoch(warm, False)
    items = options.items
    if options.cap_seconds is not None and workload.cappable and loader.epoch is None:
        items = capped(items, warmup, options.warmup_items, options.cap_seconds)
    timed = epoch(Context(workload, loader, items, settings, warmup=False), options.drop_one)
    timed.update(loader=loader.key, workload=workload.key, items=items, asked=options.items, versions=found)
    timed["warmup"] = {
        "items": options.warmup_items,
        "tally": warmup["tally"],
        "stray": warmup["stray"],
        "last_changed": warmup["last_changed"],
    }
    print(json.dumps(timed), flush=True)
    return 0


def run(argv: list[str] | None = None) -> int:
    """:func:`main`, its failure reported on stderr: the run's exit status."""
    try:
        return main(argv)
    except RunError as error:
        print(f"run: {error}", file=sys.stderr, flush=True)
    except Exception:  # any failure of the loader: the orchestrator reports the run failed
        traceback.print_exc()
    return 1


if __name__ == "__main__":
    code = run()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown in the CPU the orchestrator measures
