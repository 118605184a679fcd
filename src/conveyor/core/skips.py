"""What a per-item stage does with an item its function raised on, under
``DataLoader2(on_error="skip")``: the pass layer's side of an error budget.

A stage asks the :class:`SkipPolicy` its pass tree was given
(:attr:`PassContext.skips <conveyor.core.passes.PassContext.skips>`) to record the item
(:meth:`SkipPolicy.skip`), and drops it; before reading, it leaves out the items already
recorded this epoch (:meth:`SkipPolicy.unseen`). Each skip is a *record* (plain JSON data,
:func:`make_record`) whose ``key`` names the item across runs (:func:`item_key`). Where
records go, and when they exceed the budget, is the loader's business
(:mod:`conveyor.core.error_budget`: the epoch's ledger, a worker's pending records).

A stage's ``except`` block calls :func:`drop_or_raise`, which notes the pipe on the error
(:func:`note_error`) and either re-raises it or records the item; :func:`call_noted`
notes the pipe on an error a user function raises where nothing can be skipped.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from conveyor.core.passes import Pass, Position, Skips
from conveyor.errors import ConveyorError

if TYPE_CHECKING:
    from conveyor.core.base import DataPipe
from conveyor.core.stages import stage_index, stage_label

#: Characters of an exception's message a record keeps.
MESSAGE_LIMIT = 300

Record = dict[str, Any]


class SkipPolicy:
    """What the stages of one pass tree do with an error: drop the item and record it.
    ``known`` maps a stage's index to the keys of items already recorded this epoch.
    Subclasses decide where a record goes (:meth:`report`)."""

    def __init__(self, known: dict[int, set[str]] | None = None) -> None:
        self.known = known or {}

    def skip(self, err: BaseException, pipe: Any, source: Pass) -> None:
        """Record the item ``source`` yielded last, which ``pipe``'s function raised
        ``err`` on (the caller drops it); raises over the budget, where it is kept."""
        self.report(make_record(err, pipe, item_key(source), source.position()))

    def skip_at(self, err: BaseException, pipe: Any, key: str, position: Position | None) -> None:
        """:meth:`skip` for an item its stage no longer stands at (one of several in
        flight): ``key`` and ``position`` were taken when it was read (:func:`key_of`)."""
        self.report(make_record(err, pipe, key, position))

    def report(self, record: Record) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement report()")

    def known_for(self, pipe: Any) -> set[str] | None:
        """Keys of the items already recorded for ``pipe`` this epoch, if any."""
        return self.known.get(stage_index(pipe))

    def unseen(self, pipe: Any, source: Pass) -> Iterator[Any] | Pass:
        """``source``, less the items already recorded for ``pipe`` this epoch (a resume
        that reads them again drops them before the stage runs on them again)."""
        keys = self.known_for(pipe)
        if not keys:
            return source
        return _without(source, keys)


def _without(source: Pass, keys: set[str]) -> Iterator[Any]:
    for item in source:
        if item_key(source) not in keys:
            yield item


def make_record(err: BaseException, pipe: Any, key: str, position: Position | None) -> Record:
    """The record of the item named ``key`` (at ``position``), on which ``pipe``'s function raised."""
    message = str(err)
    if len(message) > MESSAGE_LIMIT:
        message = message[: MESSAGE_LIMIT - 3] + "..."
    return {
        "stage": stage_label(pipe),
        "stage_index": stage_index(pipe),
        "position": list(position) if position is not None else None,
        "type": type(err).__qualname__,
        "message": message,
        "key": key,
    }


def item_key(source: Pass) -> str:
    """A name for the item ``source`` yielded last that is the same in every run: its
    position at the sharding point, else a digest of ``source``'s state right after it
    (which an exact resume reproduces); the rounds of enclosing ``cycle`` ops first."""
    return key_of(source.context.rounds, source.position(), source.state)


def key_of(rounds: tuple[int, ...], position: Position | None, state: Any) -> str:
    """:func:`item_key` from its parts: ``state`` is the input's state after the item, or
    a function giving it (called only when there is no position)."""
    if position is not None:
        return "p" + ".".join(str(i) for i in (*rounds, *position))
    state = state() if callable(state) else state
    text = json.dumps([list(rounds), state], sort_keys=True, separators=(",", ":"), default=repr)
    return "s" + hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


def note_error(err: BaseException, pipe: DataPipe) -> None:
    """Add a note naming the pipe whose user function raised ``err`` (once)."""
    if not getattr(err, "_conveyor_noted", False):
        err.add_note(f"[conveyor] raised by the function of {pipe!r}")
        err._conveyor_noted = True  # type: ignore[attr-defined]


def drop_or_raise(err: BaseException, pipe: DataPipe, skips: Skips | None, source: Pass) -> None:
    """In a per-item stage's ``except`` block, for the item ``source`` yielded last: note
    ``err`` as raised by ``pipe``'s function, then re-raise it, or, under
    ``DataLoader2(on_error="skip")`` (``skips``), record the item so the caller drops it
    (:mod:`conveyor.core.skips`; over the budget, that raises instead)."""
    note_error(err, pipe)
    if skips is None or isinstance(err, ConveyorError):  # conveyor's own errors are never data's
        raise  # called from an except block: re-raises the error it handles
    skips.skip(err, pipe, source)


def call_noted(pipe: DataPipe, fn: Callable[[Any], Any], item: Any) -> Any:
    """``fn(item)``, an error it raises noted as raised by ``pipe``'s function."""
    try:
        return fn(item)
    except Exception as err:
        note_error(err, pipe)
        raise
