"""The order the tests run in: the modules whose tests may run longest first.

A module's tests stay together and in their order (its fixtures are made once); the
modules are ordered by the longest ``timeout`` mark among their tests (the ini's
``timeout`` for a test without one), longest first, ties as collected. Under xdist the
long runs (the other Pythons, the trainers' resumes, the benchmarks' quick runs), which
mostly wait on their processes, then start while the short tests fill the other
worker, instead of starting near the end and leaving one worker alone at it.
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    default = float(config.getini("timeout") or 0)
    modules: dict[Path, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.path, []).append(item)

    def longest(tests: list[pytest.Item]) -> float:
        marks = (test.get_closest_marker("timeout") for test in tests)
        return max(float(mark.args[0]) if mark and mark.args else default for mark in marks)

    items[:] = [item for tests in sorted(modules.values(), key=longest, reverse=True) for item in tests]
