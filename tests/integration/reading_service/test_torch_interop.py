"""Torch interop: torch datasets and datapipe graphs as sources, ``TorchDataLoaderReadingService``
and ``pin_memory``."""

from __future__ import annotations

import copy
import json
import os
import pickle
import random
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, IterableDataset
from torch.utils.data.datapipes.iter import IterableWrapper as TorchIterableWrapper

import conveyor
from conveyor import (
    DataLoader2,
    DistributedReadingService,
    InProcessReadingService,
    MultiProcessingReadingService,
    SeedGenerator,
    SequentialReadingService,
    TorchDataLoaderReadingService,
)
from conveyor.errors import GraphError, MissingDependencyError, StateError, WorkerError
from conveyor.graph import SHARDING_PRIORITIES, apply_random_seed, apply_sharding, list_dps
from conveyor.pipes import (
    IterableWrapper,
    PinMemory,
    ShardingPoint,
    TorchDataPipe,
    TorchIterableDataset,
    TorchMapDataset,
    from_torch,
)
from conveyor.pipes.torch.torch_sources import ShardedTorchDataPipe
from conveyor.reading_service.graph_split import split_replicable
from distributed_helpers import run_ranks, succeeded
from pipeline_helpers import read_epochs, resume_after
from process_helpers import alive

PROCESS_TIMEOUT = pytest.mark.timeout(60)


# --- module-level helpers (picklable under spawn) -----------------------------------------


class Squares(Dataset):
    def __init__(self, n: int):
        self.n = n

    def __getitem__(self, index: int) -> int:
        if not 0 <= index < self.n:
            raise IndexError(index)
        return index * index

    def __len__(self) -> int:
        return self.n


class NoLength(Dataset):
    def __getitem__(self, index: int) -> int:
        return index


class Counting(IterableDataset):
    """Yields 0..n-1; records whether torch's worker info was set while iterating."""

    def __init__(self, n: int):
        self.n = n

    def __iter__(self):
        in_torch_worker = torch.utils.data.get_worker_info() is not None
        for i in range(self.n):
            yield (i, in_torch_worker)


class SelfSharding(IterableDataset):
    """Splits itself by torch's worker info, the usual torch recipe."""

    def __init__(self, n: int):
        self.n = n

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        start, step = (info.id, info.num_workers) if info is not None else (0, 1)
        return iter(range(start, self.n, step))


def double(x: int) -> int:
    return 2 * x


def not_multiple_of_three(x: int) -> bool:
    return x % 3 != 0


def with_pid(x: int) -> tuple[int, int]:
    return (x, os.getpid())


def draws(x: int) -> tuple[int, int, float, float, float]:
    info = conveyor.get_worker_info()
    return (x, info.worker_id, random.random(), float(np.random.random()), float(torch.rand(()).item()))


_INIT_ID = None


def remember_worker(worker_id: int) -> None:
    global _INIT_ID
    _INIT_ID = worker_id


def report_worker(x: int) -> tuple[int, int | None, int, int]:
    torch_info = torch.utils.data.get_worker_info()
    return (x, _INIT_ID, conveyor.get_worker_info().worker_id, torch_info.id)


def fail_on_five(x: int) -> int:
    if x == 5:
        raise ValueError("five is not welcome")
    return x


def torch_graph(n: int = 30):
    """A torch datapipe graph: shuffle before the sharding filter, per-item ops after it."""
    return TorchIterableWrapper(range(n)).shuffle().sharding_filter().map(double).filter(not_multiple_of_three)


def portable_source():
    return from_torch(torch_graph())


def batched_source():
    return from_torch(TorchIterableWrapper(range(30)).shuffle().sharding_filter().batch(4))


def conveyor_pipeline(n: int = 40):
    return IterableWrapper(range(n)).shuffle().sharding_filter().map(double)


def epochs(loader: DataLoader2, count: int = 2) -> list[list]:
    try:
        return [list(loader) for _ in range(count)]
    finally:
        loader.shutdown()


# --- from_torch and the source wrappers ----------------------------------------------------


