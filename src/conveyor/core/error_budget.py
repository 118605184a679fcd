"""Error budgets: ``DataLoader2(on_error="skip", max_skipped=...)`` drops an item whose
per-item stage raises, records it, and fails the epoch only past the budget.

Which items are dropped depends only on the data (the stage raises on them or not), so it
is the same for every run and every ``num_workers``. Each skip is a *record* (plain JSON
data): the stage (its label and index in the loader's graph), the item's position at the
sharding point (when the stage runs after one), the exception's type and a bounded
message, and a ``key`` naming the item across runs: its position, or, before any sharding
point, a digest of its input's state right after it (exact resume means that state names
one point of the epoch).

How a record reaches the loader:

* in the process that runs the loader (in-process, the main-process part of a graph, a
  dispatcher), the stage hands it to the epoch's :class:`SkipLedger` at once;
* in a worker, the stage leaves it with the worker's :class:`WorkerSkips`, and the
  worker sends it as a :class:`SkippedItem` entry in its next chunk, at the item's place
  in its output (its position, or just after the worker's previous entry), carrying
  the state of that previous entry. The merge puts it where the item would have been;
  the reader hands it to the ledger instead of the user and keeps no state from it.

The ledger keeps the epoch's records (in ``stats()`` and in the loader's state), drops a
record it already holds (a stage replicated in every worker, an item read again after a
resume), and raises :class:`~conveyor.errors.SkipBudgetError` once the records exceed the
budget. A resumed epoch tells every stage the keys already recorded, so an item a replay
reads again is dropped before its stage's function runs again (:meth:`SkipPolicy.unseen`).

The stages' side (the :class:`~conveyor.core.skips.SkipPolicy` a pass tree is given, the
records and their keys) belongs to the pass layer, :mod:`conveyor.core.skips`; this module
is the loader's side: the budget, the ledger, and how workers' records travel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from conveyor.core.skips import Record, SkipPolicy
from conveyor.core.validation import describe_state_value, require_keys
from conveyor.errors import SkipBudgetError, StateError

#: The ways ``on_error`` may be set.
ON_ERROR_MODES = ("raise", "skip")
#: Records a SkipBudgetError's message shows (all of them are in its ``skipped``).
SHOWN_IN_ERROR = 10
#: A position past every sub-position (see conveyor.workers.parent.merge): a record with no
#: position of its own is placed just after its worker's previous entry.
_AFTER = 1 << 62


def check_error_policy(on_error: Any, max_skipped: Any) -> None:
    """Raise ``ValueError``/``TypeError`` for arguments ``DataLoader2`` cannot take."""
    if not isinstance(on_error, str) or on_error not in ON_ERROR_MODES:
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    if isinstance(max_skipped, bool) or not isinstance(max_skipped, int | float):
        raise TypeError(f"max_skipped must be an int (a count) or a float below 1 (a fraction), got {max_skipped!r}")
    if isinstance(max_skipped, int) and max_skipped < 0:
        raise ValueError(f"max_skipped must be >= 0, got {max_skipped}")
    if isinstance(max_skipped, float) and not 0.0 <= max_skipped < 1.0:
        raise ValueError(
            f"max_skipped as a float is a fraction of the items and must be in [0, 1), got {max_skipped}; "
            "give a count as an int"
        )
    if on_error == "raise" and max_skipped != 0:
        raise ValueError(
            f"max_skipped={max_skipped!r} applies only with on_error='skip'; with on_error='raise' the first "
            "error ends the epoch"
        )


class ErrorBudget:
    """How many skipped items an epoch may have: ``max_skipped`` as a count (int), or as a
    fraction (float below 1) of the items seen so far. A fraction is checked once the
    epoch has seen enough items for it to allow one skip (``1 / fraction``), and at the
    epoch's end."""

    def __init__(self, max_skipped: int | float) -> None:
        self.max_skipped = max_skipped

    def exceeded(self, skipped: int, seen: int, at_end: bool = False) -> bool:
        limit = self.max_skipped
        if isinstance(limit, int):
            return skipped > limit
        if not at_end and seen * limit < 1:
            return False  # too few items yet for the fraction to mean anything
        return skipped > limit * seen

    def describe(self) -> str:
        limit = self.max_skipped
        return f"max_skipped={limit}" if isinstance(limit, int) else f"max_skipped={limit} (a fraction of the items)"


class SkippedItem:
    """A worker's record of a skipped item, in its chunk where the item would have been."""

    __slots__ = ("record",)

    def __init__(self, record: Record) -> None:
        self.record = record

    def __reduce__(self) -> tuple[Any, ...]:
        return (SkippedItem, (self.record,))

    def __repr__(self) -> str:
        return f"SkippedItem({self.record!r})"


