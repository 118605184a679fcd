"""What every test shares: the layer markers, the start methods, Hypothesis' profiles and
``--cpu-hogs``.

The folders are the kinds of test, and each test is marked with its folder's name:
``tests/unit/`` (one module's behaviour, in this process; it mirrors ``src/conveyor/``),
``tests/integration/`` (worker processes, ranks, the loaders across them),
``tests/system/`` (whole programs: ``torchrun`` and the trainers, the examples, S3,
installs, other Pythons, the benchmarks, the documentation site). ``tests/support/``
holds the shared harnesses (on ``sys.path``, see ``pythonpath`` in pyproject.toml);
``tests/typing/`` holds mypy's cases, which pytest does not run.

Tests that take a ``start_method`` argument run once per start method of
``--start-methods`` (all three unless told otherwise; the quick command runs ``fork``
alone). Hypothesis runs the profile ``--hypothesis-profile`` names
(tests/support/hypothesis_profiles.py): ``quick`` (a sixth of the examples, for the
edit-test loop), ``ci`` (the full command: every test's own count, derandomized), or,
without the option, ``dev`` (``ci``'s counts, random; ``ci`` when ``CI`` is set).

CI shares its two cores with other work, so every test whose outcome could depend on
timing or scheduling is marked ``timing``, and the full command (``.ci/full-tests``) runs
those in a session of their own beside the rest of the suite, whose three workers keep the
cores busy meanwhile. ``--cpu-hogs N`` adds N busy processes for a whole session.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

import cpu_report
import hypothesis_profiles  # noqa: F401 - registers the profiles
import run_order

TESTS = Path(__file__).resolve().parent
LAYERS = ("unit", "integration", "system")
START_METHODS = ("fork", "spawn", "forkserver")
START_METHODS_KEY = pytest.StashKey[list[str]]()

settings.load_profile("ci" if os.environ.get("CI") else "dev")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-hogs",
        type=int,
        default=0,
        metavar="N",
        help="run N processes that spin on a CPU for the whole session (tests must pass under load)",
    )
    parser.addoption(
        "--start-methods",
        default=",".join(START_METHODS),
        metavar="METHODS",
        help="comma-separated start methods the tests taking `start_method` run under (default: all three)",
    )
    parser.addoption(
        "--cpu-report",
        default=None,
        metavar="FILE",
        help="append each test's wall time and CPU seconds (its own and its waited children's) to FILE as JSON lines",
    )


def pytest_configure(config: pytest.Config) -> None:
    methods = [method.strip() for method in config.getoption("--start-methods").split(",") if method.strip()]
    unknown = [method for method in methods if method not in START_METHODS]
    if unknown or not methods:
        raise pytest.UsageError(f"--start-methods takes some of {','.join(START_METHODS)}, got {methods!r}")
    config.stash[START_METHODS_KEY] = methods
    _start_hogs(config)
    config.pluginmanager.register(run_order, "run_order")
    report = config.getoption("--cpu-report")
    if report:
        config.pluginmanager.register(cpu_report.CpuReport(Path(report).resolve()), "cpu_report")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "start_method" in metafunc.fixturenames:
        metafunc.parametrize("start_method", metafunc.config.stash[START_METHODS_KEY])


def pytest_sessionstart(session: pytest.Session) -> None:
    """A test module outside the layer folders would run in no command but the full one."""
    astray = sorted(
        str(path.relative_to(TESTS))
        for path in TESTS.rglob("test_*.py")
        if path.relative_to(TESTS).parts[0] not in LAYERS
    )
    if astray:
        raise pytest.UsageError(
            f"tests outside tests/unit, tests/integration and tests/system: {', '.join(astray)}; "
            "move each into the folder of what it tests (tests/conftest.py says which is which)"
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(TESTS) and item.path.relative_to(TESTS).parts[0] in LAYERS:
            item.add_marker(item.path.relative_to(TESTS).parts[0])


HOGS_KEY = pytest.StashKey[list[subprocess.Popen[bytes]]]()


def _start_hogs(config: pytest.Config) -> None:
    """The ``--cpu-hogs`` processes, started once per run: by xdist's controller when the
    tests run in workers (each worker is told their pids), else by this process."""
    count = config.getoption("--cpu-hogs")
    if count < 0:
        raise pytest.UsageError(f"--cpu-hogs must be 0 or more, got {count}")
    if hasattr(config, "workerinput"):
        return
    config.stash[HOGS_KEY] = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def pytest_unconfigure(config: pytest.Config) -> None:
    for hog in config.stash.get(HOGS_KEY, []):
        hog.kill()
        hog.wait(30)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist's controller hands each worker the pids of the hogs it started."""
    node.workerinput["cpu_hogs"] = [hog.pid for hog in node.config.stash.get(HOGS_KEY, [])]


@pytest.fixture(scope="session")
def cpu_hogs(request: pytest.FixtureRequest) -> list[int]:
    """The pids of the ``--cpu-hogs`` processes, which spin from the start of the run to
    its end (one set for the run, however many xdist workers share it)."""
    workerinput = getattr(request.config, "workerinput", None)
    if workerinput is not None:
        return list(workerinput["cpu_hogs"])
    return [hog.pid for hog in request.config.stash.get(HOGS_KEY, [])]


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = [f"start methods: {','.join(config.stash[START_METHODS_KEY])}"]
    count = config.getoption("--cpu-hogs")
    if count:
        lines.append(f"cpu hogs: {count} busy processes run alongside the tests")
    return lines
