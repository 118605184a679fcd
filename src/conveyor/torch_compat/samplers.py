"""Samplers that keep their position, under torchdata's names (``RandomSampler``,
``SequentialSampler``, ``BatchSampler``, ``StatefulDistributedSampler``).

Each follows torchdata's protocol: the object that iterates (the sampler's iterator, or
the distributed sampler itself) has ``state_dict()``, where the current pass stands, and
``load_state_dict(state)``, after which the iteration goes on from there. States are
small and may hold a generator's state (a tensor: :mod:`conveyor.core.plain_state` keeps it
in a checkpoint). torch's own samplers work in :class:`conveyor.DataLoader` too; these
resume without reading the keys before the cut again.
"""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import TYPE_CHECKING, Any

from conveyor.core.torch_support import require_torch
from conveyor.errors import StateError

if TYPE_CHECKING:  # what the classes below derive from, for type checkers
    import torch as _torch
else:
    _torch = require_torch("conveyor.samplers")
_data = _torch.utils.data

__all__ = ["BatchSampler", "RandomSampler", "SequentialSampler", "StatefulDistributedSampler"]


def _yielded(state: Any, key: str, where: str) -> int:
    if not isinstance(state, dict) or key not in state:
        raise StateError(f"{where}: the state must be a dict with {key!r}")
    value = state[key]
    count = int(value.item()) if isinstance(value, _torch.Tensor) else value
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"{where}: {key!r} must be an int >= 0, got {value!r}")
    return count


class _PositionedIterator(Iterator[Any]):
    """An iterator over a list of keys made when it starts, that counts what it yielded."""

    _KEY = "yielded"

    def __init__(self, make_keys: Any, owner: str) -> None:
        self._make_keys = make_keys
        self._owner = owner
        self._keys: list[Any] | None = None
        self.yielded = 0

    def __iter__(self) -> _PositionedIterator:
        return self

    def __next__(self) -> Any:
        if self._keys is None:
            self._keys = self._make_keys()
        if self.yielded >= len(self._keys):
            raise StopIteration
        key = self._keys[self.yielded]
        self.yielded += 1
        return key

    def state_dict(self) -> dict[str, Any]:
        return {self._KEY: self.yielded}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.yielded = _yielded(state, self._KEY, self._owner)


class SequentialSampler(_data.SequentialSampler):
    """Keys ``0, 1, ..., len(data_source) - 1``; its iterator keeps its position.

    Args:
        data_source: What to index: anything with a ``len()`` (a map-style dataset).
    """

    def __iter__(self) -> Iterator[int]:
        n = len(self.data_source)
        return _PositionedIterator(lambda: list(range(n)), "SequentialSampler")


class _RandomIterator(_PositionedIterator):
    """The keys of one pass of a :class:`RandomSampler`, drawn from its generator as it
    stood when the pass began (kept in the state, so a resume draws them again)."""

    def __init__(self, sampler: RandomSampler) -> None:
        self._sampler = sampler
        self.generator_state = sampler.generator.get_state()
        super().__init__(self._draw, "RandomSampler")

    def _draw(self) -> list[int]:
        sampler = self._sampler
        generator = sampler.generator
        generator.set_state(self.generator_state)
        n = len(sampler.data_source)
        if sampler.replacement:
            return _torch.randint(high=n, size=(sampler.num_samples,), dtype=_torch.int64, generator=generator).tolist()
        keys: list[int] = []
        while len(keys) < sampler.num_samples:
            keys.extend(_torch.randperm(n, generator=generator).tolist())
        return keys[: sampler.num_samples]

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator_state, "yielded": self.yielded}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or "generator" not in state:
            raise StateError("RandomSampler: the state must be a dict with 'generator' and 'yielded'")
        generator = state["generator"]
        if not isinstance(generator, _torch.Tensor) or generator.dtype != _torch.uint8:
            raise StateError("RandomSampler: 'generator' must be a generator's state (a uint8 tensor)")
        self.yielded = _yielded(state, "yielded", "RandomSampler")
        self.generator_state = generator
        self._keys = None  # drawn again from the loaded generator state


