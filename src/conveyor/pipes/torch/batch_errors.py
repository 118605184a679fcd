"""``FailedBatch``: a batch whose fetch raised, handed out in the batch's place.

torch's ``DataLoader`` raises the error of a batch it could not fetch from that
``next()`` and goes on with the next batch at the next one, with or without workers. The
ops that make ``conveyor.DataLoader``'s batches (:class:`~conveyor.pipes.torch.fetching.Fetcher`,
:class:`~conveyor.pipes.torch.iterable_batches.IterableBatches`) do so when asked
(``errors_in_place``): the error becomes an item of the output, with the state after it
as any item has, so it keeps its place in the order, crosses from a worker as a batch
would, and a state taken after it resumes with the batch after it. The loader raises it
when it hands it out (:mod:`conveyor.torch_compat.batches`).

In the process that fetched it, it holds the exception itself. Pickled (sent from a
worker process), it becomes its description: the type's name, the message, the
traceback as text, and the exception's parts pickled (:mod:`conveyor.core.exception_parts`),
so that an exception whose ``__init__`` takes other arguments, or whose attributes do not
pickle, still crosses.
"""

from __future__ import annotations

import traceback
from typing import Any

from conveyor.core.exception_parts import pickled_parts, rebuild_exception
from conveyor.core.serialization import loads
from conveyor.core.worker_info import IN_MAIN, get_worker_info


class FailedBatch:
    """The error of one batch, in the batch's place (see the module).

    Attributes:
        error: The exception, in the process that fetched the batch; after crossing from
            a worker process, the exception rebuilt from its parts (``None`` when it
            cannot be).
        type_name: The exception's type, by name.
        message: ``str()`` of the exception.
        traceback: Its traceback as text, as the fetching process formatted it (empty
            until pickled, in the fetching process).
        worker_id: The worker that fetched it; ``None`` in the main process.
        crossed: Whether it came from another process (pickled).
    """

    __slots__ = ("crossed", "error", "message", "traceback", "type_name", "worker_id")

    def __init__(self, error: BaseException) -> None:
        self.error: BaseException | None = error
        self.type_name = type(error).__qualname__
        self.message = str(error)
        self.traceback = ""
        info = get_worker_info()
        self.worker_id = None if info is None or info is IN_MAIN else info.worker_id
        self.crossed = False

    def __reduce__(self) -> tuple[Any, ...]:
        error = self.error
        if self.crossed or error is None:  # passed on again as it came
            return (_crossed, (self.type_name, self.message, self.traceback, None, self.worker_id))
        text = "".join(traceback.format_exception(error))
        return (_crossed, (self.type_name, self.message, text, pickled_parts(error), self.worker_id))

    def __repr__(self) -> str:
        where = "main process" if self.worker_id is None else f"worker {self.worker_id}"
        return f"FailedBatch({self.type_name}: {self.message!r}, {where})"


def _crossed(
    type_name: str, message: str, traceback_text: str, parts: bytes | None, worker_id: int | None
) -> FailedBatch:
    """Pickle support: the batch's error as the receiving process sees it."""
    batch = FailedBatch.__new__(FailedBatch)
    batch.error = None
    if parts is not None:
        try:
            batch.error = rebuild_exception(loads(parts))
        except Exception:  # its type is not importable here: the text still says what happened
            batch.error = None
    batch.type_name, batch.message, batch.traceback = type_name, message, traceback_text
    batch.worker_id, batch.crossed = worker_id, True
    return batch
