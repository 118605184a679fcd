"""Writing flow-control credits to the workers' credit pipes, never blocking.

A worker may send as many chunks as it holds credits; the main process grants one back
for each chunk it has merged, as fixed-size records on the worker's credit pipe (see
:data:`~conveyor.workers.transport.protocol.CREDIT_RECORD`). The pipe holds thousands of
records: when a worker has left that many unread (it has that many credits already), the
rest are *owed* and go with its next grant, for the same epoch only.
"""

from __future__ import annotations

import os

from conveyor.workers.transport.protocol import CREDIT_RECORD, credit_records

#: Credits written at once: a pipe write of at most PIPE_BUF (4096) bytes is atomic.
CREDITS_PER_WRITE = 4096 // CREDIT_RECORD.size


class CreditLedger:
    """The credits owed to each worker whose credit pipe was full."""

    def __init__(self) -> None:
        self.owed: dict[int, tuple[int, int]] = {}  # worker -> (generation, credits its full pipe refused)

    def grant(self, worker_id: int, fd: int, generation: int, credits: int) -> None:
        """Write ``credits`` for epoch ``generation`` (and what is owed for it) to worker
        ``worker_id``'s credit pipe ``fd``, without blocking."""
        owed_generation, owed = self.owed.pop(worker_id, (generation, 0))
        if owed_generation == generation:
            credits += owed
        count = min(credits, CREDITS_PER_WRITE)
        try:
            os.write(fd, credit_records(generation, count))
        except BlockingIOError:
            count = 0
        except (BrokenPipeError, OSError):
            return  # the worker is gone: the pool reports it from its process sentinel
        if credits > count:
            self.owed[worker_id] = (generation, credits - count)

    def forget(self, worker_id: int) -> None:
        """Worker ``worker_id`` is replaced: nothing is owed to the new one."""
        self.owed.pop(worker_id, None)
