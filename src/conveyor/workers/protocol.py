"""The messages between the main process and a worker. Data only: no behaviour here.

Requests (main to worker): :class:`StartEpoch`, :class:`Grant`, :class:`Terminate`, and in
dispatch mode :class:`Feed`. Responses (worker to main): :class:`Ready`, :class:`Chunk`,
:class:`EpochEnd`, :class:`Failure`, with statistics on :class:`StageReport`, and in
dispatch mode :class:`Progress`. Every
epoch-scoped message carries the epoch's ``generation`` so that messages of an abandoned
epoch are recognised and dropped.

Flow control is credit-based: a worker may have as many chunks in flight as it holds
credits; the main process grants one back for each chunk it has merged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from conveyor.random import SeedGenerator


@dataclass(frozen=True, slots=True)
class StartEpoch:
    """Begin an epoch: seed the graph, then resume it from ``resume`` or start it afresh."""

    generation: int
    seeds: SeedGenerator
    resume: dict[str, Any] | None
    credits: int
    collect_stats: bool = False  # meter the graph's stages and send StageReports


@dataclass(frozen=True, slots=True)
class Grant:
    """``credits`` more chunks may be sent for epoch ``generation``."""

    generation: int
    credits: int


@dataclass(frozen=True, slots=True)
class Terminate:
    """Stop the event loop and exit."""


@dataclass(frozen=True, slots=True)
class Ready:
    """The worker is initialised (graph loaded, shared memory mapped)."""

    worker_id: int
    pid: int


@dataclass(frozen=True, slots=True)
class Chunk:
    """Encoded ``[(item, state, position), ...]``: see :mod:`conveyor.workers.transport`."""

    generation: int
    payload: bytes
    buffers: list[Any]


@dataclass(frozen=True, slots=True)
class EpochEnd:
    """The worker's share of epoch ``generation`` is exhausted."""

    generation: int


@dataclass(frozen=True, slots=True)
class StageReport:
    """The worker's per-stage numbers so far in epoch ``generation``: ``(label, items,
    busy seconds, waiting seconds)`` per stage of its graph. Sent about once a second and
    before :class:`EpochEnd`."""

    generation: int
    stages: list[tuple[str, int, float, float]]


@dataclass(frozen=True, slots=True)
class Failure:
    """The worker raised. ``exception`` is the pickled original when it pickles."""

    generation: int
    worker_id: int
    type_name: str
    message: str
    traceback: str
    exception: bytes | None


@dataclass(frozen=True, slots=True)
class Feed:
    """Dispatch mode: ``(item, position, upstream state)`` entries for the worker's queue;
    ``end`` says no more will come this epoch."""

    generation: int
    entries: list[Any]
    end: bool


@dataclass(frozen=True, slots=True)
class Progress:
    """Dispatch mode: the worker has taken ``taken`` fed items this epoch, the last at
    ``position``; none of its later outputs can come before that position."""

    generation: int
    taken: int
    position: int
