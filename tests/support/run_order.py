"""The order the tests run in: the long ones first, spread over pytest-xdist's workers.

A test may run long when its ``timeout`` mark is above the ini's ``timeout`` (the other
Pythons, the trainers' resumes, the benchmarks' quick runs, the docs site): it is a *long*
test. Without xdist, the modules run longest first (each module's tests together and in
their order, ordered by their longest timeout), so that the long ones start while others
fill the cores.

Under xdist's ``worksteal`` the collection is first cut into one contiguous run of tests
per worker, and a worker that runs out takes tests from the end of the busiest one's run.
So the long tests are dealt out so that each worker's run starts with its share of them
(the longest to the worker with the least timeout so far), and the other tests follow in
module order, as many per worker as xdist's cut gives it: no worker is left with every
long test one after the other while the others finish early. Long tests marked with the
same ``xdist_group`` (the docs site's, which all wait for one build) are dealt as one.
Each worker orders the collection alike (xdist requires it): the deal depends on the
number of workers only.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def _timeout(item: pytest.Item, default: float) -> float:
    mark = item.get_closest_marker("timeout")
    return float(mark.args[0]) if mark and mark.args else default


def _longest_module_first(items: list[pytest.Item], default: float) -> list[pytest.Item]:
    modules: dict[Path, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.path, []).append(item)

    def longest(tests: list[pytest.Item]) -> float:
        return max(_timeout(test, default) for test in tests)

    return [item for tests in sorted(modules.values(), key=longest, reverse=True) for item in tests]


def dealt(items: list[pytest.Item], workers: int, default: float) -> list[pytest.Item]:
    """``items`` in the order that gives each of ``workers`` worksteal runs its share of
    the long tests first (see the module)."""
    ordered = _longest_module_first(items, default)
    long = [item for item in ordered if _timeout(item, default) > default]
    short = [item for item in ordered if _timeout(item, default) <= default]
    # xdist's first cut: each worker in turn gets an equal part of what is left.
    sizes, left = [], len(ordered)
    for worker in range(workers):
        sizes.append(left // (workers - worker))
        left -= sizes[-1]
    runs: list[list[pytest.Item]] = [[] for _ in range(workers)]
    loads = [0.0] * workers
    for unit in sorted(_units(long), key=lambda tests: _timeout(tests[0], default), reverse=True):
        open_runs = [w for w in range(workers) if len(runs[w]) + len(unit) <= sizes[w]]
        worker = min(open_runs or range(workers), key=lambda w: (loads[w], w))
        runs[worker].extend(unit)
        loads[worker] += sum(_timeout(item, default) for item in unit)
    rest = iter(short)
    for worker in range(workers):
        runs[worker].extend(next(rest) for _ in range(max(0, sizes[worker] - len(runs[worker]))))
    runs[-1].extend(rest)
    return [item for run in runs for item in run]


def _units(long: list[pytest.Item]) -> list[list[pytest.Item]]:
    """The long tests as they are dealt: one by one, but those of one ``xdist_group`` together."""
    groups: dict[str, list[pytest.Item]] = {}
    units: list[list[pytest.Item]] = []
    for item in long:
        mark = item.get_closest_marker("xdist_group")
        name = str(mark.args[0]) if mark and mark.args else None
        if name is None:
            units.append([item])
        elif name in groups:
            groups[name].append(item)
        else:
            groups[name] = [item]
            units.append(groups[name])
    return units


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    default = float(config.getini("timeout") or 0)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    items[:] = dealt(items, workers, default) if workers > 1 else _longest_module_first(items, default)
