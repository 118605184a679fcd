"""Ctrl-C while worker processes boot under spawn and forkserver (issue 31, item 5): a
terminal sends SIGINT to the whole foreground process group, so the booting children get
it too, in multiprocessing's bootstrap, before a worker's first line can ignore it. The
user must see one KeyboardInterrupt (the main process's), and nothing may be left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from process_helpers import alive
from shm_helpers import conveyor_shm_entries

pytestmark = pytest.mark.timeout(180)

SCRIPT = textwrap.dedent(
    """
    import os, sys, time

    if __name__ == "__mp_main__":
        # multiprocessing's bootstrap imports the main module before any worker code: in
        # each spawned child, and once in the forkserver (its children then start from
        # it). Slow imports, here: the test sends Ctrl-C while they run.
        open(os.path.join(os.environ["BOOT_MARKS"], str(os.getpid())), "w").close()
        time.sleep(float(os.environ["BOOT_SLEEP"]))

    from conveyor import DataLoader2, MultiProcessingReadingService
    from conveyor.pipes import IterableWrapper

    if __name__ == "__main__":
        import faulthandler, signal
        faulthandler.dump_traceback_later(120, exit=True)  # a hang shows every thread's stack
        # Ctrl-C as in a terminal (a shell that starts jobs in the background leaves SIGINT
        # ignored, and the children would inherit that).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        service = MultiProcessingReadingService(2, multiprocessing_context=sys.argv[1])
        with DataLoader2(IterableWrapper(range(10)).sharding_filter(), reading_service=service) as loader:
            print(list(loader))
    """
)


def _session(leader: int) -> list[int]:
    """The processes of the session ``leader`` began (alive, not zombies)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(fields[3]) == leader and fields[0] != "Z":  # fields[3]: the session id
                found.append(int(entry))
    return found


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_ctrl_c_while_workers_boot_shows_one_keyboard_interrupt(tmp_path: Path, method: str) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    marks = tmp_path / "booting"
    marks.mkdir()
    src = str(Path(__file__).resolve().parents[3] / "src")
    # A spawned child sleeps until it is ended; the forkserver holds up every start while
    # it sleeps (and the main process's Ctrl-C with it: see process._sigint_held).
    env = {
        **os.environ,
        "BOOT_MARKS": str(marks),
        "BOOT_SLEEP": "60" if method == "spawn" else "4",
        "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]),
    }
    # A session of its own: its process group gets the Ctrl-C, as a terminal's would.
    main = subprocess.Popen(
        [sys.executable, str(script), method],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120  # generous: start-up under load
        while not any(marks.iterdir()) and main.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any(marks.iterdir()), f"no worker came to boot (exit code {main.poll()})"
        booting = [int(mark.name) for mark in marks.iterdir()]
        os.killpg(main.pid, signal.SIGINT)
        _, err = main.communicate(timeout=120)
    finally:
        if main.poll() is None:
            os.killpg(main.pid, signal.SIGKILL)
            main.wait()
    assert err.count("Traceback") == 1 and err.count("KeyboardInterrupt") == 1, err
    assert all(pid != main.pid for pid in booting)
    deadline = time.monotonic() + 30
    while (_session(main.pid) or any(alive(pid) for pid in booting)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _session(main.pid), f"left behind: {_session(main.pid)}"
    assert not conveyor_shm_entries()
