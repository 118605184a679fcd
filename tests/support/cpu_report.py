"""``--cpu-report FILE``: each test's wall time and the CPU it used, one JSON line a test.

The full test command must fit in a budget on two cores, so the question is which tests
spend the CPU, not which wait. A test's CPU is its own process's (user and system) plus
that of the child processes it waited for (``RUSAGE_CHILDREN``: the ``torchrun`` runs,
the benchmark scripts, the installs and their grandchildren that were waited for).
Under xdist each worker appends its own lines to the same file.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


def _cpu() -> tuple[float, float]:
    """(this process's, its waited children's) user plus system seconds."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


class CpuReport:
    """Appends ``{"test", "wall", "cpu_self", "cpu_children", "outcome"}`` per test to a file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        wall = time.monotonic()
        own, children = _cpu()
        yield
        own_after, children_after = _cpu()
        line = {
            "test": item.nodeid,
            "wall": round(time.monotonic() - wall, 3),
            "cpu_self": round(own_after - own, 3),
            "cpu_children": round(children_after - children, 3),
            "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        }
        with self.path.open("a") as out:
            out.write(json.dumps(line) + "\n")


def summarize(path: Path, top: int = 40) -> str:
    """The tests that used the most CPU, and the totals (``python -m cpu_report FILE``)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows.sort(key=lambda row: row["cpu_self"] + row["cpu_children"], reverse=True)
    total_cpu = sum(row["cpu_self"] + row["cpu_children"] for row in rows)
    total_wall = sum(row["wall"] for row in rows)
    lines = [f"{len(rows)} tests, CPU {total_cpu:.0f} s, summed wall {total_wall:.0f} s"]
    for row in rows[:top]:
        cpu = row["cpu_self"] + row["cpu_children"]
        lines.append(f"{cpu:8.1f} cpu ({row['cpu_self']:6.1f} self) {row['wall']:7.1f} wall  {row['test']}")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    print(summarize(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 40))
