"""Graph tools, sharding and seed application."""

from __future__ import annotations

import pickle

import pytest

from conveyor.errors import GraphError
from conveyor.graph import (
    SHARDING_PRIORITIES,
    apply_random_seed,
    apply_sharding,
    describe,
    find_dps,
    fingerprint,
    list_dps,
    remove_dp,
    replace_dp,
    traverse,
)
from conveyor.pipes import IterableWrapper, Mapper, ShardingFilter, Shuffler
from conveyor.random import SeedGenerator


def _chain():
    source = IterableWrapper(range(10))
    mapped = source.map(lambda x: x + 1)
    return source, mapped, mapped.filter(lambda x: x % 2 == 0)


class Unpicklable:
    def __reduce__(self):
        raise AssertionError("graph tools must not pickle the graph")


def test_traverse_and_list_dps_walk_without_pickling():
    source, mapped, end = _chain()
    mapped.poison = Unpicklable()  # a public attribute that is not a pipe
    graph = traverse(end)
    ((node, children),) = graph.values()
    assert node is end
    ((child, grandchildren),) = children.values()
    assert child is mapped and next(iter(grandchildren.values()))[0] is source
    assert list_dps(end) == [end, mapped, source]
    assert list_dps(end, exclude=mapped) == [end]
    with pytest.raises(AssertionError, match="must not pickle"):
        pickle.dumps(mapped.poison)


def test_list_dps_dedups_and_is_breadth_first():
    a, b = IterableWrapper([1]), IterableWrapper([2])
    zipped = a.map(str).zip(b)
    nodes = list_dps(zipped)
    assert nodes[0] is zipped and nodes[-1] is a and nodes[-2] is b
    assert len(nodes) == 4


def test_find_dps_is_isinstance_and_returns_list():
    _, mapped, end = _chain()
    found = find_dps(end, Mapper)
    assert found == [mapped] and isinstance(found, list)
    assert find_dps(end, (Mapper, ShardingFilter)) == [mapped]


def test_replace_and_remove():
    source, mapped, end = _chain()
    replacement = source.map(lambda x: x * 3)
    assert replace_dp(end, mapped, replacement) is end
    assert list(end) == [0, 6, 12, 18, 24]
    assert remove_dp(end, replacement) is end
    assert list(end) == [0, 2, 4, 6, 8]
    assert remove_dp(end, end) is source
    with pytest.raises(GraphError, match="source"):
        remove_dp(end, source)
    zipped = IterableWrapper([1]).zip(IterableWrapper([2]))
    with pytest.raises(GraphError, match="2 inputs"):
        remove_dp(zipped.map(str), zipped)
    with pytest.raises(GraphError, match="not in the graph"):
        replace_dp(end, IterableWrapper([]), source)


def test_replace_inside_multi_input_pipes():
    a, b, c = IterableWrapper([1]), IterableWrapper([2]), IterableWrapper([3])
    concat = a.concat(b)
    replace_dp(concat, b, c)
    assert list(concat) == [1, 3]


def _shard(n, levels):
    pipe = IterableWrapper(range(n)).sharding_filter()
    for priority, (num, index) in levels.items():
        apply_sharding(pipe, num, index, priority)
    return pipe


def test_rank_items_do_not_depend_on_num_workers():
    n, world = 23, 3
    for rank in range(world):
        expected = [i for i in range(n) if i % world == rank]
        for workers in (1, 2, 4):
            per_worker = []
            for worker in range(workers):
                pipe = _shard(
                    n,
                    {
                        SHARDING_PRIORITIES.DISTRIBUTED: (world, rank),
                        SHARDING_PRIORITIES.MULTIPROCESSING: (workers, worker),
                    },
                )
                items = list(pipe)
                assert len(pipe) == len(items)
                assert items == [i for i in expected if (i // world) % workers == worker]
                per_worker.append(items)
            assert sorted(item for items in per_worker for item in items) == expected


def test_sharding_priority_order_does_not_matter_for_application():
    a = _shard(20, {SHARDING_PRIORITIES.MULTIPROCESSING: (2, 1), SHARDING_PRIORITIES.DISTRIBUTED: (2, 0)})
    b = _shard(20, {SHARDING_PRIORITIES.DISTRIBUTED: (2, 0), SHARDING_PRIORITIES.MULTIPROCESSING: (2, 1)})
    assert list(a) == list(b) == [2, 6, 10, 14, 18]


def test_apply_sharding_checks():
    pipe = IterableWrapper(range(4)).sharding_filter().sharding_filter()
    with pytest.raises(GraphError, match="sharded once"):
        apply_sharding(pipe, 2, 0, SHARDING_PRIORITIES.DEFAULT)
    with pytest.raises(ValueError, match="shard_index"):
        apply_sharding(IterableWrapper([]).sharding_filter(), 2, 2)
    with pytest.warns(UserWarning, match="no sharding_filter"):
        apply_sharding(IterableWrapper([]), 2, 0)


def test_random_ops_before_sharding_share_a_stream_after_are_keyed_by_position():
    def build():
        return (
            IterableWrapper(range(40))
            .shuffle(buffer_size=40)
            .sharding_filter()
            .random_map(lambda x, rng: (x, int(rng.integers(1 << 30))))
        )

    seeds = SeedGenerator(7, epoch=3)
    whole = list(apply_random_seed(build(), seeds))
    by_worker = {}
    for worker in range(3):
        pipe = apply_sharding(build(), 3, worker, SHARDING_PRIORITIES.MULTIPROCESSING)
        apply_random_seed(pipe, seeds.spawn(worker))  # a worker's own path: shared stream unchanged
        by_worker[worker] = list(pipe)
    merged = [by_worker[i % 3][i // 3] for i in range(40)]
    assert merged == whole, "random ops after the sharding point must not depend on the worker count"
    shuffler = find_dps(build(), Shuffler)[0]
    assert shuffler is not None


def test_fingerprint_tracks_structure_and_params_not_state():
    def build(batch=4):
        return IterableWrapper(range(10)).shuffle().sharding_filter().batch(batch)

    assert fingerprint(build()) == fingerprint(build())
    assert fingerprint(build()) != fingerprint(build(5))
    pipe = build()
    before = fingerprint(pipe)
    list(pipe)
    apply_sharding(pipe, 2, 1)
    assert fingerprint(pipe) == before
    rows = describe(pipe)
    assert rows[0]["pipe"].startswith("Batcher(batch_size=4") and rows[0]["inputs"] == [1]


def test_cycles_in_a_graph_are_rejected():
    a = IterableWrapper([1]).map(str)
    a.source = a
    with pytest.raises(GraphError, match="cycle"):
        list_dps(a)
