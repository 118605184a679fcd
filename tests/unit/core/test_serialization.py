"""Sending graphs to other processes: lambdas and __main__ functions travel by value."""

from __future__ import annotations

import multiprocessing
import threading

import pytest

from conveyor.core.serialization import SerializationError, dumps, loads
from conveyor.pipes import IterableWrapper


def _iterate_in_child(payload: bytes, queue) -> None:
    queue.put(list(loads(payload)))


def test_graph_with_lambdas_round_trips():
    offset = 3
    pipe = IterableWrapper(range(5)).map(lambda x: x + offset).filter(lambda x: x % 2 == 0)
    assert list(loads(dumps(pipe))) == [4, 6]


@pytest.mark.timeout(60)
def test_graph_with_lambdas_runs_in_a_spawned_process():
    pipe = IterableWrapper(range(6)).map(lambda x: x * 10).shuffle(buffer_size=3).set_shuffle(False)
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_iterate_in_child, args=(dumps(pipe), queue))
    child.start()
    try:
        assert queue.get(timeout=50) == [0, 10, 20, 30, 40, 50]
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()
            child.join()


def test_unpicklable_graph_raises_a_clear_error():
    pipe = IterableWrapper([threading.Lock()], deepcopy=False)
    with pytest.raises(SerializationError, match="cannot pickle"):
        dumps(pipe)


def test_plain_pickle_and_deepcopy_of_a_graph_with_lambdas_and_local_functions():
    """As the issue asks: pickling a graph uses cloudpickle where plain pickle fails."""
    import copy
    import functools
    import pickle

    from conveyor.pipes import IterableWrapper

    offset = 3

    def keep(x):
        return x % 2 == 0

    graph = IterableWrapper(range(6)).map(lambda x: x + offset).filter(keep).batch(2)
    assert list(pickle.loads(pickle.dumps(graph))) == [[4, 6], [8]]
    copied = copy.deepcopy(graph)
    assert list(copied) == [[4, 6], [8]]
    assert copied.source.filter_fn is graph.source.filter_fn, "a deep copy shares functions, as Python's does"
    assert list(copy.copy(graph.source)) == [4, 6, 8]
    assert copy.copy(graph.source).filter_fn is keep

    def shift(x, by):
        return x + by

    partial_graph = IterableWrapper(range(3)).map(functools.partial(shift, by=offset))
    assert list(pickle.loads(pickle.dumps(partial_graph))) == [3, 4, 5]