def test_from_torch_picks_the_wrapper():
    assert isinstance(from_torch(Squares(3)), TorchMapDataset)
    assert isinstance(from_torch(Counting(3)), TorchIterableDataset)
    plain = from_torch(TorchIterableWrapper(range(3)).map(double))
    assert type(plain) is TorchDataPipe and not isinstance(plain, ShardingPoint)
    sharded = from_torch(TorchIterableWrapper(range(3)).sharding_filter())
    assert isinstance(sharded, TorchDataPipe) and isinstance(sharded, ShardingPoint)
    assert isinstance(TorchDataPipe(TorchIterableWrapper(range(3)).sharding_filter()), ShardedTorchDataPipe)
    own = IterableWrapper([1])
    assert from_torch(own) is own
    with pytest.raises(TypeError, match=r"from_torch takes a torch\.utils\.data"):
        from_torch([1, 2, 3])
    with pytest.raises(TypeError, match="IterDataPipe graph"):
        TorchDataPipe(Counting(3))
    with pytest.raises(TypeError, match="map-style"):
        TorchMapDataset(Counting(3))


def test_map_dataset_is_random_access():
    pipe = from_torch(Squares(5))
    assert len(pipe) == 5
    assert pipe[2] == 4 and pipe[-1] == 16
    with pytest.raises(IndexError, match="out of range"):
        pipe[5]
    with pytest.raises(TypeError, match="int indices"):
        pipe["1"]
    assert list(DataLoader2(Squares(5))) == [0, 1, 4, 9, 16]
    tensors = torch.utils.data.TensorDataset(torch.arange(3))
    assert [int(t) for (t,) in DataLoader2(tensors)] == [0, 1, 2]
    torch_map_pipe = torch.utils.data.datapipes.map.SequenceWrapper(["a", "b"])
    assert isinstance(from_torch(torch_map_pipe), TorchMapDataset)
    assert list(DataLoader2(torch_map_pipe)) == ["a", "b"]
    shuffled = DataLoader2(pipe.shuffle())
    shuffled.seed(1)
    first = list(shuffled)
    assert sorted(first) == [0, 1, 4, 9, 16]
    with pytest.raises(TypeError, match="has no __len__"):
        len(from_torch(NoLength()))


def test_dataloader2_wraps_torch_objects_and_rejects_others():
    assert [x for x, _ in DataLoader2(Counting(4))] == [0, 1, 2, 3]
    assert list(DataLoader2(TorchIterableWrapper(range(4)).map(double))) == [0, 2, 4, 6]
    with pytest.raises(TypeError, match="DataLoader2 takes an IterDataPipe or MapDataPipe"):
        DataLoader2(42)


@PROCESS_TIMEOUT
def test_iterable_dataset_is_split_by_a_conveyor_sharding_filter():
    pipe = from_torch(Counting(25)).sharding_filter()
    items = read_epochs(pipe, num_workers=2, count=1)[0]
    assert [x for x, _ in items] == list(range(25))  # every item once, single-process order
    assert not any(in_torch_worker for _, in_torch_worker in items)  # conveyor workers are not torch's


def test_iterable_dataset_resumes_by_replay():
    loader = DataLoader2(from_torch(Counting(10)))
    iterator = iter(loader)
    head = [next(iterator)[0] for _ in range(4)]
    state = json.loads(json.dumps(loader.state_dict()))
    resumed = DataLoader2(from_torch(Counting(10)))
    resumed.load_state_dict(state)
    assert head + [x for x, _ in resumed] == list(range(10))


def test_wrappers_pickle_and_deepcopy():
    for pipe in (from_torch(Squares(4)), from_torch(Counting(4)), from_torch(TorchIterableWrapper(range(4)))):
        for clone in (pickle.loads(pickle.dumps(pipe)), copy.deepcopy(pipe)):
            assert type(clone) is type(pipe)
            assert list(clone) == list(pipe)
    sharded = portable_source()
    apply_random_seed(sharded, SeedGenerator(7))  # copies carry the randomness along
    list(sharded)  # installs the position probe: the copies must carry it along
    pickled, copied = pickle.loads(pickle.dumps(sharded)), copy.deepcopy(sharded)
    assert type(pickled) is type(copied) is ShardedTorchDataPipe
    first, second = pickled.open(), copied.open()
    items = list(first)
    assert items == list(second)  # same randomness and pass: the same torch shuffle
    assert first.position() == second.position() is not None
    assert sorted(items) == sorted(sharded)


# --- torch datapipe graphs: sharding, seeds, positions, resume -----------------------------


