"""The fork-safety, shutdown, integrity and statistics tests under Python 3.12 and 3.13,
from a wheel of the project, with Python's warning about forking a threaded process as an
error: ``.ci/other-pythons`` (which says how), run as a test so that the full command runs
it beside the others rather than after them. Its own runs wait more than they compute."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / ".ci" / "other-pythons"


@pytest.mark.timeout(900)
def test_the_fork_safety_tests_pass_under_python_3_12_and_3_13() -> None:
    # The runs are sessions of their own: nothing of this one (xdist's worker, the
    # current test) may leak into theirs through the environment.
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
    done = subprocess.run([str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=840, check=False)
    assert done.returncode == 0, done.stdout[-12000:] + done.stderr[-4000:]
    for version in ("3.12", "3.13"):
        assert f"+ .venv-{version}/bin/python -m pytest (Python {version}." in done.stdout, done.stdout[-4000:]
    # each run's summary: its tests ran, and all passed
    summaries = [line for line in done.stdout.splitlines() if re.match(r"\d+ (passed|failed)|\d+ failed, ", line)]
    assert len(summaries) == 2 and all(re.fullmatch(r"\d+ passed in .*", line) for line in summaries), summaries
