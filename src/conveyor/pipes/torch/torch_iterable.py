"""``TorchIterableDataset``: a torch ``IterableDataset`` as a resumable source pipe.

Each pass iterates the dataset again. How a pass resumes depends on what the dataset
offers, as with torchdata's ``StatefulDataLoader``:

* The dataset, or the iterator its ``__iter__`` returns, or both, keep their own
  position: ``state_dict()``/``load_state_dict()``. A pass snapshots those states when it
  begins and after every ``snapshot_every`` items, and its state is ``{"count": n,
  "snapshot": {"dataset": ..., "iterator": ...}, "since": k}`` (each part as plain data,
  ``None`` for one that keeps none; a dataset that is its own iterator is kept once, as
  the iterator). A resume loads them in torchdata's order (the dataset's state, then
  ``iter()``, then the iterator's) and reads ``k`` items again. With ``snapshot_every=1``
  (the default) nothing is read again.
* Anything else resumes by replaying: a fresh pass of the dataset, the ``n`` items
  already handed out dropped. The dataset must then yield the same items again (a
  one-shot iterator cannot resume).

Sharding is the user's job here, as it is with torch: either add conveyor's
``.sharding_filter()`` after this pipe, or split inside the dataset with torch's
``get_worker_info()`` (set in the workers of ``conveyor.DataLoader`` and of
``TorchDataLoaderReadingService``) or :func:`conveyor.get_worker_info`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from conveyor.core.base import IterDataPipe
from conveyor.core.passes import Pass, PassContext, State
from conveyor.core.pickling import copy_sharing
from conveyor.core.plain_state import decode, encode, keeps_state
from conveyor.core.torch_support import loaded_torch
from conveyor.core.validation import check_int, require_keys
from conveyor.errors import ResumeError, StateError
from conveyor.pipes.torch.batch_errors import FailedBatch


class TorchIterableDatasetPass(Pass):
    """``count``: items of the dataset's pass handed out; ``snapshot``/``since``: the
    position the dataset (or its iterator) reported, and the items read after it."""

    def __init__(self, pipe: TorchIterableDataset, state: State | None, context: PassContext):
        super().__init__(pipe, context)
        self.count = self._start = state["count"] if state is not None else 0
        self._snapshot: Any = state["snapshot"] if state is not None else None
        self._since = state["since"] if state is not None else 0
        self._keepers: tuple[Any, Any] = (None, None)  # (the dataset, its iterator): those that keep a state
        self._errors_in_place = pipe.errors_in_place
        # Opened now, as torch's loaders open a dataset's iterator at iter(): a position
        # it keeps (and the RNG state it may hold) is noted before anything else runs.
        self.items = self._read(pipe, self._open(pipe.dataset))

    def yielded(self) -> int:
        return self.count - self._start

    def _read(self, pipe: TorchIterableDataset, iterator: Iterator[Any]) -> Iterator[Any]:
        every = pipe.snapshot_every
        since = self._since
        in_place = pipe.errors_in_place
        # next() only: iter() on an iterator that is its dataset may start it again.
        while True:
            if in_place:
                try:
                    item = next(iterator)
                except StopIteration:
                    return
                except Exception as error:  # in the item's place; the iterator goes on if it can
                    item = FailedBatch(error)
            elif (item := next(iterator, _END)) is _END:
                return
            self.count += 1
            since += 1
            if since >= every and self._keeps():
                self._snapshot, since = self._take_snapshot(), 0
            self._since = since
            yield item
            del item  # an error's traceback holds this frame: no cycle left behind

    def _open(self, dataset: Any) -> Iterator[Any]:
        """The dataset's iterator, where this pass starts."""
        snapshot = self._snapshot
        if snapshot is not None:  # resuming: the dataset's state, then iter(), then the iterator's
            if snapshot["dataset"] is not None:
                self._load(dataset, snapshot["dataset"], "dataset")
            iterator = iter(dataset)
            if snapshot["iterator"] is not None:
                self._load(iterator, snapshot["iterator"], "iterator")
            self._keepers = _keepers(dataset, iterator)
            return _skipped(iterator, self._since, self._errors_in_place)
        iterator = iter(dataset)
        self._keepers = _keepers(dataset, iterator)
        if self._keeps():
            self._snapshot, self._since = self._take_snapshot(), 0
            if self.count:  # a count without a snapshot (saved before it kept one): replay
                return self._replayed(dataset, iterator)
            return iterator
        return self._replayed(dataset, iterator) if self.count else iterator

    def _keeps(self) -> bool:
        return any(keeper is not None for keeper in self._keepers)

    def _load(self, keeper: Any, state: Any, part: str) -> None:
        if not keeps_state(keeper):
            raise StateError(f"{self.pipe!r}: the state holds a position its {part} no longer keeps")
        keeper.load_state_dict(decode(state, repr(keeper)))

    def _replayed(self, dataset: Any, iterator: Iterator[Any]) -> Iterator[Any]:
        if iterator is dataset:
            raise ResumeError(
                f"{self.pipe!r}: the dataset is its own iterator (one-shot) and keeps no position "
                "(state_dict/load_state_dict); it cannot be replayed to resume"
            )
        return _skipped(iterator, self.count, self._errors_in_place)

    def _take_snapshot(self) -> dict[str, Any]:
        return {
            part: None if keeper is None else encode(keeper.state_dict(), repr(keeper))
            for part, keeper in zip(("dataset", "iterator"), self._keepers, strict=True)
        }

    def state(self) -> State:
        return {"count": self.count, "snapshot": self._snapshot, "since": self._since}