@PROCESS_TIMEOUT
def test_torch_graph_gives_the_same_output_for_any_num_workers():
    runs = {nw: read_epochs(portable_source(), seed=7, num_workers=nw) for nw in (0, 1, 2)}
    expected = sorted(double(i) for i in range(30) if not_multiple_of_three(double(i)))
    assert sorted(runs[0][0]) == sorted(runs[0][1]) == expected  # each item once per epoch
    assert runs[0][0] != runs[0][1]  # the torch shuffle is reseeded each epoch
    assert runs[0] == runs[1] == runs[2]
    assert read_epochs(portable_source(), seed=7, num_workers=2) == runs[2]  # reproducible
    assert read_epochs(portable_source(), seed=8, num_workers=0) != runs[0]


def test_loader_seeds_the_torch_shuffle_only_through_the_wrapper():
    user_graph = torch_graph()
    loader = DataLoader2(user_graph)
    loader.seed(3)
    first = epochs(loader, 1)[0]
    again = DataLoader2(user_graph)
    again.seed(3)
    assert epochs(again, 1)[0] == first
    probes = [
        type(n).__name__
        for n in torch.utils.data.graph_settings.get_all_graph_pipes(torch.utils.data.graph.traverse_dps(user_graph))
    ]
    assert "PositionProbe" not in probes  # the loader worked on its own copy