class SkipLedger(SkipPolicy):
    """The epoch's records, kept by the loader (in-process stages report here directly;
    workers' records arrive through the reader). ``seen()`` gives the items the epoch has
    seen so far, for a fractional budget."""

    def __init__(self, budget: ErrorBudget, seen: Callable[[], int], records: list[Record] | None = None) -> None:
        self.budget = budget
        self._seen = seen
        self.records: list[Record] = list(records or [])
        self._keys = {(r["stage_index"], r["key"]) for r in self.records}
        known: dict[int, set[str]] = {}
        for record in self.records:
            known.setdefault(record["stage_index"], set()).add(record["key"])
        super().__init__(known)

    def report(self, record: Record) -> None:
        identity = (record["stage_index"], record["key"])
        if identity in self._keys:
            return  # a stage every worker runs, or an item read again after a resume
        self._keys.add(identity)
        self.records.append(record)
        self.known.setdefault(record["stage_index"], set()).add(record["key"])
        self.check()

    def seen(self) -> int:
        """Items the epoch has seen: the larger of the items handed out plus those skipped
        and the items read at the sharding point (a batch after it does not change the
        count), as far as either is known."""
        reached = max((r["position"][0] + 1 for r in self.records if r["position"]), default=0)
        return max(self._seen() + len(self.records), reached)

    def check(self, at_end: bool = False) -> None:
        """Raise :class:`SkipBudgetError` if the records exceed the budget."""
        if self.budget.exceeded(len(self.records), self.seen(), at_end):
            raise budget_error(self.records, self.budget, self.seen())

    def worker_spec(self, bounds: list[Any]) -> dict[str, Any]:
        """What workers need, as plain data: the keys recorded so far (``[[stage index,
        key], ...]``), and ``bounds``, the position of each worker's last item handed
        out (where its records may stand from)."""
        return {"known": [[r["stage_index"], r["key"]] for r in self.records], "bounds": bounds}


class WorkerSkips(SkipPolicy):
    """A worker's: records wait in :attr:`pending` until the worker sends its next entry.
    ``spec`` is what the main process sent (:meth:`SkipLedger.worker_spec`)."""

    def __init__(self, spec: dict[str, Any], worker_id: int) -> None:
        known: dict[int, set[str]] = {}
        for stage_index, key in spec["known"]:
            known.setdefault(stage_index, set()).add(key)
        super().__init__(known)
        self.pending: list[Record] = []
        bound = spec["bounds"][worker_id] if worker_id < len(spec["bounds"]) else None
        #: The position of the worker's last entry (item or record) this epoch.
        self.last_position: tuple[Any, ...] | None = tuple(bound) if bound is not None else None

    def report(self, record: Record) -> None:
        self.pending.append(record)

    def add_to(self, chunk: list[tuple[Any, Any, Any]], next_item: tuple[Any, ...] | None) -> None:
        """Append the pending records to ``chunk`` (entries ``(item, state, position)``),
        after its last entry and before the worker's entry at ``next_item``."""
        chunk.extend(self.entries(chunk[-1][2] if chunk else None, next_item))

    def entries(
        self, last_item: tuple[Any, ...] | None, next_item: tuple[Any, ...] | None
    ) -> list[tuple[Any, Any, Any]]:
        """The pending records as chunk entries ``(SkippedItem, None, position)``, between
        the worker's entries at ``last_item`` (None: no item since the last call) and at
        ``next_item`` (None: none follows). A record stands at its item's position when
        that lies between them (an op after the failing one that groups items gives its
        output the position of its last input), else just after the previous entry: the
        positions of a worker's entries must grow. The main process keeps no state from
        a record."""
        if last_item is not None:
            self.last_position = last_item
        entries = []
        last = self.last_position
        for record in self.pending:
            own = tuple(record["position"]) if record["position"] is not None else None
            if own is not None and (last is None or own > last) and (next_item is None or own < next_item):
                last = own
            else:
                last = (*(last if last is not None else (-1,)), _AFTER)
            entries.append((SkippedItem(record), None, last))
        self.pending.clear()
        self.last_position = last
        return entries


# --- records ------------------------------------------------------------------------------


def budget_error(records: list[Record], budget: ErrorBudget, seen: int) -> SkipBudgetError:
    shown = "\n".join(f"  - {describe_record(r)}" for r in records[:SHOWN_IN_ERROR])
    more = f"\n  ... and {len(records) - SHOWN_IN_ERROR} more" if len(records) > SHOWN_IN_ERROR else ""
    return SkipBudgetError(
        f"{len(records)} items were skipped for errors (of about {seen} seen), more than "
        f"DataLoader2(on_error='skip', {budget.describe()}) allows:\n{shown}{more}\n"
        "Fix or remove these items, or raise max_skipped; every record is in this error's .skipped.",
        [dict(r) for r in records],
    )


def describe_record(record: Record) -> str:
    at = f"position {record['position']}" if record["position"] is not None else f"item {record['key']}"
    return f"{record['stage']} at {at}: {record['type']}: {record['message']}"


_RECORD_FIELDS = {
    "stage": str,
    "stage_index": int,
    "position": (list, type(None)),
    "type": str,
    "message": str,
    "key": str,
}


def check_records(records: Any, where: str) -> None:
    """Raise :class:`StateError` unless ``records`` is a list of skip records."""
    if type(records) is not list:
        raise StateError(f"{where}: 'skipped' must be a list of records, got {describe_state_value(records)}")
    for index, record in enumerate(records):
        require_keys(record, _RECORD_FIELDS, f"{where} skipped[{index}]")