def _skipped(iterator: Iterator[Any], n: int, errors_in_place: bool) -> Iterator[Any]:
    """``iterator`` past its next ``n`` items (by ``next()`` alone, as :meth:`_read` reads);
    with ``errors_in_place``, a ``next()`` that raised counts as an item, as it did."""
    for _ in range(n):
        try:
            next(iterator)
        except StopIteration:
            break
        except Exception:
            if not errors_in_place:
                raise
    return iterator


_END = object()


def _keepers(dataset: Any, iterator: Any) -> tuple[Any, Any]:
    """Of the dataset and its iterator, those that keep a state (one that is its own
    iterator counts once, as the iterator)."""
    return (
        dataset if iterator is not dataset and keeps_state(dataset) else None,
        iterator if keeps_state(iterator) else None,
    )


_PLAIN = (dict, list, str, int, float, bool, type(None))


class TorchIterableDataset(IterDataPipe):
    """A torch ``IterableDataset`` as a source pipe (see the module): each pass iterates it
    again; ``snapshot_every`` spaces the snapshots of a dataset that keeps its position.

    Args:
        dataset: A torch ``IterableDataset``.
        share_dataset: Copies of the graph in this process (not in workers, which get their own)
            read this very dataset instead of a deep copy, as torch's ``DataLoader`` reads the
            user's dataset.
        snapshot_every: For a dataset that keeps its position (``state_dict()``): snapshot it every
            this many items; a resume reads again the items after the last snapshot.
        errors_in_place: An error the iterator raises becomes a
            :class:`~conveyor.pipes.torch.batch_errors.FailedBatch` item in its place, and reading
            goes on (a generator that raised is finished), as torch's ``DataLoader`` reads.
    """

    _params = ("dataset",)
    pass_type = TorchIterableDatasetPass
    state_fields = {
        "count": int,
        "snapshot": (dict, type(None)),
        "since": int,
    }
    #: Each worker iterates the whole dataset (and splits it itself, as under torch's
    #: DataLoader): ``conveyor.DataLoader`` sets it; the graph's checks read it.
    _splits_itself = False

    def __init__(
        self, dataset: Any, share_dataset: bool = False, snapshot_every: int = 1, errors_in_place: bool = False
    ):
        torch = loaded_torch()
        if torch is None or not isinstance(dataset, torch.utils.data.IterableDataset):
            raise TypeError(f"TorchIterableDataset takes a torch IterableDataset, got {type(dataset).__name__}")
        check_int("snapshot_every", snapshot_every, 1)
        self.dataset = dataset
        self.snapshot_every = snapshot_every
        # Not a parameter (not in _params): what an error does, not which items are read.
        self.errors_in_place = errors_in_place
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
        if state["snapshot"] is not None:
            require_keys(state["snapshot"], {"dataset": _PLAIN, "iterator": _PLAIN}, f"{where}: 'snapshot'")
        if state["since"] > state["count"]:
            raise StateError(f"{where}: 'since' ({state['since']}) cannot exceed 'count' ({state['count']})")