@PROCESS_TIMEOUT
@pytest.mark.parametrize("num_workers", [1, 2])
def test_torch_graph_nested_sharding_is_disjoint_and_complete(num_workers):
    world = 2
    per_rank = []
    for rank in range(world):
        pipe = from_torch(TorchIterableWrapper(range(24)).sharding_filter())
        apply_sharding(pipe, world, rank, SHARDING_PRIORITIES.DISTRIBUTED)
        per_rank.append(read_epochs(pipe, num_workers=num_workers, count=1)[0])
        # torch's nesting: worker i % nw of rank (i // nw) % world (documented in torch_sources)
        assert per_rank[-1] == [i for i in range(24) if (i // num_workers) % world == rank]
    assert not set(per_rank[0]) & set(per_rank[1])
    assert sorted(per_rank[0] + per_rank[1]) == list(range(24))


def test_torch_graph_forwards_each_level_to_the_torch_group_of_the_same_name():
    pipe = from_torch(TorchIterableWrapper(range(12)).sharding_filter())
    apply_sharding(pipe, 2, 1, SHARDING_PRIORITIES.DISTRIBUTED)
    apply_sharding(pipe, 3, 2, SHARDING_PRIORITIES.MULTIPROCESSING)
    (torch_filter,) = [
        n
        for n in torch.utils.data.graph_settings.get_all_graph_pipes(torch.utils.data.graph.traverse_dps(pipe.datapipe))
        if type(n).__name__ == "ShardingFilterIterDataPipe"
    ]
    groups = {int(k): v for k, v in torch_filter.groups.items()}
    assert groups == {2: (2, 1), 3: (3, 2)}  # torch's DISTRIBUTED=2, MULTIPROCESSING=3
    # the same items as torch's own filter with those groups: i % 6 == 2 + 3 * 1
    opened = pipe.open()
    assert list(opened) == [i for i in range(12) if i % 6 == 5]
    assert opened.position() == (11,)
    mixed = from_torch(TorchIterableWrapper(range(4)).sharding_filter())
    apply_sharding(mixed, 2, 0, SHARDING_PRIORITIES.DEFAULT)
    with pytest.raises(GraphError, match="refuses this sharding"):
        apply_sharding(mixed, 2, 0, SHARDING_PRIORITIES.MULTIPROCESSING)


def test_unsharded_torch_graph_can_be_split_by_a_conveyor_sharding_filter():
    pipe = from_torch(TorchIterableWrapper(range(20)).map(double)).sharding_filter()
    assert read_epochs(pipe, num_workers=2, count=1)[0] == [double(i) for i in range(20)]


@PROCESS_TIMEOUT
@pytest.mark.parametrize(("saved_with", "resumed_with"), [(2, 2), (2, 0), (0, 2), (1, 3)])
def test_torch_graph_resumes_exactly(saved_with, resumed_with):
    full = read_epochs(portable_source(), seed=7, num_workers=0)
    this_epoch, next_epoch = resume_after(portable_source, 5, 7, saved_with, resumed_with)
    assert this_epoch == full[0]
    assert next_epoch == full[1]


@PROCESS_TIMEOUT
def test_torch_graph_that_groups_after_the_filter_resumes_with_its_own_sharding_only():
    full = read_epochs(batched_source(), seed=7, num_workers=2)
    this_epoch, next_epoch = resume_after(batched_source, 3, 7, 2, 2)
    assert (this_epoch, next_epoch) == (full[0], full[1])
    with pytest.raises(WorkerError, match="resumes in the same shard only"):
        resume_after(batched_source, 3, 7, 2, 3)


def test_torch_graph_state_is_validated():
    pipe = portable_source()
    for bad in (
        {"pass": 0, "count": 0},
        {"pass": 0, "count": -1, "last": None, "shards": [1, 0]},
        {"pass": 0, "count": 0, "last": [], "shards": [1, 0]},
        {"pass": 0, "count": 0, "last": None, "shards": [2, 2]},
    ):
        with pytest.raises(StateError):
            pipe.load_state_dict(bad)


@PROCESS_TIMEOUT
def test_torch_graph_under_spawn():
    items = read_epochs(portable_source(), seed=7, num_workers=2, multiprocessing_context="spawn", count=1)
    assert items == read_epochs(portable_source(), seed=7, num_workers=0, count=1)


# --- TorchDataLoaderReadingService -----------------------------------------------------------


@PROCESS_TIMEOUT
@pytest.mark.parametrize(
    "options",
    [{"num_workers": 0}, {"num_workers": 2}, {"num_workers": 2, "persistent_workers": True, "prefetch_factor": 1}],
)
def test_torch_service_yields_the_in_process_items_epoch_by_epoch(options):
    reference = DataLoader2(conveyor_pipeline(), reading_service=InProcessReadingService())
    reference.seed(11)
    expected = epochs(reference, 3)
    loader = DataLoader2(conveyor_pipeline(), reading_service=TorchDataLoaderReadingService(**options))
    loader.seed(11)
    got = epochs(loader, 3)
    # A per-item pipeline after the sharding filter: torch's round robin over the workers
    # restores the single-process order, and the shuffle (before the filter) agrees in
    # every worker, epoch after epoch, persistent workers included.
    assert got == expected
    assert got[0] != got[1] != got[2]


@PROCESS_TIMEOUT
def test_persistent_workers_get_the_next_epoch_seeds_after_an_abandoned_epoch():
    reference = DataLoader2(conveyor_pipeline(200))
    reference.seed(5)
    expected = epochs(reference, 3)
    service = TorchDataLoaderReadingService(2, persistent_workers=True, prefetch_factor=4)
    loader = DataLoader2(conveyor_pipeline(200), reading_service=service)
    loader.seed(5)
    iterator = iter(loader)
    assert [next(iterator) for _ in range(3)] == expected[0][:3]
    # the workers still hold prefetched items of epoch 0; epoch 1 must not see them
    assert epochs(loader, 2) == expected[1:]


def test_seed_mailbox_carries_base_epoch_and_path():
    from conveyor.reading_service._torch_worker import SeedMailbox

    seeds = SeedGenerator((1 << 64) - 3, epoch=9).spawn(4).spawn(1)
    mailbox = SeedMailbox()
    with pytest.raises(RuntimeError, match="no epoch seeds"):
        mailbox.read()
    mailbox.write(seeds)
    read = pickle.loads(pickle.dumps(mailbox)).read()
    assert (read.base_seed, read.epoch, read.path) == (seeds.base_seed, 9, (4, 1))
    assert read.generate_seed() == seeds.generate_seed()


@PROCESS_TIMEOUT
def test_torch_service_is_reproducible_with_uneven_workers():
    def run():
        pipe = IterableWrapper(range(50)).shuffle().sharding_filter().filter(not_multiple_of_three)
        loader = DataLoader2(pipe, reading_service=TorchDataLoaderReadingService(num_workers=2))
        loader.seed(4)
        return epochs(loader, 2)

    first = run()
    assert sorted(first[0]) == sorted(first[1]) == [i for i in range(50) if not_multiple_of_three(i)]
    assert run() == first


@PROCESS_TIMEOUT
def test_torch_service_seeds_global_rngs_per_worker_and_epoch():
    pipe = IterableWrapper(range(8)).sharding_filter().map(draws)
    service = TorchDataLoaderReadingService(num_workers=2, persistent_workers=True)
    loader = DataLoader2(pipe, reading_service=service)
    loader.seed(21)
    got = epochs(loader, 2)
    for epoch, items in enumerate(got):
        assert [x for x, *_ in items] == list(range(8))
        for worker in (0, 1):
            seed = SeedGenerator(21).for_epoch(epoch).spawn(worker).global_rng_seed()
            py, npy, tg = random.Random(seed), np.random.RandomState(seed & 0xFFFFFFFF), torch.Generator()
            tg.manual_seed(seed)
            mine = [item for item in items if item[1] == worker]
            assert [x for x, *_ in mine] == list(range(worker, 8, 2))
            assert [item[2] for item in mine] == [py.random() for _ in mine]
            assert [item[3] for item in mine] == [npy.random_sample() for _ in mine]
            assert [item[4] for item in mine] == [float(torch.rand((), generator=tg).item()) for _ in mine]
    assert got[0] != got[1]


@PROCESS_TIMEOUT
def test_torch_service_calls_worker_init_fn_with_the_worker_id():
    pipe = IterableWrapper(range(6)).sharding_filter().map(report_worker)
    loader = DataLoader2(pipe, reading_service=TorchDataLoaderReadingService(2, worker_init_fn=remember_worker))
    items = epochs(loader, 1)[0]
    assert [x for x, *_ in items] == list(range(6))
    assert all(init == ours == theirs == x % 2 for x, init, ours, theirs in items)


@PROCESS_TIMEOUT
def test_torch_service_under_spawn_with_lambdas():
    pipe = IterableWrapper(range(10)).sharding_filter().map(lambda x: x + 100)
    service = TorchDataLoaderReadingService(
        num_workers=2, multiprocessing_context="spawn", worker_init_fn=lambda worker_id: None
    )
    assert epochs(DataLoader2(pipe, reading_service=service), 1)[0] == [x + 100 for x in range(10)]


@PROCESS_TIMEOUT
def test_torch_service_lets_an_iterable_dataset_split_itself_by_torch_worker_info():
    loader = DataLoader2(SelfSharding(10), reading_service=TorchDataLoaderReadingService(num_workers=2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "has no sharding_filter" warning: torch's recipe applies here
        items = epochs(loader, 1)[0]
    assert items == list(range(10))


@PROCESS_TIMEOUT
def test_torch_service_runs_a_torch_graph_with_its_sharding_filter():
    def graph():
        return TorchIterableWrapper(range(30)).shuffle().sharding_filter().map(double)

    loader = DataLoader2(graph(), reading_service=TorchDataLoaderReadingService(num_workers=2))
    loader.seed(7)
    got = epochs(loader, 2)
    # one-to-one after the filter: torch's round robin is the single-process order
    assert got == read_epochs(from_torch(graph()), seed=7, num_workers=0)
    assert sorted(got[0]) == sorted(got[1]) == [double(i) for i in range(30)] and got[0] != got[1]


@PROCESS_TIMEOUT
def test_shutdown_stops_persistent_workers():
    pipe = IterableWrapper(range(10)).sharding_filter().map(with_pid)
    loader = DataLoader2(pipe, reading_service=TorchDataLoaderReadingService(2, persistent_workers=True))
    first, second = [list(loader) for _ in range(2)]
    pids = {pid for _, pid in first}
    assert len(pids) == 2 and os.getpid() not in pids
    assert {pid for _, pid in second} == pids  # the same workers served both epochs
    assert all(alive(pid) for pid in pids)
    loader.shutdown()
    assert not any(alive(pid) for pid in pids)


@PROCESS_TIMEOUT
@pytest.mark.parametrize("persistent", [False, True])
def test_shutdown_mid_epoch_leaves_no_worker(persistent):
    pipe = IterableWrapper(range(100)).sharding_filter().map(with_pid)
    loader = DataLoader2(pipe, reading_service=TorchDataLoaderReadingService(2, persistent_workers=persistent))
    iterator = iter(loader)
    pids = {next(iterator)[1] for _ in range(4)}
    assert len(pids) == 2
    loader.shutdown()
    assert not any(alive(pid) for pid in pids)


@PROCESS_TIMEOUT
def test_a_new_epoch_stops_the_workers_of_an_abandoned_one():
    pipe = IterableWrapper(range(100)).sharding_filter().map(with_pid)
    loader = DataLoader2(pipe, reading_service=TorchDataLoaderReadingService(2))
    iterator = iter(loader)
    old = {next(iterator)[1] for _ in range(4)}
    fresh = iter(loader)
    assert next(fresh)[0] == 0
    assert not any(alive(pid) for pid in old)
    loader.shutdown()


@PROCESS_TIMEOUT
def test_worker_errors_reach_the_main_process():
    pipe = IterableWrapper(range(10)).sharding_filter().map(fail_on_five)
    loader = DataLoader2(pipe, reading_service=TorchDataLoaderReadingService(2))
    with pytest.raises(ValueError, match="five is not welcome") as info:
        list(loader)
    assert "DataLoader worker process 1" in str(info.value)
    loader.shutdown()


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"num_workers": -1}, ValueError, "num_workers must be an int >= 0"),
        ({"num_workers": 1.5}, ValueError, "num_workers must be an int >= 0"),
        ({"timeout": -1}, ValueError, "timeout must be"),
        ({"num_workers": 2, "prefetch_factor": 0}, ValueError, "prefetch_factor must be an int >= 1"),
        ({"num_workers": 1, "multiprocessing_context": "teleport"}, ValueError, "must be one of"),
        ({"num_workers": 1, "multiprocessing_context": 3}, TypeError, "start method name"),
        ({"worker_init_fn": 3}, TypeError, "worker_init_fn must be callable"),
        ({"pin_memory": "yes"}, TypeError, "pin_memory must be a bool"),
    ],
)
def test_torch_service_checks_its_arguments(options, error, message):
    with pytest.raises(error, match=message):
        TorchDataLoaderReadingService(**options)


