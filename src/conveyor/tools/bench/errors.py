"""The errors of ``conveyor bench``.

They are typed so that the command line can tell a benchmark that cannot run as asked
(one line on stderr, exit code 1) from a bug (a traceback), and so that a loader that
yields wrong items is told apart from a loader that raises.
"""

from __future__ import annotations

from conveyor.errors import ConveyorError


class BenchError(ConveyorError):
    """The benchmark cannot run as asked: a missing optional dependency (matplotlib for
    ``--plot``), an unusable data directory. Reported as one line, not a traceback."""


class CheckFailed(BenchError):
    """A loader yielded wrong items (count, type, value, or an item spoiled after its
    loader shut down). Its timings would measure something else than the work asked
    for, so the run does not count and the loader's row says why."""
