"""Shared test settings: hypothesis profiles sized for a 2-core CI machine, and
``--cpu-hogs N``, which runs N busy processes alongside the tests.

CI shares its two cores with other work, so every test whose outcome could depend on
timing or scheduling is marked ``timing``, and the README's test command runs those with two
hogs (``pytest -m timing --cpu-hogs 2``), one at a time, after the rest (``pytest -n 2 -m
"not timing"``: two at a time, so these must not depend on having the machine to themselves).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default",
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("ci", parent=settings.get_profile("default"), max_examples=60, derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "default")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-hogs",
        type=int,
        default=0,
        metavar="N",
        help="run N processes that spin on a CPU for the whole session (tests must pass under load)",
    )


@pytest.fixture(scope="session", autouse=True)
def cpu_hogs(request: pytest.FixtureRequest) -> Iterator[list[int]]:
    """The pids of the ``--cpu-hogs`` processes; they are killed when the session ends."""
    count = request.config.getoption("--cpu-hogs")
    if count < 0:
        raise pytest.UsageError(f"--cpu-hogs must be 0 or more, got {count}")
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield [hog.pid for hog in hogs]
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait(30)


def pytest_report_header(config: pytest.Config) -> str | None:
    count = config.getoption("--cpu-hogs")
    return f"cpu hogs: {count} busy processes run alongside the tests" if count else None