def test_torch_service_without_workers_drops_the_worker_options_as_the_reference():
    service = TorchDataLoaderReadingService(
        num_workers=0, prefetch_factor=2, persistent_workers=True, multiprocessing_context="spawn"
    )
    assert (service.prefetch_factor, service.persistent_workers, service.multiprocessing_context) == (None, False, None)
    loader = DataLoader2(conveyor_pipeline(10), reading_service=service)
    assert sorted(list(loader)) == sorted(list(DataLoader2(conveyor_pipeline(10))))
    loader.shutdown()


def test_torch_service_is_not_checkpointable_mid_epoch():
    pipe = conveyor_pipeline(10)
    loader = DataLoader2(pipe, reading_service=TorchDataLoaderReadingService())
    loader.seed(2)
    first = list(loader)
    between = json.loads(json.dumps(loader.state_dict()))  # between epochs: plain data, fine
    second = list(loader)
    iterator = iter(loader)
    next(iterator)
    mid = loader.state_dict()  # as torchdata: it saves, without a part for the service ...
    assert mid["in_progress"] and mid["reading_service"] is None and mid["pipeline"] is None
    loader.shutdown()
    refused = DataLoader2(pipe, reading_service=TorchDataLoaderReadingService())
    with pytest.raises(StateError, match="save between epochs"):  # ... but cannot say where torch stood
        refused.load_state_dict(mid)
    refused.shutdown()
    resumed = DataLoader2(pipe, reading_service=TorchDataLoaderReadingService())
    resumed.load_state_dict(between)
    assert epochs(resumed, 1)[0] == second != first


