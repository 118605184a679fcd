"""Helpers for the shared-memory tests: a private ``/dev/shm`` of a chosen size, and the
ring files a test may have left there."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from process_helpers import alive


def run_in_private_dev_shm(code: str, size: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh Python inside a private mount namespace whose /dev/shm is a
    tmpfs of ``size``; skips the test unless root with ``unshare(1)`` (the mount dies with
    the namespace, so nothing outside it ever sees it)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a private /dev/shm")
    script = f'mount -t tmpfs -o size={size} tmpfs /dev/shm && exec "$0" -c "$1"'
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script, sys.executable, code],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0 and "mount" in done.stderr and "Traceback" not in done.stderr:
        pytest.skip(f"cannot mount a private /dev/shm here: {done.stderr.strip()}")
    return done


def conveyor_shm_entries() -> list[str]:
    """Ring files left by this process or by a process that has ended (``conveyor-<pid>-...``).
    Those of other live processes are theirs: a test running alongside (``pytest -n``)
    may hold one for the moment between creating and unlinking it."""
    leaked = []
    for name in os.listdir("/dev/shm"):
        if name.startswith("conveyor-"):
            creator = int(name.split("-")[1])
            if creator == os.getpid() or not alive(creator):
                leaked.append(name)
    return leaked
