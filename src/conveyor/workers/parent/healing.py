"""Self-healing workers: ``MultiProcessingReadingService(max_worker_restarts=n)``.

A worker that dies (``SIGKILL``, the OOM killer, a crash in native code, ``os._exit``) is
replaced by a new process that resumes the epoch from its state after the last item the
main process *received* from it, so the epoch's output is what it would have been
without the death:

1. The reader takes every whole message the dead worker had sent
   (:meth:`~conveyor.workers.parent.pool.WorkerPool.drain`); they join its merge lane as usual.
2. The lane is rewound to its last item (:meth:`~conveyor.workers.parent.merge.Merge.rewind`):
   records of skipped items after it are dropped, since the new process reads those
   items again; the chunks still buffered grant the new process no credits.
3. The pool starts a new process for the same worker id, with a fresh ring (arrays the
   user holds from the old one stay valid), and starts the epoch there from that state.

Every restart is logged on the ``conveyor.workers`` logger (WARNING) and counted in
``DataLoader2.stats().worker_restarts``; past ``max_worker_restarts`` (over the loader's
life) a death is raised as without restarts. A worker that dies again on the same item
counts each time. Restarts happen in the thread that iterates the loader: a read-ahead
thread that sees a death hands its reading back first (no worker is forked while a
thread of ours runs). Dispatch mode (``sharding_round_robin_dispatch``) does not restart
workers: the items fed to a dead worker are gone with it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

logger = logging.getLogger("conveyor.workers")


class WorkerRestarts:
    """How many dead workers may still be replaced, and the restarts made so far."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        #: Every restart: ``{"worker_id", "death", "at", "restart"}`` (plain data).
        self.events: list[dict[str, Any]] = []

    @property
    def left(self) -> int:
        return self.limit - len(self.events)

    def record(self, worker_id: int, death: str) -> None:
        """Log and count the replacement of worker ``worker_id``, which ``death``."""
        self.events.append({"worker_id": worker_id, "death": death, "at": time.time(), "restart": len(self.events) + 1})
        logger.warning(
            "worker %d (%s); restarting it from the last item received from it (restart %d of %d)",
            worker_id,
            death,
            len(self.events),
            self.limit,
        )
