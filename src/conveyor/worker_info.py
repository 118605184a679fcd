"""``WorkerInfo``: which worker this code runs in, for hooks and user functions."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerInfo:
    """``num_workers`` sharing the work and this one's ``worker_id`` (0-based)."""

    num_workers: int
    worker_id: int

    def __post_init__(self) -> None:
        if self.num_workers < 1 or not 0 <= self.worker_id < self.num_workers:
            raise ValueError(
                f"WorkerInfo needs num_workers >= 1 and 0 <= worker_id < num_workers, "
                f"got num_workers={self.num_workers}, worker_id={self.worker_id}"
            )


_current: WorkerInfo | None = None


def get_worker_info() -> WorkerInfo | None:
    """The ``WorkerInfo`` of the worker running this code; ``None`` outside workers."""
    return _current


def set_worker_info(info: WorkerInfo | None) -> None:
    """Set by the reading service in a worker (or around hooks run in the main process)."""
    global _current
    _current = info
