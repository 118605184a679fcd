"""Exceptions raised in another process, raised again in the caller with their own type.

A worker's pipeline (or the dispatching process's) raises ``KeyError``; the caller gets an
exception that is both a ``KeyError`` and a :class:`~conveyor.errors.WorkerError`, so
``except KeyError:`` (what torch's ``DataLoader`` users write: it re-raises the original
type) and ``except WorkerError:`` both catch it. Its ``args`` and attributes are the
original's; its message says where it was caught and carries the original traceback, in
torch's words ("Caught KeyError in worker process 1." / "Original Traceback ..."); the
original, as unpickled, is its ``__cause__``.

The combined class is made once per original type (named like it, so a traceback reads
``KeyError: Caught KeyError in worker process 1. ...``) and pickles back to itself. When
the original type cannot be combined (a base-layout conflict, a type that refuses
subclasses, a ``BaseException`` that is not an ``Exception``) or its instance cannot be
rebuilt, the caller gets a plain :class:`WorkerError` with the original as ``__cause__``.
"""

from __future__ import annotations

import threading
from typing import Any

from conveyor.core.exception_parts import instance, new_arguments, rebuild_exception
from conveyor.core.serialization import loads
from conveyor.errors import WorkerError

#: The longest original message and traceback kept in the text (the head and the tail).
MAX_MESSAGE_CHARS = 2_000
MAX_TRACEBACK_CHARS = 12_000

_classes: dict[type[BaseException], type[WorkerError] | None] = {}
_classes_lock = threading.Lock()


def remote_error(
    original: BaseException | None,
    type_name: str,
    message: str,
    traceback_text: str,
    where: str,
    worker_id: int | None = None,
) -> WorkerError:
    """The exception to raise for one that ``where`` raised (``"worker process 1"``,
    ``"dispatching process"``). ``original`` is it, when it could be unpickled;
    ``type_name``, ``message`` and ``traceback_text`` describe it either way."""
    text = _text(type_name, message, traceback_text, where)
    error = _typed_or_plain(original, text, worker_id)
    error.__cause__ = original
    return error


def failure_error(failure: Any, kind: str) -> WorkerError:
    """The error to raise for a worker's :class:`~conveyor.workers.transport.protocol.Failure`, of the
    original's type too when it unpickles; ``kind`` names the worker (``"worker process"``,
    ``"thread worker"``)."""
    original: BaseException | None = None
    if failure.exception is not None:
        try:
            original = rebuild_exception(loads(failure.exception))
        except Exception:
            original = None  # the text below still says what happened
    where = f"{kind} {failure.worker_id}" + (" during start-up" if failure.generation < 0 else "")
    return remote_error(original, failure.type_name, failure.message, failure.traceback, where, failure.worker_id)


def _typed_or_plain(original: BaseException | None, text: str, worker_id: int | None) -> WorkerError:
    """The original's type combined with :class:`WorkerError` when it can be, else a plain
    :class:`WorkerError`; ``text`` as its message, ``worker_id`` as an attribute."""
    error = _rebuilt(original, text, worker_id) if original is not None else None
    if error is None:
        error = WorkerError(text)
        error.worker_id = worker_id  # type: ignore[attr-defined]
    return error


def _text(type_name: str, message: str, traceback_text: str, where: str) -> str:
    lines = [f"Caught {type_name} in {where}: {_bounded(message, MAX_MESSAGE_CHARS)}"]
    if traceback_text:
        lines.append(f"Original {_bounded(traceback_text.rstrip(), MAX_TRACEBACK_CHARS)}")
    return "\n".join(lines)


def _bounded(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n... [{len(text) - 2 * half} characters left out] ...\n{text[-half:]}"


def _rebuilt(original: BaseException, text: str, worker_id: int | None) -> WorkerError | None:
    """An instance of ``type(original)`` and :class:`WorkerError` with the original's
    args and attributes, or ``None`` when the type cannot be combined or rebuilt."""
    combined = _combined_class(type(original))
    if combined is None:
        return None
    try:
        error = instance(combined, new_arguments(original), original.args, vars(original))
    except Exception:  # a __new__ or attributes of an exotic type: the plain error says it all
        return None
    error._conveyor_text = text
    error.worker_id = worker_id
    return error


def _combined_class(kind: type[BaseException]) -> type[WorkerError] | None:
    if issubclass(kind, WorkerError) or not issubclass(kind, Exception):
        return None
    with _classes_lock:
        if kind in _classes:
            return _classes[kind]
        namespace = {
            "__module__": kind.__module__,
            "__qualname__": kind.__qualname__,
            "__doc__": f"{kind.__qualname__} raised in another process (also a conveyor WorkerError).",
            "__str__": _remote_str,
            "__reduce__": _remote_reduce,
        }
        try:
            combined: type[WorkerError] | None = type(kind.__name__, (kind, WorkerError), namespace)
        except TypeError:  # final type, or an instance layout that cannot be combined
            combined = None
        _classes[kind] = combined
        return combined


def _remote_str(self: BaseException) -> str:
    return str(self.__dict__.get("_conveyor_text", ""))


def _remote_reduce(self: BaseException) -> tuple[Any, ...]:
    attributes = {k: v for k, v in vars(self).items() if k not in ("_conveyor_text", "worker_id")}
    original_type = type(self).__mro__[1]
    worker_id = getattr(self, "worker_id", None)
    return (_unpickle, (original_type, new_arguments(self), self.args, attributes, str(self), worker_id))


def _unpickle(
    kind: type[BaseException],
    arguments: tuple[Any, ...],
    args: tuple[Any, ...],
    attributes: dict[str, Any],
    text: str,
    worker_id: int | None,
) -> BaseException:
    """Pickle support: the same combined type again (or a plain WorkerError)."""
    return _typed_or_plain(rebuild_exception((kind, arguments, args, attributes)), text, worker_id)