class RandomSampler(_data.RandomSampler):
    """A random order of the keys (with ``replacement``: ``num_samples`` random keys); its
    iterator keeps its position. Without a ``generator`` it makes one, seeded from torch's
    global RNG when the sampler is made.

    Args:
        data_source: What to index: anything with a ``len()`` (a map-style dataset).
        replacement: Draw keys with replacement (``num_samples`` of them).
        num_samples: How many keys to yield; None: ``len(data_source)``.
        generator: A ``torch.Generator`` to draw from; None: one made for the sampler.
    """

    def __init__(
        self,
        data_source: Sized,
        replacement: bool = False,
        num_samples: int | None = None,
        generator: Any = None,
    ) -> None:
        if generator is None:
            seed = int(_torch.empty((), dtype=_torch.int64).random_().item())
            generator = _torch.Generator().manual_seed(seed)
        super().__init__(data_source, replacement=replacement, num_samples=num_samples, generator=generator)

    def __iter__(self) -> Iterator[int]:
        return _RandomIterator(self)


class _BatchIterator(Iterator[list[Any]]):
    """Batches of a sampler's keys; its state is the keys taken and, when the sampler's
    iterator keeps its position, that position (else a resume reads the keys again)."""

    def __init__(self, sampler: BatchSampler) -> None:
        self._sampler = sampler
        self._keys = iter(sampler.sampler)
        self.samples_yielded = 0

    def __iter__(self) -> _BatchIterator:
        return self

    def __next__(self) -> list[Any]:
        size, batch = self._sampler.batch_size, []
        for key in self._keys:
            batch.append(key)
            if len(batch) == size:
                break
        if not batch or (len(batch) < size and self._sampler.drop_last):
            raise StopIteration
        self.samples_yielded += len(batch)
        return batch

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"samples_yielded": self.samples_yielded}
        keys_state = getattr(self._keys, "state_dict", None)
        if callable(keys_state):
            state["sampler_iter_state"] = keys_state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        taken = _yielded(state, "samples_yielded", "BatchSampler")
        self._keys = iter(self._sampler.sampler)
        inner = state.get("sampler_iter_state")
        load_keys_state = getattr(self._keys, "load_state_dict", None)
        if inner is not None and callable(load_keys_state):
            load_keys_state(inner)
        else:
            for _ in range(taken):
                if next(self._keys, None) is None:
                    raise StateError(f"BatchSampler: its sampler has fewer than the {taken} keys taken")
        self.samples_yielded = taken


class BatchSampler(_data.BatchSampler):
    """Lists of ``batch_size`` keys of ``sampler``; its iterator keeps its position.

    Args:
        sampler: The keys to batch: a sampler, or any iterable of ints.
        batch_size: Keys per batch.
        drop_last: Leave out the last batch when it is shorter than ``batch_size``.
    """

    def __iter__(self) -> Iterator[list[Any]]:
        return _BatchIterator(self)


class StatefulDistributedSampler(_data.distributed.DistributedSampler):
    """torch's ``DistributedSampler`` that keeps its position: ``state_dict()`` is
    ``{"yielded": keys of this pass handed out}``; after ``load_state_dict`` the next pass
    starts there (``next_yielded``)."""

    _YIELDED = "yielded"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.yielded = 0
        self.next_yielded: int | None = None

    def __iter__(self) -> Iterator[int]:
        start = self.next_yielded or 0
        self.next_yielded = None
        self.yielded = start
        keys = list(super().__iter__())
        for key in keys[start:]:
            self.yielded += 1
            yield key

    def state_dict(self) -> dict[str, Any]:
        return {self._YIELDED: self.yielded}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.next_yielded = _yielded(state_dict, self._YIELDED, "StatefulDistributedSampler")
