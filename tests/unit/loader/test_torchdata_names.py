"""Call shapes torchdata's and torch's code use on conveyor's objects, by name."""

from __future__ import annotations

import os

import pytest
import torch
from torch.utils.data.datapipes.iter.sharding import SHARDING_PRIORITIES as TORCH_PRIORITIES

from conveyor import (
    READING_SERVICE_STATE_KEY_NAME,
    SERIALIZED_DATAPIPE_KEY_NAME,
    DataLoader2,
    InProcessReadingService,
    MultiProcessingReadingService,
    ReadingServiceInterface,
    SeedGenerator,
)
from conveyor.graph import SHARDING_PRIORITIES
from conveyor.pipes import DataPipe, IterableWrapper, IterDataPipe


def test_apply_sharding_takes_torchs_argument_names_and_either_enum() -> None:
    pipe = IterableWrapper(range(12)).sharding_filter()
    pipe.apply_sharding(num_of_instances=2, instance_id=1)  # the DEFAULT group
    assert list(pipe) == [1, 3, 5, 7, 9, 11]
    pipe.apply_sharding(2, 0, sharding_group=TORCH_PRIORITIES.MULTIPROCESSING)  # torch's values differ
    other = IterableWrapper(range(12)).sharding_filter()
    other.apply_sharding(2, 1, SHARDING_PRIORITIES.DEFAULT)
    other.apply_sharding(2, 0, SHARDING_PRIORITIES.MULTIPROCESSING)
    assert list(pipe) == list(other) == [1, 5, 9]
    with pytest.raises(ValueError, match="instance_id"):
        pipe.apply_sharding(2, 2)
    with pytest.raises(ValueError, match="num_of_instances"):
        pipe.apply_sharding(0, 0)
    with pytest.raises(ValueError, match="sharding_group"):
        pipe.apply_sharding(2, 0, sharding_group="workers")


def test_initialize_iteration_takes_one_argument() -> None:
    service = InProcessReadingService()
    graph = service.initialize(IterableWrapper(range(3)).shuffle())
    assert service.initialize_iteration(SeedGenerator(1)) is None
    assert sorted(graph) == [0, 1, 2]
    service.finalize()


def test_pipe_classes_take_a_type_parameter_in_annotations_and_bases() -> None:
    from conveyor.pipes import IterDataPipe, MapDataPipe

    class Numbers(IterDataPipe[int]):
        def __iter__(self):  # type: ignore[no-untyped-def]
            yield from (1, 2)

    assert list(Numbers().map(str)) == ["1", "2"]
    assert IterDataPipe[int].__origin__ is IterDataPipe and MapDataPipe[str].__args__ == (str,)


class NonReplicable(IterDataPipe):
    """torchdata's protocol: a method that says the op must not be replicated."""

    def __init__(self, datapipe: IterDataPipe) -> None:
        self.datapipe = datapipe

    def __iter__(self):  # type: ignore[no-untyped-def]
        yield from self.datapipe

    def is_replicable(self) -> bool:
        return False


def with_pid(item: object) -> tuple[object, int]:
    return item, os.getpid()


@pytest.mark.timeout(60)
def test_is_replicable_false_keeps_the_op_in_the_main_process() -> None:
    pipe = IterableWrapper(range(20)).shuffle().sharding_filter().map(with_pid).batch(2)
    after = NonReplicable(pipe).map(with_pid)  # runs where the non-replicable op runs
    loader = DataLoader2(after, reading_service=MultiProcessingReadingService(num_workers=2))
    try:
        torch.manual_seed(5)
        first = list(loader)
        torch.manual_seed(5)
        assert list(loader) == first
    finally:
        loader.shutdown()
    assert {main_pid for _, main_pid in first} == {os.getpid()}
    items = [item for batch, _ in first for item, _ in batch]
    worker_pids = {pid for batch, _ in first for _, pid in batch}
    assert sorted(items) == list(range(20)) and os.getpid() not in worker_pids and len(worker_pids) == 2
    assert IterableWrapper([1]).is_replicable() and not IterableWrapper([1]).pin_memory().is_replicable()


class Unsaved(ReadingServiceInterface):
    """A reading service of torchdata's plain interface: not checkpointable."""

    def initialize(self, datapipe: DataPipe) -> DataPipe:
        return datapipe


@pytest.mark.timeout(60)
def test_torchdatas_state_key_names_find_the_services_and_the_pipelines_parts() -> None:
    service = InProcessReadingService(prefetch_cnt=2)
    loader = DataLoader2(IterableWrapper(range(12)).shuffle(), reading_service=service)
    loader.seed(3)
    fresh = loader.state_dict()
    assert fresh[READING_SERVICE_STATE_KEY_NAME] is None and fresh[SERIALIZED_DATAPIPE_KEY_NAME] is None
    items = iter(loader)
    head = [next(items) for _ in range(5)]
    state = loader.state_dict()
    assert state[READING_SERVICE_STATE_KEY_NAME] == loader.reading_service.checkpoint() == {"prefetch_cnt": 2}
    assert state[SERIALIZED_DATAPIPE_KEY_NAME] is not None
    rest = list(items)
    loader.shutdown()
    resumed = DataLoader2(IterableWrapper(range(12)).shuffle(), reading_service=InProcessReadingService(prefetch_cnt=2))
    resumed.load_state_dict(state)
    assert list(resumed) == rest and sorted(head + rest) == list(range(12))
    resumed.shutdown()

    plain = DataLoader2(IterableWrapper(range(3)), reading_service=Unsaved())
    assert next(iter(plain)) == 0
    assert plain.state_dict()[READING_SERVICE_STATE_KEY_NAME] is None  # no part, as in torchdata
    plain.shutdown()