@PROCESS_TIMEOUT
def test_torch_service_keeps_non_replicable_ops_in_the_main_process():
    pipe = IterableWrapper(range(12)).sharding_filter().map(with_pid).pin_memory()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: pin_memory=True without an accelerator
        loader = DataLoader2(pipe, reading_service=TorchDataLoaderReadingService(2, pin_memory=True))
        items = epochs(loader, 1)[0]
    assert [x for x, _ in items] == list(range(12))
    assert os.getpid() not in {pid for _, pid in items}
    assert isinstance(loader.datapipe, PinMemory)


def test_the_service_is_copyable_before_initialize_only():
    service = TorchDataLoaderReadingService(num_workers=0)
    assert copy.deepcopy(service).num_workers == 0
    loader = DataLoader2(conveyor_pipeline(4), reading_service=service)
    list(loader)
    with pytest.raises(TypeError, match="cannot be copied"):
        copy.deepcopy(loader.reading_service)
    loader.shutdown()


def read_ranks_with_torch_service(rank: int, world: int, seed: int) -> list[list[int]]:
    """Run on each rank: Sequential(Distributed, TorchDataLoader(2 workers)), two epochs."""
    service = SequentialReadingService(DistributedReadingService(timeout=30), TorchDataLoaderReadingService(2))
    with DataLoader2(conveyor_pipeline(24), reading_service=service) as loader:
        loader.seed(seed)
        return [list(loader) for _ in range(2)]


