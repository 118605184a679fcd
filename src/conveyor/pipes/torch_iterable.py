"""``TorchIterableDataset``: a torch ``IterableDataset`` as a resumable source pipe.

Each pass iterates the dataset again. How a pass resumes depends on what the dataset
offers, as with torchdata's ``StatefulDataLoader``:

* The dataset (or the iterator its ``__iter__`` returns) keeps its own position:
  ``state_dict()``/``load_state_dict()``. A pass snapshots that state when it begins and
  after every ``snapshot_every`` items, and its state is ``{"count": n, "snapshot": <the
  last snapshot, as plain data>, "since": k}``: a resume loads the snapshot and reads
  ``k`` items again. With ``snapshot_every=1`` (the default) nothing is read again.
* Anything else resumes by replaying: a fresh pass of the dataset, the ``n`` items
  already handed out dropped. The dataset must then yield the same items again (a
  one-shot iterator cannot resume).

Sharding is the user's job here, as it is with torch: either add conveyor's
``.sharding_filter()`` after this pipe, or split inside the dataset with torch's
``get_worker_info()`` (set in the workers of ``conveyor.DataLoader`` and of
``TorchDataLoaderReadingService``) or :func:`conveyor.get_worker_info`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from typing import Any

from conveyor.errors import ResumeError, StateError
from conveyor.pipes.base import IterDataPipe, check_int
from conveyor.pipes.passes import Pass, PassContext, State
from conveyor.pipes.pickling import copy_sharing
from conveyor.plain_state import decode, encode, keeps_state
from conveyor.torch_support import loaded_torch


class TorchIterableDatasetPass(Pass):
    """``count``: items of the dataset's pass handed out; ``snapshot``/``since``: the
    position the dataset (or its iterator) reported, and the items read after it."""

    def __init__(self, pipe: TorchIterableDataset, state: State | None, context: PassContext):
        super().__init__(pipe, context)
        self.count = self._start = state["count"] if state is not None else 0
        self._snapshot: Any = state["snapshot"] if state is not None else None
        self._since = state["since"] if state is not None else 0
        self._keeper: Any = None
        # Opened now, as torch's loaders open a dataset's iterator at iter(): a position
        # it keeps (and the RNG state it may hold) is noted before anything else runs.
        self.items = self._read(pipe, self._open(pipe.dataset))

    def yielded(self) -> int:
        return self.count - self._start

    def _read(self, pipe: TorchIterableDataset, iterator: Iterator[Any]) -> Iterator[Any]:
        every = pipe.snapshot_every
        since = self._since
        for item in iterator:
            self.count += 1
            since += 1
            if self._keeper is not None and since >= every:
                self._snapshot, since = self._take_snapshot(), 0
            self._since = since
            yield item

    def _open(self, dataset: Any) -> Iterator[Any]:
        """The dataset's iterator, where this pass starts."""
        resuming = self.count > 0 or self._snapshot is not None
        if resuming and self._snapshot is not None:
            if keeps_state(dataset):
                dataset.load_state_dict(decode(self._snapshot, repr(dataset)))
                self._keeper, iterator = dataset, iter(dataset)
            else:
                iterator = iter(dataset)
                if not keeps_state(iterator):
                    raise StateError(f"{self.pipe!r}: the state holds a position its dataset no longer keeps")
                iterator.load_state_dict(decode(self._snapshot, repr(iterator)))
                self._keeper = iterator
            return itertools.islice(iterator, self._since, None) if self._since else iterator
        iterator = iter(dataset)
        if keeps_state(dataset) or keeps_state(iterator):
            self._keeper = dataset if keeps_state(dataset) else iterator
            self._snapshot, self._since = self._take_snapshot(), 0
            if self.count:  # a count without a snapshot (saved before it kept one): replay
                return self._replayed(dataset, iterator)
            return iterator
        return self._replayed(dataset, iterator) if self.count else iterator

    def _replayed(self, dataset: Any, iterator: Iterator[Any]) -> Iterator[Any]:
        if iterator is dataset:
            raise ResumeError(
                f"{self.pipe!r}: the dataset is its own iterator (one-shot) and keeps no position "
                "(state_dict/load_state_dict); it cannot be replayed to resume"
            )
        return itertools.islice(iterator, self.count, None)

    def _take_snapshot(self) -> Any:
        return encode(self._keeper.state_dict(), repr(self._keeper))

    def state(self) -> State:
        return {"count": self.count, "snapshot": self._snapshot, "since": self._since}


class TorchIterableDataset(IterDataPipe):
    """A torch ``IterableDataset`` as a source pipe (see the module): each pass iterates it
    again; ``snapshot_every`` spaces the snapshots of a dataset that keeps its position."""

    _params = ("dataset",)
    pass_type = TorchIterableDatasetPass
    state_fields = {
        "count": int,
        "snapshot": (dict, list, str, int, float, bool, type(None)),
        "since": int,
    }

    def __init__(self, dataset: Any, share_dataset: bool = False, snapshot_every: int = 1):
        torch = loaded_torch()
        if torch is None or not isinstance(dataset, torch.utils.data.IterableDataset):
            raise TypeError(f"TorchIterableDataset takes a torch IterableDataset, got {type(dataset).__name__}")
        check_int("snapshot_every", snapshot_every, 1)
        self.dataset = dataset
        self.snapshot_every = snapshot_every
        #: Copies of the graph in this process read this very dataset (``conveyor.DataLoader``
        #: reads the user's dataset as torch does); workers get their own, pickled.
        self._shares_dataset = share_dataset

    def __deepcopy__(self, memo: dict[int, Any]) -> TorchIterableDataset:
        return copy_sharing(self, memo, {"dataset"} if self.__dict__.get("_shares_dataset", False) else set())

    def __len__(self) -> int:
        try:
            return len(self.dataset)
        except TypeError:
            raise self._no_length(f"its {type(self.dataset).__name__} has no len()") from None

    def check_own_state(self, state: Mapping[str, Any], where: str) -> None:
        if state["since"] > state["count"]:
            raise StateError(f"{where}: 'since' ({state['since']}) cannot exceed 'count' ({state['count']})")
