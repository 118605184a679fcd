"""An exception described so that another process can make it again: its type (by
reference), the arguments its ``__new__`` takes, its args and its attributes.

Pickling an exception itself calls its ``__init__`` with its args on the way back, which
fails for a type whose ``__init__`` takes something else; what is made here never calls
``__init__``. A worker's failure (:mod:`conveyor.workers.transport.remote_errors`) and a
batch's error handed out in its place (:mod:`conveyor.pipes.torch.batch_errors`) travel
this way.
"""

from __future__ import annotations

from typing import Any

from conveyor.core.serialization import dumps


def exception_parts(error: BaseException) -> tuple[Any, ...]:
    """What to send to rebuild ``error`` in another process (see the module)."""
    return (type(error), new_arguments(error), error.args, dict(vars(error)))


def pickled_parts(error: BaseException) -> bytes | None:
    """:func:`exception_parts` pickled, without the attributes when they do not pickle;
    ``None`` when nothing does (the message and traceback then travel as text alone)."""
    whole = exception_parts(error)
    for parts in (whole, (*whole[:3], {})):
        try:
            return dumps(parts)
        except Exception:  # a part that does not pickle: try with less, else text alone
            continue
    return None


def rebuild_exception(parts: tuple[Any, ...]) -> BaseException:
    """The exception that :func:`exception_parts` describes, as it was (without its
    traceback, which travels as text)."""
    kind, arguments, args, attributes = parts
    if not (isinstance(kind, type) and issubclass(kind, BaseException)):
        raise TypeError(f"not an exception type: {kind!r}")
    return instance(kind, arguments, args, attributes)


def instance(
    kind: type[BaseException], arguments: tuple[Any, ...], args: tuple[Any, ...], attributes: dict[str, Any]
) -> Any:
    """An instance of ``kind`` with these args and attributes, made without calling its
    ``__init__``: ``__new__`` with ``arguments``, or with none when it wants others."""
    try:
        error = kind.__new__(kind, *arguments)
    except Exception:
        error = kind.__new__(kind)
    error.args = args
    error.__dict__.update(attributes)
    return error


def new_arguments(error: BaseException) -> tuple[Any, ...]:
    """What to pass ``__new__`` to make the like of ``error``: its args (an ``OSError``'s
    file names live outside them)."""
    if isinstance(error, OSError) and error.filename is not None:
        return (error.errno, error.strerror, error.filename, None, error.filename2)
    return error.args
