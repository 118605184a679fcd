"""``random_split``: split an input into groups at random, the same way on every run for
the same seed (torchdata's op and arguments).

The ``total_length`` positions are shuffled by a keyed permutation of the seed and cut
into consecutive ranges, one per group, sized by the weights (largest remainders, so the
sizes add up to ``total_length`` exactly). Item ``i`` of the input goes to the group
whose range holds its shuffled position. A group is a filter on the item's index alone:
each group reads the input on its own (no buffer; several can be read at once), resumes
at any cut, and the split is the same in every epoch until ``override_seed``.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterator, Mapping
from typing import Any, TypeVar, overload

from conveyor.core.base import IterDataPipe
from conveyor.core.passes import PassContext, State, ThroughPass
from conveyor.core.permutation import KeyedPermutation
from conveyor.errors import StateError

T = TypeVar("T")


def split_sizes(weights: list[float], total_length: int) -> list[int]:
    """Sizes proportional to ``weights`` that add up to ``total_length`` (largest remainders;
    ties go to the earlier group)."""
    total = sum(weights)
    exact = [w * total_length / total for w in weights]
    sizes = [math.floor(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - sizes[i]), i))
    for i in order[: total_length - sum(sizes)]:
        sizes[i] += 1
    return sizes


class RandomSplitPass(ThroughPass):
    """``count``: input items read (the index of the next one)."""

    def __init__(self, pipe: RandomSplit, state: State | None, context: PassContext):
        super().__init__(pipe, state, context)
        self.count = state["count"] if state is not None else 0
        self._kept = 0
        self.items = self._split(pipe)

    def _split(self, pipe: RandomSplit) -> Iterator[Any]:
        shuffled = KeyedPermutation(pipe.total_length, pipe.seed)
        low, high = pipe.bounds()
        for item in self.source:
            index = self.count
            if index >= pipe.total_length:
                raise ValueError(
                    f"{pipe!r}: the input has more than total_length={pipe.total_length} items; "
                    "give random_split the input's length"
                )
            self.count += 1
            if low <= shuffled[index] < high:
                self._kept += 1
                yield item

    def own_state(self) -> State:
        return {"count": self.count}

    def yielded(self) -> int:
        return self._kept


class RandomSplit(IterDataPipe):
    """One group of a :func:`random_split`: the items whose shuffled index falls in its
    range.

    Args:
        source: The pipe being split.
        keys: Every group's key, in the order of ``random_split``'s ``weights``.
        sizes: Every group's number of items, in the same order (they add up to the input's length).
        seed: The seed of the permutation that decides each item's group.
        target: The key of the group this pipe yields.
    """

    per_item = True  # an item's group depends on its index alone
    keeps_order = True
    pass_type = RandomSplitPass
    state_fields = {"count": int, "source": dict}
    _params = ("keys", "sizes", "seed", "target")

    def __init__(
        self, source: IterDataPipe, keys: tuple[Hashable, ...], sizes: tuple[int, ...], seed: int, target: Any
    ):
        self.source = source
        self.keys = keys
        self.sizes = sizes
        self.seed = seed
        self.target = target

    @property
    def total_length(self) -> int:
        return sum(self.sizes)

    def bounds(self) -> tuple[int, int]:
        at = self.keys.index(self.target)
        low = sum(self.sizes[:at])
        return low, low + self.sizes[at]

    def override_seed(self, seed: int) -> RandomSplit:
        """Split by ``seed`` from the next pass on (torchdata's way to re-split per epoch)."""
        self.seed = _check_seed(seed)
        return self

    def __len__(self) -> int:
        return self.sizes[self.keys.index(self.target)]

    def check_own_state(self, state: Mapping[str, Any], where: str) -> None:
        if state["count"] > self.total_length:
            raise StateError(f"{where}: 'count' {state['count']} exceeds total_length {self.total_length}")


def _check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"random_split: seed must be an int, got {type(seed).__name__}")
    return seed


def random_split(
    source: IterDataPipe,
    weights: Mapping[Hashable, float],
    seed: int,
    total_length: int | None = None,
    target: Hashable | None = None,
) -> list[RandomSplit] | RandomSplit:
    """Split ``source`` into groups sized by ``weights`` (``{key: weight}``), at random by
    ``seed``: a list of groups in the order of ``weights``, or the one group ``target``.
    ``total_length`` is the input's length (its ``len()`` when omitted).

    Args:
        source: The pipe to split.
        weights: ``{key: weight}``: one group per key, sized in proportion to its positive weight.
        seed: The seed of the split: the same seed, the same groups on every run.
        total_length: The number of items ``source`` yields; None: its ``len()``.
        target: Return only the group of this key; None: every group, in the order of ``weights``.
    """
    if not isinstance(weights, Mapping) or not weights:
        raise ValueError("random_split needs a non-empty dict of {key: weight}")
    for key, weight in weights.items():
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
            raise ValueError(f"random_split: weights must be positive numbers, got {weight!r} for {key!r}")
    if total_length is None:
        try:
            total_length = len(source)
        except TypeError:
            raise TypeError(
                f"random_split needs total_length: {source!r} has no len(); give the number of items it yields"
            ) from None
    if isinstance(total_length, bool) or not isinstance(total_length, int) or total_length < 0:
        raise ValueError(f"random_split: total_length must be an int >= 0, got {total_length!r}")
    keys = tuple(weights)
    sizes = tuple(split_sizes([float(weights[k]) for k in keys], total_length))
    seed = _check_seed(seed)
    if target is not None:
        if target not in weights:
            raise KeyError(f"random_split: target={target!r} is not a key of weights ({list(keys)!r})")
        return RandomSplit(source, keys, sizes, seed, target)
    return [RandomSplit(source, keys, sizes, seed, key) for key in keys]


@overload
def split_randomly(
    self: IterDataPipe[T], weights: Mapping[Hashable, float], seed: int, total_length: int | None, target: Hashable
) -> IterDataPipe[T]: ...
@overload
def split_randomly(
    self: IterDataPipe[T],
    weights: Mapping[Hashable, float],
    seed: int,
    total_length: int | None = None,
    *,
    target: Hashable,
) -> IterDataPipe[T]: ...
@overload
def split_randomly(
    self: IterDataPipe[T],
    weights: Mapping[Hashable, float],
    seed: int,
    total_length: int | None = None,
    target: None = None,
) -> list[IterDataPipe[T]]: ...
@IterDataPipe.register_functional("random_split")
def split_randomly(
    self: IterDataPipe[T],
    weights: Mapping[Hashable, float],
    seed: int,
    total_length: int | None = None,
    target: Hashable | None = None,
) -> list[IterDataPipe[T]] | IterDataPipe[T]:
    """Splits the items into groups at random, sized by ``weights`` (a train/validation split).

    Every item goes to exactly one group, the same one for a given ``seed`` whatever the
    epoch; ``override_seed(seed)`` on a group re-splits from the next pass on.

    Args:
        weights: Group key -> its weight; the groups' sizes follow the weights.
        seed: The seed of the split.
        total_length: How many items this pipe yields; None: its ``len()``.
        target: Return only this group.

    Returns:
        The groups, a list in the order of ``weights``; or the ``target`` group alone.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> train, valid = IterableWrapper(range(10)).random_split({"train": 0.8, "valid": 0.2}, seed=0)
        >>> len(list(train)), len(list(valid)), sorted([*train, *valid]) == list(range(10))
        (8, 2, True)
    """
    groups = random_split(self, weights, seed, total_length, target)
    return list(groups) if isinstance(groups, list) else groups
