"""``random_map``: a map whose function also gets a numpy ``Generator``.

After the sharding point the generator is keyed by the item's position there, so the
output does not depend on how many workers or ranks share the work. Before it, the
generator is keyed by the pass's own item counter on the shared stream. Either way the
rounds of any enclosing ``cycle`` are part of the key, so each round draws anew.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np

from conveyor.core.base import IterDataPipe
from conveyor.core.op_roles import RandomOp
from conveyor.core.passes import PassContext, State, ThroughPass
from conveyor.core.random import PipeRandomness
from conveyor.core.skips import drop_or_raise

S = TypeVar("S")
T = TypeVar("T")


class RandomMapperPass(ThroughPass):
    """``count``: items mapped so far in this pass (the key before the sharding point)."""

    def __init__(self, pipe: RandomMapper, state: State | None, context: PassContext):
        super().__init__(pipe, state, context)
        self.count = state["count"] if state is not None else 0
        self.items = self._map(pipe, pipe.randomness())

    def _map(self, pipe: RandomMapper, randomness: PipeRandomness) -> Iterator[Any]:
        fn, source, rounds, keyed = pipe.fn, self.source, self.context.rounds, randomness.keyed_by_position
        skips = self.context.skips
        for item in skips.unseen(pipe, source) if skips else source:
            position = source.position() if keyed else None
            counter = (*rounds, *position) if position is not None else (*rounds, self.count)
            self.count += 1
            try:
                result = fn(item, randomness.generator(*counter))
            except Exception as err:
                drop_or_raise(err, pipe, skips, source)
                self.skipped += 1
                continue
            yield result
            del result, item  # not held while the next item is made (see mapper.MapperPass)

    def own_state(self) -> State:
        return {"count": self.count}


class RandomMapper(IterDataPipe, RandomOp):
    """Yields ``fn(item, rng)`` where ``rng`` is a ``numpy.random.Generator`` for this item."""

    per_item = True
    keeps_order = True
    pass_type = RandomMapperPass
    state_fields = {"count": int, "source": dict}

    _params = ("fn",)

    def __init__(self, source: IterDataPipe, fn: Callable[[Any, np.random.Generator], Any]):
        if not callable(fn):
            raise TypeError(f"random_map() needs a callable, got {type(fn).__name__}")
        self.source = source
        self.fn = fn

    def __len__(self) -> int:
        return len(self.source)


@IterDataPipe.register_functional("random_map", builds=RandomMapper)
def random_map(self: IterDataPipe[T], fn: Callable[[T, np.random.Generator], S]) -> IterDataPipe[S]:
    """Applies ``fn`` to each item with a random generator of the item's own.

    The generator is keyed by the loader's seed, the epoch and the item's position at
    the sharding point: the same draws for any number of workers, and again on resume.

    Args:
        fn: Called as ``fn(item, rng)``, ``rng`` a ``numpy.random.Generator``; what it
            returns is the new item.

    Returns:
        A pipe of the results, in the items' order.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> noisy = IterableWrapper([0.0, 1.0]).random_map(lambda x, rng: x + rng.uniform(0, 0.5))
        >>> [0.0 <= x - base < 0.5 for x, base in zip(noisy, [0.0, 1.0])]
        [True, True]
    """
    return RandomMapper(self, fn)


def _shuffled(batch: Any, rng: np.random.Generator) -> Any:
    order = rng.permutation(len(batch))
    shuffled = [batch[i] for i in order]
    return tuple(shuffled) if isinstance(batch, tuple) else shuffled


class InBatchShuffler(RandomMapper):
    """Shuffles the items inside each batch (list or tuple), with a generator keyed as
    ``random_map``'s: the same order for any number of workers, again on resume.
    ``set_shuffle(False)`` (or the ``Shuffle(False)`` adapter) leaves batches as they are.

    Args:
        source: The pipe of batches (lists or tuples) to shuffle inside.
    """

    _params = ("enabled",)

    def __init__(self, source: IterDataPipe):
        super().__init__(source, _shuffled)
        self.enabled = True

    def set_shuffle(self, enabled: bool = True) -> InBatchShuffler:
        self.enabled = bool(enabled)
        self.fn = _shuffled if self.enabled else _as_is
        return self


@IterDataPipe.register_functional("in_batch_shuffle", builds=InBatchShuffler)
def in_batch_shuffle(self: IterDataPipe[T]) -> IterDataPipe[T]:
    """Shuffles the items inside each batch (a list or tuple).

    Keyed as ``random_map``'s generator is: the same order for any number of workers,
    and again on resume. ``set_shuffle(False)`` on the result leaves batches as they are.

    Returns:
        A pipe of the same batches, each in a shuffled order.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> [sorted(b) for b in IterableWrapper(range(6)).batch(3).in_batch_shuffle()]
        [[0, 1, 2], [3, 4, 5]]
    """
    return InBatchShuffler(self)


def _as_is(batch: Any, rng: np.random.Generator) -> Any:
    return batch
