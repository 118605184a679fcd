"""The item types users get from the fluent API, as a type checker sees them.

mypy checks this file (``tests/unit/test_typing.py``; ``[tool.mypy]`` in pyproject.toml):
each ``assert_type`` is the type a user's code gets. A ``# type: ignore[code]`` marks a
call the checker must refuse: with ``warn_unused_ignores`` a call it accepts fails the run.
Nothing here runs under pytest.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, assert_type

import numpy as np
from numpy.typing import NDArray

from conveyor.pipes import IterableWrapper, IterDataPipe, MapDataPipe, SequenceWrapper

# --- sources -------------------------------------------------------------------------

numbers = IterableWrapper(range(10))
assert_type(numbers, IterableWrapper[int])
words = IterableWrapper(["a", "bb"])
assert_type(words, IterableWrapper[str])
table = SequenceWrapper([1.0, 2.0])
assert_type(table, SequenceWrapper[float])
assert_type(table[0], float)

# --- one item in, one item out ----------------------------------------------------------

assert_type(numbers.map(str), IterDataPipe[str])
assert_type(numbers.map(lambda x: x * 0.5), IterDataPipe[float])
assert_type(words.map(len).map(lambda n: n > 1), IterDataPipe[bool])
assert_type(numbers.map(str, input_col=0), IterDataPipe[Any])  # columns: the result's type is the item's
assert_type(numbers.filter(lambda x: x % 2 == 0), IterDataPipe[int])
assert_type(numbers.random_map(lambda x, rng: x + rng.uniform()), IterDataPipe[float])
assert_type(numbers.threadpool_map(str), IterDataPipe[str])
assert_type(words.enumerate(), IterDataPipe[tuple[int, str]])

# --- order, sharding and counts keep the items ---------------------------------------

assert_type(numbers.shuffle(), IterDataPipe[int])
assert_type(numbers.sharding_filter(), IterDataPipe[int])
assert_type(numbers.shuffle(buffer_size=100).sharding_filter().header(5), IterDataPipe[int])
assert_type(numbers.cycle(2).repeat(2).set_length(40), IterDataPipe[int])
assert_type(numbers.prefetch(4).in_memory_cache(), IterDataPipe[int])
assert_type(numbers.pin_memory(), IterDataPipe[int])

# --- batches ------------------------------------------------------------------------------

batches = numbers.batch(4)
assert_type(batches, IterDataPipe[list[int]])
assert_type(batches.unbatch(), IterDataPipe[int])
assert_type(batches.in_batch_shuffle(), IterDataPipe[list[int]])
assert_type(batches.collate(), IterDataPipe[Any])  # default_collate: arrays, dicts, tuples
assert_type(batches.collate(np.asarray), IterDataPipe[NDArray[Any]])
assert_type(batches.collate(fn=sum), IterDataPipe[int])
assert_type(numbers.bucketbatch(4), IterDataPipe[list[int]])
assert_type(words.max_token_bucketize(8), IterDataPipe[list[str]])
assert_type(numbers.map_batches(lambda xs: [sum(xs)], 3), IterDataPipe[int])
assert_type(words.flatmap(lambda w: list(w)), IterDataPipe[str])
assert_type(IterableWrapper([[1, 2], [3]]).flatmap(), IterDataPipe[int])
assert_type(numbers.groupby(lambda x: x % 3), IterDataPipe[list[int]])
assert_type(numbers.groupby(lambda x: x % 3, keep_key=True), IterDataPipe[tuple[int, list[int]]])

# --- several inputs -----------------------------------------------------------------------

assert_type(numbers.zip(words), IterDataPipe[tuple[int, str]])
assert_type(numbers.zip(words, numbers.map(float)), IterDataPipe[tuple[int, str, float]])
assert_type(numbers.concat(numbers), IterDataPipe[int])
assert_type(numbers.mux(numbers, numbers), IterDataPipe[int])
left, right = numbers.fork(2)
assert_type(left, IterDataPipe[int])
assert_type(numbers.demux(2, lambda x: x % 2), list[IterDataPipe[int]])
assert_type(numbers.random_split({"train": 0.9, "valid": 0.1}, seed=0), list[IterDataPipe[int]])
assert_type(numbers.random_split({"train": 0.9, "valid": 0.1}, seed=0, target="train"), IterDataPipe[int])

# --- random access -------------------------------------------------------------------------

assert_type(table.map(int), MapDataPipe[int])
assert_type(table.batch(2), MapDataPipe[list[float]])
assert_type(table.shuffle(), MapDataPipe[float])
assert_type(table.to_iter_datapipe(), IterDataPipe[float])
assert_type(table.map(str).to_iter_datapipe().batch(2), IterDataPipe[list[str]])

# --- files ----------------------------------------------------------------------------------

paths = IterableWrapper(["data/"]).list_files(masks="*.csv")
assert_type(paths, IterDataPipe[str])
assert_type(paths.shard_expand(), IterDataPipe[str])
assert_type(paths.open_files().readlines(return_path=False), IterDataPipe[Any])
assert_type(paths.open_files(mode="b").load_from_tar().webdataset(), IterDataPipe[dict[str, Any]])

# --- what a type checker refuses ------------------------------------------------------------

numbers.map(lambda x: x.upper())  # type: ignore[attr-defined]  # an int has no upper()
words.filter(lambda w: w + 1)  # type: ignore[operator]  # str + int
numbers.unbatch()  # type: ignore[call-arg]  # ints are not batches
numbers.batch("4")  # type: ignore[arg-type]
numbers.list_files()  # type: ignore[misc]  # list_files reads paths, not ints


# --- pipes as annotations, and a subclass's items ---------------------------------------------


def first_words(pipe: IterDataPipe[str]) -> IterDataPipe[str]:
    return pipe.map(lambda line: line.split(" ")[0])


assert_type(first_words(words.map(str.upper)), IterDataPipe[str])


class Squares(IterDataPipe[int]):
    """A user's source, typed by its base."""

    def __iter__(self) -> Iterator[int]:
        return iter([1, 4, 9])


assert_type(Squares().map(float), IterDataPipe[float])
assert_type(Squares().batch(2).collate(np.asarray), IterDataPipe[NDArray[Any]])
for square in Squares():
    assert_type(square, int)
