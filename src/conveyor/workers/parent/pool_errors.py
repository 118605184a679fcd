"""What the pool's errors say: a silence past the timeout, a death, a pool shut down.

Each names the worker (id, pid) and says what to do. A silence: when no worker the reader
listens to sends anything within the service's ``timeout``, being silent does not make
a worker the culprit. An in-order merge hands items out in order, so one stuck worker
stops every other: their output waits behind its next item (and they get credit to send
more only as theirs is handed out), or they have sent their whole share already. In
dispatch mode the reader listens to every worker (the dispatcher needs each one's
progress), so every worker is silent then, and naming them all blamed healthy ones. The
pool knows who was silent and who is still starting; the merge knows whose output is
needed first (:meth:`~conveyor.workers.parent.merge.Merge.holding_up`): :func:`silence_error`
puts the two together. No I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from conveyor.errors import WorkerDeathError, WorkerError, WorkerTimeoutError
from conveyor.workers.parent.merge import Lane, Merge

#: Workers named, and others described, in one message at most (a message stays short
#: whatever ``num_workers``): the rest are counted.
MAX_NAMED = 8
MAX_DESCRIBED = 4


def silence_error(
    workers: Sequence[Any],
    awaited: Collection[int] | None,
    starting: Collection[int],
    limit: float,
    merge: Merge | None,
) -> WorkerTimeoutError:
    """The error for the workers listened to (those in ``awaited``, None: all, and those
    still ``starting``; each with ``worker_id`` and ``label``) when none sent anything
    within ``limit`` seconds. With the reader's ``merge``, it names only those the merge
    needs first, or that are still starting (a start-up that hangs holds up its worker's
    share), and says what each other silent worker waits for."""
    silent = [w for w in workers if awaited is None or w.worker_id in awaited or w.worker_id in starting]
    labels = {worker.worker_id: worker.label for worker in silent}
    needed = set(merge.holding_up()) if merge is not None else set(labels)
    holders = [w for w in labels if w in needed or w in starting] or list(labels)
    waiting = [w for w in labels if w not in holders]
    who = _listed([labels[w] for w in holders], MAX_NAMED)
    advice = "Raise MultiProcessingReadingService(timeout=...) if it is just slow."
    if not waiting or merge is None:
        message = f"{who} sent nothing within {limit:.1f}s (the timeout); a stage may be stuck. {advice}"
        return WorkerTimeoutError(message, holders, limit)
    one = len(holders) == 1
    whom = labels[holders[0]].split(" (pid", 1)[0] if one else "them"  # "worker 1" once its pid was given
    ahead = f"{whom}'s next item" if one else "their next items"
    notes = [_waits_for(labels[w], merge.lanes[w], whom, ahead) for w in waiting[:MAX_DESCRIBED]]
    if len(waiting) > MAX_DESCRIBED:
        notes.append(f"{len(waiting) - MAX_DESCRIBED} more workers hold nothing up either")
    message = (
        f"{who} sent nothing within {limit:.1f}s (the timeout) and {'holds' if one else 'hold'} the epoch up; "
        f"a stage may be stuck. {advice} Meanwhile {'; '.join(notes)}."
    )
    return WorkerTimeoutError(message, holders, limit)


def _waits_for(label: str, lane: Lane, whom: str, ahead: str) -> str:
    """What a silent worker that holds nothing up waits for, from its lane of the merge."""
    held = len(lane.entries)
    sent = "the item it sent comes" if held == 1 else f"the {held} items it sent come"
    if lane.failure is not None:
        return f"{label} failed; its error comes once the items before it are handed out"
    if lane.ended:
        return f"{label} has sent its whole share of the epoch" + (f"; {sent} after {ahead}" if held else "")
    if held:
        return (
            f"{label} waits for {whom}: {sent} after {ahead} in the output order, "
            "and it gets credit to send more only as its output is handed out"
        )
    return f"{label} waits its turn: its next item comes after {ahead}"


def _listed(names: list[str], most: int) -> str:
    shown = ", ".join(names[:most])
    return shown if len(names) <= most else f"{shown} and {len(names) - most} more"


def death_error(worker: Any) -> WorkerDeathError:
    """Worker ``worker`` (a process or a thread worker) ended: how, and what to do."""
    return WorkerDeathError(worker.worker_id, f"{worker.label} {worker.describe_death()}. {worker.death_advice}")


def closed_error(threads: bool, broken: BaseException | None) -> WorkerError:
    """The pool was shut down (``broken``: what closed it during a start), yet asked to serve."""
    why = f" after {type(broken).__name__} while starting a worker" if broken else ""
    return WorkerError(
        f"the {'thread workers' if threads else 'worker processes'} were shut down{why}; "
        "call shutdown() on the loader and build a new one"
    )
