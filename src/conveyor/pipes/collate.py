"""``collate``: turn a batch (a list of items) into arrays, numpy first."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from numbers import Number
from typing import Any, TypeVar, overload

import numpy as np

from conveyor.core import shared_arrays
from conveyor.core.base import IterDataPipe
from conveyor.core.batch_rows import BatchRows
from conveyor.core.passes import PassContext, State, ThroughPass
from conveyor.core.skips import drop_or_raise
from conveyor.errors import MissingDependencyError
from conveyor.pipes.batch import BatcherPass

S = TypeVar("S")
T = TypeVar("T")


def default_collate(batch: Sequence[Any]) -> Any:
    """Stack a batch the way its elements suggest, keeping the structure of each element.

    numpy arrays are stacked, numbers become one array, mappings and tuples are collated
    field by field, strings and bytes stay a list, torch tensors are stacked with torch.
    Anything else is returned as the list it came in. In a worker process, a large stack
    of arrays or tensors is built in the worker's shared memory
    (:func:`conveyor.shared_empty`), so the batch reaches the main process without a copy.

    Args:
        batch: The items of one batch, in order (a list, as ``batch()`` makes).
    """
    if len(batch) == 0:
        return []
    first = batch[0]
    if isinstance(first, np.ndarray):
        return shared_arrays.stack(batch)  # in a worker, built in the memory it is sent through
    if type(first).__module__ == "torch" and type(first).__name__ == "Tensor":
        return shared_arrays.stack_tensors(batch)
    if isinstance(first, (str, bytes)):
        return list(batch)
    if isinstance(first, (Number, np.generic, bool)):
        return np.asarray(batch)
    if isinstance(first, Mapping):
        return {key: default_collate([element[key] for element in batch]) for key in first}
    if isinstance(first, tuple) and hasattr(first, "_fields"):  # namedtuple
        return type(first)(*(default_collate(list(field)) for field in zip(*batch, strict=True)))
    if isinstance(first, (tuple, list)):
        if any(len(element) != len(first) for element in batch):
            raise ValueError("cannot collate sequences of different lengths; pad them first")
        fields = [default_collate(list(field)) for field in zip(*batch, strict=True)]
        return tuple(fields) if isinstance(first, tuple) else fields
    return list(batch)


def to_tensor(value: Any) -> Any:
    """numpy arrays inside ``value`` as torch tensors (structure kept). Needs torch."""
    import torch

    if isinstance(value, np.ndarray):
        return torch.from_numpy(value) if value.dtype.kind in "biufc" else value
    if isinstance(value, np.generic):
        return torch.as_tensor(value)
    if isinstance(value, Mapping):
        return {key: to_tensor(v) for key, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(to_tensor(v) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(to_tensor(v) for v in value)
    return value


def _collate_rows(rows: BatchRows) -> Any:
    return rows.collate(default_collate)


class CollatorPass(ThroughPass):
    def __init__(self, pipe: Collator, state: State | None, context: PassContext):
        super().__init__(pipe, state, context)
        # Batches straight from batch() are stacked as their items arrive (BatchRows).
        self._stacks = pipe.fn is None and type(self.source) is BatcherPass
        if self._stacks:
            self.source.gather_in(BatchRows)  # type: ignore[attr-defined]
        self.items = self._collate(pipe)

    def _collate(self, pipe: Collator) -> Iterator[Any]:
        fn = pipe.fn or default_collate
        if self._stacks:
            fn = _collate_rows
        convert = to_tensor if pipe.to_tensor else None
        source, skips = self.source, self.context.skips
        for batch in skips.unseen(pipe, source) if skips else source:
            try:
                out = fn(batch)
            except Exception as err:
                drop_or_raise(err, pipe, skips, source)
                self.skipped += 1
                continue
            yield convert(out) if convert else out
            del out, batch  # not held while the next batch is made (see mapper.MapperPass)


class Collator(IterDataPipe):
    """Applies ``fn`` (default: :func:`default_collate`) to each batch; ``to_tensor=True``
    then turns numpy arrays into torch tensors (requires ``conveyor[torch]``).
    """

    per_item = True
    keeps_order = True
    pass_type = CollatorPass
    state_fields = {"source": dict}

    _params = ("fn", "to_tensor")

    def __init__(
        self,
        source: IterDataPipe,
        fn: Callable[[Any], Any] | None = None,
        to_tensor: bool = False,
    ):
        if fn is not None and not callable(fn):
            raise TypeError(f"collate() needs a callable or None, got {type(fn).__name__}")
        if to_tensor:
            try:
                import torch  # noqa: F401
            except ImportError:
                raise MissingDependencyError(
                    "collate(to_tensor=True) needs torch: pip install 'conveyor[torch]'"
                ) from None
        self.source = source
        self.fn = fn
        self.to_tensor = to_tensor

    def __len__(self) -> int:
        return len(self.source)


@overload
def collate(self: IterDataPipe[T], fn: Callable[[T], S], to_tensor: bool = False) -> IterDataPipe[S]: ...
@overload
def collate(self: IterDataPipe[Any], fn: None = None, to_tensor: bool = False) -> IterDataPipe[Any]: ...
@IterDataPipe.register_functional("collate", aliases={"collate_fn": "fn"}, builds=Collator)
def collate(
    self: IterDataPipe[Any], fn: Callable[[Any], Any] | None = None, to_tensor: bool = False
) -> IterDataPipe[Any]:
    """Turns each batch into arrays: :func:`default_collate`, or ``fn``.

    Args:
        fn: Called with each batch (torchdata's ``collate_fn=`` is accepted too); None:
            :func:`default_collate`, which stacks numpy arrays, makes numbers one array
            and collates dicts and tuples field by field.
        to_tensor: Then turn numpy arrays into torch tensors (needs ``conveyor[torch]``).

    Returns:
        A pipe of collated batches.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> [b.tolist() for b in IterableWrapper(range(5)).batch(2).collate()]
        [[0, 1], [2, 3], [4]]
        >>> list(IterableWrapper([{"x": 1}, {"x": 2}]).batch(2).collate())
        [{'x': array([1, 2])}]
    """
    return Collator(self, fn, to_tensor)
