"""Pickling pipe graphs for other processes (the ``spawn`` and ``forkserver`` start methods).

Graphs hold user functions, often lambdas or functions defined in ``__main__``, which
plain pickle stores by name and a fresh process cannot find. With ``cloudpickle``
installed (``conveyor[pickle]``, part of the ``dev`` and ``torch`` set-ups), those are
stored by value and importable functions by reference; without it, plain pickle is used
and a failure says what to install. This is for graphs and code the user wrote, never for
loading states: states are plain data.
"""

from __future__ import annotations

import pickle
from typing import Any

from conveyor.errors import ConveyorError


class SerializationError(ConveyorError, TypeError):
    """A graph cannot be sent to another process."""


def dumps(obj: Any) -> bytes:
    """Bytes that :func:`loads` turns back into ``obj`` in another process."""
    try:
        import cloudpickle
    except ImportError:
        cloudpickle = None
    try:
        if cloudpickle is not None:
            return cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as err:
        hint = "" if cloudpickle is not None else " Installing cloudpickle (conveyor[pickle]) pickles lambdas."
        raise SerializationError(
            f"cannot pickle {obj!r} to send it to another process ({type(err).__name__}: {err}).{hint} "
            "Keep open files, locks and sockets out of the graph; open them inside the pipes."
        ) from err


def loads(data: bytes) -> Any:
    """The object :func:`dumps` stored."""
    return pickle.loads(data)
