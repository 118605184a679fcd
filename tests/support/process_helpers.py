"""Whether a process is still running, as the orphan and shutdown tests need to know."""

from __future__ import annotations


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie.

    ``/proc/<pid>/stat`` can vanish between ``open`` and ``read`` when the process is
    reaped in between; the read then fails with ``ESRCH`` (``ProcessLookupError``).
    """
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return fields[0] != "Z"
