"""Graph tools, sharding and seed application."""

from __future__ import annotations

import pickle
import shutil
import subprocess

import pytest

from conveyor.core.graph import (
    SHARDING_PRIORITIES,
    apply_random_seed,
    apply_sharding,
    describe,
    find_dps,
    fingerprint,
    list_dps,
    remove_dp,
    replace_dp,
    to_dot,
    to_mermaid,
    traverse,
    traverse_dps,
)
from conveyor.errors import GraphError
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
    assert list_dps(end, exclude_dps=mapped) == [end]
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
    with pytest.raises(RuntimeError):  # what torchdata's graph tools raise here
        remove_dp(end, source)
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


def drawn_pipeline():
    return (
        IterableWrapper(range(5))
        .shuffle()
        .sharding_filter()
        .map(lambda x: {"quoted": '"x"'})
        .zip(IterableWrapper(range(5)))
        .fullsync()
        .batch(2)
    )


def test_to_dot_is_valid_dot_with_every_node_and_edge():
    pydot = pytest.importorskip("pydot")
    text = to_dot(drawn_pipeline(), name='my "pipe"')
    (graph,) = pydot.graph_from_dot_data(text)
    nodes = {n.get_name(): n for n in graph.get_nodes() if n.get_name() != "node"}  # "node": the defaults
    assert len(nodes) == 8
    labels = {n.get_label().strip('"') for n in nodes.values()}
    assert any(label.startswith("ShardingFilter") for label in labels)
    assert any("<lambda>" in label for label in labels)
    edges = {(e.get_source(), e.get_destination()) for e in graph.get_edges()}
    assert len(edges) == 7  # two sources join at zip
    assert nodes["n0"].get_label().strip('"').startswith("Batcher")  # the end, fed by fullsync
    (feeding_end,) = [s for s, d in edges if d == "n0"]
    assert nodes[feeding_end].get_label().strip('"').startswith("FullSync")
    assert nodes[feeding_end].get("style") == "dashed"  # runs in the main process ...
    assert nodes["n0"].get("style") == "dashed"  # ... and so does everything after it
    assert sum(n.get("style") == "dashed" for n in nodes.values()) == 2


def test_to_dot_renders_with_graphviz(tmp_path):
    dot = shutil.which("dot")
    assert dot is not None, "graphviz's `dot` is missing: .ci/system-packages installs it"
    svg = subprocess.run([dot, "-Tsvg"], input=to_dot(drawn_pipeline()), capture_output=True, text=True, timeout=60)
    assert svg.returncode == 0, svg.stderr
    assert svg.stdout.count('<g id="node') == 8 and "ShardingFilter" in svg.stdout


def test_to_mermaid_lists_nodes_then_edges_with_safe_labels():
    text = to_mermaid(drawn_pipeline())
    lines = text.splitlines()
    assert lines[0] == "flowchart LR"
    nodes = [line for line in lines[1:] if "-->" not in line]
    edges = [line for line in lines[1:] if "-->" in line]
    assert len(nodes) == 8 and len(edges) == 7
    assert any(line.strip().startswith("n") and "[[" in line and "ShardingFilter" in line for line in nodes)
    assert all('"' not in line.split('"', 1)[1].rsplit('"', 1)[0] for line in nodes)  # quotes escaped
    assert "#lt;lambda#gt;" in text


def test_the_graph_tools_take_the_graph_dict_as_torchdata_and_give_one_back():
    source, mapped, end = _chain()
    graph = traverse_dps(end)
    assert list_dps(graph) == [end, mapped, source]
    assert list_dps(graph, exclude_dps=[mapped]) == [end]
    assert find_dps(graph, Mapper) == [mapped]
    replacement = source.map(lambda x: x * 3)
    replaced = replace_dp(graph, mapped, replacement)
    assert isinstance(replaced, dict) and list_dps(replaced) == [end, replacement, source]
    removed = remove_dp(replaced, replacement)
    assert isinstance(removed, dict) and list_dps(removed) == [end, source]
    assert list(end) == [0, 2, 4, 6, 8]
    assert list_dps(remove_dp(traverse_dps(end), end)) == [source]  # the end removed: its input is the end
    with pytest.raises(GraphError, match="Cannot remove the source DataPipe"):
        remove_dp(traverse_dps(end), source)
    zipped = IterableWrapper([1]).zip(IterableWrapper([2]))
    with pytest.raises(GraphError, match="Cannot remove the receiving DataPipe"):
        remove_dp(traverse_dps(zipped.map(str)), zipped)
    with pytest.raises(GraphError, match="one pipe"):
        list_dps({**traverse_dps(end), **traverse_dps(zipped)})
    with pytest.raises(TypeError, match="traverse_dps"):
        list_dps([end])  # type: ignore[arg-type]


def test_set_datapipes_seed_seeds_random_ops_from_the_shared_or_own_stream() -> None:
    from conveyor.graph import set_datapipes_seed, set_graph_random_seed

    def order(shared: bool, path: int) -> list[int]:
        pipe = IterableWrapper(range(20)).shuffle()
        seeds = SeedGenerator(5).spawn(path)
        set_datapipes_seed(list_dps(pipe), seeds, distributed_shared=shared)
        return list(pipe)

    assert order(True, 0) == order(True, 1)  # the shared stream: alike in every worker
    assert order(False, 0) != order(False, 1)  # each worker's own stream
    assert order(False, 0) == order(False, 0)
    pipe = IterableWrapper(range(20)).shuffle()
    assert set_graph_random_seed(pipe, SeedGenerator(3)) is pipe
    assert list(pipe) == list(pipe)
