"""``EpochBatches``: the batches of one epoch of ``conveyor.DataLoader``, as torch's
``DataLoader`` iterator hands them out.

* A batch whose fetch raised (a :class:`~conveyor.pipes.torch.batch_errors.FailedBatch`
  in its place) raises its error from that ``next()``; the next ``next()`` goes on with
  the batch after it. Fetched in the main process (``num_workers=0``), the error is the
  exception itself, as torch raises it; from a worker, it is of the original's type and a
  :class:`~conveyor.errors.WorkerError`, its message naming the worker and carrying the
  worker's traceback (torch's ``Caught ... in DataLoader worker process ...``, ``Original
  Traceback``). The inner loader counted it as handed out, so a ``state_dict()`` taken
  then resumes with the batch after it, as the epoch would go on.
* For an ``IterableDataset`` whose length was asked of the loader (``len(loader)``)
  before ``iter()``, a ``UserWarning`` at each batch past the dataset's ``len()``, as
  torch warns (see NOTE [ IterableDataset and __len__ ] in torch's ``dataloader.py``):
  it counts batches against the dataset's length, not against the loader's, and a step
  that raised is not counted.
"""

from __future__ import annotations

import traceback
import warnings
from collections.abc import Iterator
from typing import Any

from conveyor.pipes.torch.batch_errors import FailedBatch
from conveyor.workers.transport.remote_errors import remote_error

#: torch's pointer to the documentation on configuring each worker's replica.
_REPLICA_HINT = (
    "For multiprocessing data-loading, this could be caused by not properly configuring the "
    "IterableDataset replica at each worker. Please see "
    "https://pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset for examples."
)


class EpochBatches(Iterator[Any]):
    """One epoch's batches (see the module). ``reported_length``: the ``IterableDataset``'s
    ``len()`` as the loader last asked it before this ``iter()`` (None: not asked, or a
    map-style dataset); ``handed_out``: the batches of the epoch handed out before these
    (a resumed epoch's). Attributes it lacks are looked up on the inner iterator."""

    def __init__(
        self,
        batches: Iterator[Any],
        dataset: Any = None,
        reported_length: int | None = None,
        handed_out: int = 0,
        with_workers: bool = False,
    ) -> None:
        self._batches = batches
        self._dataset = dataset
        self._reported_length = reported_length
        self._handed_out = handed_out
        self._with_workers = with_workers

    def __iter__(self) -> EpochBatches:
        return self

    def __next__(self) -> Any:
        batch = next(self._batches)
        if batch.__class__ is FailedBatch:
            raise batch_error(batch)
        if self._reported_length is not None:
            self._handed_out += 1
            if self._handed_out > self._reported_length:
                self._warn_longer()
        return batch

    def _warn_longer(self) -> None:
        message = (
            f"Length of IterableDataset {self._dataset} was reported to be {self._reported_length}"
            f"(when accessing len(dataloader)), but {self._handed_out} samples have been fetched. "
        )
        warnings.warn(message + (_REPLICA_HINT if self._with_workers else ""), UserWarning, stacklevel=3)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or "_batches" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(self._batches, name)


def batch_error(failed: FailedBatch) -> BaseException:
    """The exception to raise for a batch whose fetch raised (see the module)."""
    error = failed.error
    if error is not None and failed.worker_id is None and not failed.crossed:
        return error  # fetched in this process: the exception itself
    where = f"{'worker process' if failed.crossed else 'thread worker'} {failed.worker_id}"
    text = failed.traceback
    if not text and error is not None:
        text = "".join(traceback.format_exception(error))
    return remote_error(error, failed.type_name, failed.message, text, where, failed.worker_id)
