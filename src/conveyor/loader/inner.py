"""``InnerLoader``: the ``DataLoader2`` that ``conveyor.DataLoader`` drives, and what it
may read of it.

``conveyor.DataLoader`` begins each epoch itself (a resumed epoch's end rolls over through
its own ``ResumedEpoch``), so its loader does not roll over; and when the dataset's own
state outlives an epoch, the loader keeps the state of each epoch as it ended (its last
item's, in-progress form), from which a resume sets the dataset as it ended. The outer
loader reads the rest through the members below, never the loader's private ones.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from conveyor.core.base import DataPipe
from conveyor.loader.adapters import Adapter
from conveyor.loader.dataloader2 import DataLoader2
from conveyor.reading_service.interface import ReadingServiceInterface


class InnerLoader(DataLoader2):
    """A ``DataLoader2`` whose epochs another loader begins: it never rolls over into the
    next epoch, and with ``keep_end_state`` it keeps each epoch's state as it ended."""

    def __init__(
        self,
        datapipe: DataPipe,
        datapipe_adapter_fn: Adapter | Iterable[Adapter] | None = None,
        reading_service: ReadingServiceInterface | None = None,
        *,
        keep_end_state: bool = False,
    ) -> None:
        super().__init__(datapipe, datapipe_adapter_fn, reading_service)
        self._keep_end_state = keep_end_state
        self._rolls_over = False

    @property
    def in_progress(self) -> bool:
        """Whether an epoch is in progress (begun, and its items not ended)."""
        return self._epoch is not None

    def local_state(self) -> dict[str, Any]:
        """This process's state (``state_dict()`` without the other ranks' parts)."""
        return self._local_state()

    @property
    def end_state(self) -> dict[str, Any] | None:
        """With ``keep_end_state``: the state of the last epoch as it ended (None while one
        is in progress, or before the first ended)."""
        return self._end_state
