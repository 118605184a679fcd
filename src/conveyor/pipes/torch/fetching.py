"""``Fetcher``: a map-style dataset's batches, fetched and collated by key, in the process
that reads them (a worker, or the main process without workers).

A dataset that keeps a state of its own (torchdata's protocol: ``state_dict()`` and
``load_state_dict()``, say the RNG its ``__getitem__`` draws from) is snapshotted when the
pass opens and after every batch, and each worker's state holds its dataset's snapshot: a
resume loads it, so the next batch draws what it would have. Such a pipeline resumes
with the worker count it was saved with (each worker's dataset has a state of its own).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from conveyor.core.base import IterDataPipe
from conveyor.core.passes import Pass, PassContext, Position, State
from conveyor.core.plain_state import decode, encode, keeps_state
from conveyor.pipes.torch.batch_errors import FailedBatch


class Fetch:
    """A batch of keys' items, collated (a dataset's ``__getitems__`` fetches a batch at
    once, as torch uses it); one key's item, converted, without automatic batching."""

    def __init__(self, dataset: Any, collate_fn: Any, auto_collation: bool) -> None:
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.auto_collation = auto_collation

    def __deepcopy__(self, memo: dict[int, Any]) -> Fetch:
        # In the main process (num_workers=0) the user's dataset is read itself, as torch
        # reads it: never copied per epoch.
        return Fetch(self.dataset, self.collate_fn, self.auto_collation)

    def __call__(self, keys: Any) -> Any:
        if not self.auto_collation:
            return self.collate_fn(self.dataset[keys])
        getitems = getattr(self.dataset, "__getitems__", None)
        items = getitems(keys) if getitems is not None else [self.dataset[key] for key in keys]
        return self.collate_fn(items)


class FetcherPass(Pass):
    def __init__(self, pipe: Fetcher, state: State | None, context: PassContext):
        super().__init__(pipe, context)
        self.source = context.open(pipe.source, state["source"] if state is not None else None)
        dataset = pipe.fetch.dataset
        self._keeper = dataset if keeps_state(dataset) else None
        self._snapshot: Any = state["dataset"] if state is not None else None
        if self._keeper is not None:
            if self._snapshot is not None:
                self._keeper.load_state_dict(decode(self._snapshot, repr(self._keeper)))
            else:  # as the epoch begins (the RNG it may hold included)
                self._snapshot = encode(self._keeper.state_dict(), repr(self._keeper))
        self.items = self._fetch(pipe.fetch, pipe.errors_in_place)

    def _fetch(self, fetch: Fetch, in_place: bool) -> Iterator[Any]:
        keeper = self._keeper
        for keys in self.source:
            if in_place:
                try:
                    batch = fetch(keys)
                except Exception as error:  # handed out in the batch's place, as torch raises it
                    batch = FailedBatch(error)
            else:
                batch = fetch(keys)
            if keeper is not None:
                self._snapshot = encode(keeper.state_dict(), repr(keeper))
            yield batch
            del batch  # not held while the next batch is fetched (see mapper.MapperPass)

    def state(self) -> State:
        return {"dataset": self._snapshot, "source": self.source.state()}

    def position(self) -> Position | None:
        return self.source.position()

    def yielded(self) -> int:
        return self.source.yielded()

    def inputs(self) -> list[Pass]:
        return [self.source]


class Fetcher(IterDataPipe):
    """Batches of keys from ``source`` become their collated items (see the module).
    With ``errors_in_place``, a batch whose fetch raises becomes a
    :class:`~conveyor.pipes.torch.batch_errors.FailedBatch` in its place, and the next
    batch follows (torch's ``DataLoader`` raises that ``next()`` and goes on)."""

    keeps_order = True
    pass_type = FetcherPass
    state_fields = {"dataset": (dict, list, str, int, float, bool, type(None)), "source": dict}
    _params = ("fetch",)

    def __init__(self, source: IterDataPipe, fetch: Fetch, errors_in_place: bool = False) -> None:
        self.source = source
        self.fetch = fetch
        # Not a parameter (not in _params): it decides what an error does, not which batches
        # are made, so a state saved without it resumes with it.
        self.errors_in_place = errors_in_place
        # Item by item, unless the dataset keeps a state: then each worker's is its own.
        self.per_item = not keeps_state(fetch.dataset)