def read_ranks_torch_graph(rank: int, world: int) -> list[int]:
    """Run on each rank: a torch graph's sharding_filter under Sequential(Distributed, MP(2))."""
    service = SequentialReadingService(DistributedReadingService(timeout=30), MultiProcessingReadingService(2))
    with DataLoader2(TorchIterableWrapper(range(24)).sharding_filter(), reading_service=service) as loader:
        return list(loader)


@pytest.mark.timeout(120)
def test_ranks_and_torch_workers_split_an_epoch_between_them():
    pytest.importorskip("torch.distributed")
    reference = DataLoader2(conveyor_pipeline(24))
    reference.seed(13)
    expected = epochs(reference, 2)
    ranks = succeeded(run_ranks(2, read_ranks_with_torch_service, 13))
    for epoch in range(2):
        # conveyor's nesting: rank r keeps positions i % 2 == r of the shared shuffle
        assert ranks[0][epoch] == expected[epoch][0::2]
        assert ranks[1][epoch] == expected[epoch][1::2]
    torch_ranks = succeeded(run_ranks(2, read_ranks_torch_graph))
    # torch's nesting inside a torch graph: worker i % 2 of rank (i // 2) % 2
    assert [sorted(items) for items in torch_ranks] == [
        [i for i in range(24) if (i // 2) % 2 == rank] for rank in range(2)
    ]


# --- pin_memory ----------------------------------------------------------------------------


def test_pin_memory_is_a_pass_through_without_cuda():
    assert not torch.cuda.is_available()  # this suite runs on CPU builds
    tensor = torch.arange(3)
    items = [tensor, {"a": tensor, "b": "text"}, ("x", 1), None]
    out = list(IterableWrapper(items, deepcopy=False).pin_memory())
    assert out[0] is tensor and out[1]["a"] is tensor and out[2:] == [("x", 1), None]
    pipe = IterableWrapper(range(3)).pin_memory(device="cuda")
    assert isinstance(pipe, PinMemory) and pipe.device == "cuda" and len(pipe) == 3
    assert (PinMemory.replicable, PinMemory.per_item, PinMemory.keeps_order) == (False, True, True)
    with pytest.raises(TypeError, match="device name"):
        IterableWrapper([1]).pin_memory(device=3)


def test_pin_memory_never_crashes_when_pinning_fails(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # CPU build: pinning itself fails
    items = [torch.ones(2), {"t": torch.zeros(1), "s": "text"}, "plain", 7]
    with pytest.warns(RuntimeWarning, match="cannot pin an item"):
        out = list(IterableWrapper(items, deepcopy=False).pin_memory())
    assert out[0] is items[0] and out[1] is items[1] and out[2:] == ["plain", 7]


@PROCESS_TIMEOUT
def test_pin_memory_stays_in_the_main_process_and_resumes():
    def build():
        return IterableWrapper(range(30)).shuffle().sharding_filter().map(double).pin_memory()

    graph, tail = split_replicable(build())
    assert [type(node) for node in tail] == [PinMemory]
    assert not any(isinstance(node, PinMemory) for node in list_dps(graph))
    expected = read_epochs(build(), seed=3, num_workers=0)
    loader = DataLoader2(build(), reading_service=MultiProcessingReadingService(num_workers=2))
    loader.seed(3)
    assert epochs(loader, 2) == expected
    assert isinstance(loader.datapipe, PinMemory)
    this_epoch, next_epoch = resume_after(build, 7, 3, 2, 2)
    assert (this_epoch, next_epoch) == (expected[0], expected[1])


# --- without torch ---------------------------------------------------------------------------


def test_the_core_package_imports_without_torch():
    script = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None  # makes `import torch` fail as if it were not installed
        import conveyor
        from conveyor import TorchDataLoaderReadingService
        from conveyor.pipes import IterableWrapper, from_torch
        assert list(IterableWrapper([1, 2]).pin_memory()) == [1, 2]
        assert list(conveyor.DataLoader2(IterableWrapper([3]))) == [3]
        try:
            TorchDataLoaderReadingService()
        except ImportError as err:
            print(type(err).__name__, err)
        try:
            from_torch(object())
        except TypeError as err:
            print("TypeError", err)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert "MissingDependencyError" in result.stdout
    assert "pip install 'conveyor[torch]'" in result.stdout
    assert "from_torch takes a torch.utils.data" in result.stdout
    assert issubclass(MissingDependencyError, ImportError)
