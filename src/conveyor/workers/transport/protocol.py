"""The messages between the main process and a worker. Data only: no behaviour here.

Requests (main to worker): :class:`StartEpoch`, and in dispatch mode :class:`Feed`; the
end of the request pipe (EOF) tells a worker to exit. Responses (worker to main): :class:`Ready`, :class:`Chunk`
(which travels in a frame of its own, not pickled as a message),
:class:`EpochEnd`, :class:`Failure`, with statistics on :class:`StageReport`, and in
dispatch mode :class:`Progress`. Every
epoch-scoped message carries the epoch's ``generation`` so that messages of an abandoned
epoch are recognised and dropped.

Flow control is credit-based: a worker may have as many chunks in flight as it holds
credits; the main process grants one back for each chunk it has merged. Credits travel on
a channel of their own, as fixed-size records (:data:`CREDIT_RECORD`): the thread that
merges writes them straight into the worker's credit pipe, without a hand-off to another
thread, and a record can neither overtake nor be overtaken by a request that matters to
it (a credit for an epoch exists only after the worker sent that epoch's chunk).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar, cast, dataclass_transform

from conveyor.core.random import SeedGenerator
from conveyor.workers.transport.chunk_states import ChunkStates

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

M = TypeVar("M")


@dataclass_transform(frozen_default=True)
def message(cls: type[M]) -> type[M]:
    """A frozen, slotted dataclass that pickles as its class and field values: a slotted
    dataclass's default pickling goes through Python-level ``__getstate__`` and
    ``__setstate__``, a measurable cost on every chunk on both sides."""
    cls = dataclass(frozen=True, slots=True)(cls)
    names = [field.name for field in fields(cast("type[DataclassInstance]", cls))]
    several = attrgetter(*names) if len(names) > 1 else None  # a tuple of their values, in C

    def __reduce__(self: Any) -> tuple[type, tuple[Any, ...]]:
        if several is not None:
            return cls, several(self)
        return cls, tuple(getattr(self, name) for name in names)

    cls.__reduce__ = __reduce__  # type: ignore[method-assign]
    return cls


@message
class StartEpoch:
    """Begin an epoch: seed the graph, then resume it from ``resume`` or start it afresh."""

    generation: int
    seeds: SeedGenerator
    resume: dict[str, Any] | None
    credits: int
    collect_stats: bool | str = False  # how to measure the stages (True, "sample") and send StageReports
    #: ``on_error="skip"``: the keys of the items already skipped this epoch (a resume
    #: drops them unread) and each worker's last position (``SkipLedger.worker_spec``);
    #: None: errors end the epoch.
    skips: dict[str, Any] | None = None
    #: This worker's seed of its global RNGs this epoch (``seeds.spawn(worker_id)
    #: .global_rng_seed()``), computed by the main process: in a worker just forked, the
    #: first ``SeedSequence`` took 0.4 ms (the pages it touches copied on write), before
    #: its first item. None: the worker computes it.
    global_rng_seed: int | None = None


#: One credit: one more chunk may be sent for the epoch whose generation (modulo 2**32)
#: the record holds. Records are written whole (a pipe write of at most ``PIPE_BUF``
#: bytes is atomic), so a read of a multiple of their size never splits one.
CREDIT_RECORD = struct.Struct("<I")
_GENERATION_MASK = 0xFFFFFFFF


def credit_records(generation: int, count: int) -> bytes:
    """``count`` credits for epoch ``generation``, as bytes for the credit pipe."""
    return CREDIT_RECORD.pack(generation & _GENERATION_MASK) * count


def count_credits(records: bytes, generation: int) -> int:
    """How many of ``records`` grant credits for epoch ``generation`` (the others belong
    to an epoch the worker has left and are void)."""
    wanted = generation & _GENERATION_MASK
    return sum(1 for (value,) in CREDIT_RECORD.iter_unpack(records) if value == wanted)


@message
class Ready:
    """The worker is initialised (graph loaded, shared memory mapped)."""

    worker_id: int
    pid: int


class Chunk(NamedTuple):
    """A run of a worker's items with their positions and the worker's state after each:
    what the worker's encoder takes and what the main process's decoder gives back (see
    :mod:`conveyor.workers.transport.frame` for how it travels between processes).
    Immutable; a NamedTuple, as a frozen dataclass took several times as long to make,
    once per chunk and process."""

    worker_id: int
    generation: int
    #: The chunk's number among those this worker (this process) sent, from 0.
    sequence: int
    items: tuple[Any, ...]
    positions: tuple[Any, ...]
    states: ChunkStates


@message
class EpochEnd:
    """The worker's share of epoch ``generation`` is exhausted."""

    generation: int


@message
class StageReport:
    """The worker's per-stage numbers so far in epoch ``generation``: ``(label, items,
    busy seconds, waiting seconds)`` per stage of its graph. Sent about once a second and
    before :class:`EpochEnd`."""

    generation: int
    stages: list[tuple[str, int, float, float]]


@message
class Failure:
    """The worker raised. ``exception`` is the original's pickled
    :func:`~conveyor.core.exception_parts.exception_parts` when they pickle;
    ``position`` is where, at the sharding point, the item it was working on stood (so the
    main process raises the error after the items that come before it)."""

    generation: int
    worker_id: int
    type_name: str
    message: str
    traceback: str
    exception: bytes | None
    position: list[int] | None = None


@message
class Feed:
    """Dispatch mode: ``(item, position, upstream state)`` entries for the worker's queue
    of dispatch point ``channel``; ``end`` says no more will come this epoch."""

    generation: int
    entries: list[Any]
    end: bool
    channel: int = 0


@message
class Progress:
    """Dispatch mode: the worker has taken ``taken`` fed items this epoch, the last at
    ``position``; none of its later outputs can come before that position."""

    generation: int
    taken: int
    position: int
    channel: int = 0
