"""DataLoader2: lifecycle, seeds, epochs, pause/limit, shutdown, exact resume."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

import conveyor
from conveyor import (
    CheckpointableReadingServiceInterface,
    DataLoader2,
    InProcessReadingService,
    ReadingServiceInterface,
    SeedGenerator,
    Shuffle,
    WorkerInfo,
)
from conveyor.errors import GraphError, StateError
from conveyor.graph import apply_random_seed
from conveyor.pipes import IterableWrapper, SequenceWrapper


def shuffled(n=40, buffer=16):
    return IterableWrapper(range(n)).shuffle(buffer_size=buffer).sharding_filter().map(lambda x: x * 2)


def test_public_names_importable_from_the_package():
    for name in (
        "DataLoader2",
        "WorkerInfo",
        "InProcessReadingService",
        "ReadingServiceInterface",
        "CheckpointableReadingServiceInterface",
        "SeedGenerator",
        "get_worker_info",
    ):
        assert hasattr(conveyor, name)
    assert WorkerInfo(2, 1).worker_id == 1
    assert conveyor.get_worker_info() is None


def test_lambdas_work_in_process_and_loader_copies_the_graph():
    pipe = IterableWrapper(range(5)).map(lambda x: x + 1)
    loader = DataLoader2(pipe)
    assert list(loader) == [1, 2, 3, 4, 5]
    assert loader.datapipe is not pipe


def test_epochs_differ_and_same_seed_reproduces():
    a, b = DataLoader2(shuffled()), DataLoader2(shuffled())
    a.seed(11)
    b.seed(11)
    epochs_a = [list(a) for _ in range(3)]
    epochs_b = [list(b) for _ in range(3)]
    assert epochs_a == epochs_b
    assert epochs_a[0] != epochs_a[1] != epochs_a[2]
    assert all(sorted(e) == [2 * i for i in range(40)] for e in epochs_a)
    c = DataLoader2(shuffled())
    c.seed(12)
    assert list(c) != epochs_a[0]
    a.seed(11)  # seed() restarts the schedule
    assert list(a) == epochs_a[0]


def test_unseeded_loaders_draw_their_own_base_seed():
    assert list(DataLoader2(shuffled())) != list(DataLoader2(shuffled()))


def test_global_rngs_are_left_alone_in_process():
    random.seed(5)
    np.random.seed(5)
    expected = (random.random(), np.random.random())
    random.seed(5)
    np.random.seed(5)
    loader = DataLoader2(shuffled())
    loader.seed(1)
    list(loader)
    assert (random.random(), np.random.random()) == expected


def test_new_iter_invalidates_older_iterators():
    loader = DataLoader2(shuffled())
    first = iter(loader)
    next(first)
    second = iter(loader)
    with pytest.raises(RuntimeError, match="has been invalidated"):
        next(first)
    assert len(list(second)) == 40


def test_shutdown_is_idempotent_and_final():
    loader = DataLoader2(shuffled())
    iterator = iter(loader)
    next(iterator)
    loader.shutdown()
    loader.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        iter(loader)
    with pytest.raises(RuntimeError, match="has been invalidated"):
        next(iterator)


def test_context_manager_shuts_down():
    with DataLoader2(shuffled()) as loader:
        assert len(list(loader)) == 40
    with pytest.raises(RuntimeError):
        iter(loader)


def test_len_when_known():
    assert len(DataLoader2(IterableWrapper(range(10)).batch(3))) == 4
    with pytest.raises(TypeError, match="has no length"):
        len(DataLoader2(IterableWrapper(range(10)).filter(bool)))


def test_map_datapipe_is_read_in_index_order():
    assert list(DataLoader2(SequenceWrapper("abc").map(str.upper))) == ["A", "B", "C"]


def test_shuffle_adapter_turns_shuffles_off_and_on():
    off = DataLoader2(shuffled(), datapipe_adapter_fn=Shuffle(False))
    assert list(off) == [2 * i for i in range(40)]
    on = DataLoader2(shuffled().shuffle(), datapipe_adapter_fn=[Shuffle(False), Shuffle(True)])
    assert list(on) != [2 * i for i in range(40)]
    mapped = DataLoader2(SequenceWrapper(list(range(20))).shuffle(), datapipe_adapter_fn=Shuffle(False))
    assert list(mapped) == list(range(20))


def test_limit_pauses_and_resume_continues():
    loader = DataLoader2(IterableWrapper(range(10)))
    iterator = iter(loader)
    iterator.limit(3)
    assert list(iterator) == [0, 1, 2]
    assert next(iterator, "paused") == "paused" and iterator.paused
    iterator.resume()
    assert list(iterator) == [3, 4, 5], "the limit applies again after resume"
    iterator.resume()
    iterator.limit(None)
    assert list(iterator) == [6, 7, 8, 9]


def test_state_while_paused_resumes_after_the_pause():
    loader = DataLoader2(shuffled())
    loader.seed(3)
    reference = DataLoader2(shuffled())
    reference.seed(3)
    expected = list(reference)
    iterator = iter(loader).limit(7)
    head = list(iterator)
    state = loader.state_dict()
    resumed = DataLoader2(shuffled())
    resumed.load_state_dict(state)
    assert head + list(resumed) == expected


def test_graphs_with_shared_nodes_are_rejected():
    source = IterableWrapper(range(3))
    with pytest.raises(GraphError, match="feeds several pipes"):
        DataLoader2(source.map(str).zip(source.map(repr)))


class SpyService(CheckpointableReadingServiceInterface):
    """Records the lifecycle calls a loader makes."""

    calls: list[str]

    def __init__(self):
        self.calls = []
        self.inner = InProcessReadingService()

    def initialize(self, datapipe):
        self.calls.append("initialize")
        return self.inner.initialize(datapipe)

    def initialize_iteration(self, seed_generator, iter_reset_fn=None):
        assert isinstance(seed_generator, SeedGenerator)
        self.calls.append(f"initialize_iteration:{seed_generator.epoch}")
        return self.inner.initialize_iteration(seed_generator, iter_reset_fn)

    def finalize_iteration(self):
        self.calls.append("finalize_iteration")

    def finalize(self):
        self.calls.append("finalize")

    def checkpoint(self):
        self.calls.append("checkpoint")
        return self.inner.checkpoint()

    def restore(self, datapipe, state):
        self.calls.append("restore")
        return self.inner.restore(datapipe, state)


def test_lifecycle_order_matches_the_reference():
    loader = DataLoader2(IterableWrapper(range(3)), reading_service=SpyService())
    spy = loader.reading_service
    assert spy.calls == []
    list(loader)
    list(loader)
    loader.state_dict()  # between epochs: no checkpoint needed
    loader.shutdown()
    assert spy.calls == [
        "initialize",
        "initialize_iteration:0",
        "finalize_iteration",
        "initialize_iteration:1",
        "finalize_iteration",
        "finalize",
    ]


def test_shutdown_finalizes_a_service_that_never_ran():
    loader = DataLoader2(IterableWrapper(range(3)), reading_service=SpyService())
    loader.shutdown()
    loader.shutdown()
    assert loader.reading_service.calls == ["finalize"]


@pytest.mark.parametrize("reads", [None, 0, 2, 5])
def test_state_dict_after_shutdown_is_where_the_loader_stopped(reads):
    loader = DataLoader2(shuffled())
    loader.seed(4)
    if reads is not None:
        iterator = iter(loader)
        head = [next(iterator) for _ in range(reads)]
    expected = loader.state_dict()
    loader.shutdown()
    assert loader.state_dict() == expected
    fresh = DataLoader2(shuffled())
    fresh.load_state_dict(json.loads(json.dumps(loader.state_dict())))
    uninterrupted = DataLoader2(shuffled())
    uninterrupted.seed(4)
    assert (head if reads is not None else []) + list(fresh) == list(uninterrupted)


def test_restore_replaces_initialize_and_checkpoint_is_used_mid_epoch():
    loader = DataLoader2(IterableWrapper(range(5)), reading_service=SpyService())
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    assert "checkpoint" in loader.reading_service.calls
    fresh = DataLoader2(IterableWrapper(range(5)), reading_service=SpyService())
    fresh.load_state_dict(state)
    assert list(fresh) == [1, 2, 3, 4]
    assert fresh.reading_service.calls[:2] == ["restore", "initialize_iteration:0"]


def test_the_loader_works_on_a_copy_of_the_service():
    service = InProcessReadingService()
    loader = DataLoader2(IterableWrapper([1]), reading_service=service)
    assert loader.reading_service is not service
    list(loader)
    assert service._graph is None


class PlainService(ReadingServiceInterface):
    def initialize(self, datapipe):
        return datapipe


def test_a_service_that_is_not_checkpointable_has_no_part_in_the_state():
    loader = DataLoader2(IterableWrapper(range(3)), reading_service=PlainService())
    assert loader.state_dict()["in_progress"] is False
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()  # as torchdata: the loader's own state, the service's part None
    assert state["in_progress"] and state["reading_service"] is None and state["items"] == 1


def test_init_and_reset_hooks_of_the_in_process_service():
    seen = []

    def init_fn(datapipe, info):
        seen.append(("init", info))
        return datapipe

    def reset_fn(datapipe, info, seeds):
        seen.append(("reset", info, seeds.epoch))
        return datapipe

    loader = DataLoader2(
        IterableWrapper([1]), reading_service=InProcessReadingService(init_fn=init_fn, reset_fn=reset_fn)
    )
    list(loader)
    list(loader)
    assert seen == [("init", WorkerInfo(1, 0)), ("reset", WorkerInfo(1, 0), 0), ("reset", WorkerInfo(1, 0), 1)]


# --- state -----------------------------------------------------------------------------


def build_rich():
    return (
        IterableWrapper(range(30))
        .shuffle(buffer_size=7)
        .sharding_filter()
        .random_map(lambda x, rng: (x, int(rng.integers(1000))))
        .flatmap(lambda pair: [pair, pair[::-1]])
        .batch(4)
        .unbatch()
        .prefetch(3)
    )


@pytest.mark.parametrize("prefetch", [0, 3])
def test_resume_at_every_cut_is_exact_including_later_epochs(prefetch):
    def loader():
        return DataLoader2(build_rich(), reading_service=InProcessReadingService(prefetch_cnt=prefetch))

    reference = loader()
    reference.seed(9)
    epochs = [list(reference) for _ in range(3)]
    total = len(epochs[0])
    for cut in range(total + 1):
        first = loader()
        first.seed(9)
        iterator = iter(first)
        head = [next(iterator) for _ in range(cut)]
        state = json.loads(json.dumps(first.state_dict()))
        first.shutdown()
        second = loader()
        second.load_state_dict(state)
        if cut < total:
            assert head + list(second) == epochs[0], f"cut {cut}"
        # After the epoch's last item, the first iter() goes on into the next epoch.
        assert list(second) == epochs[1]
        assert list(second) == epochs[2]


def test_state_before_first_iter_and_between_epochs():
    reference = DataLoader2(build_rich())
    reference.seed(4)
    epochs = [list(reference) for _ in range(2)]
    fresh = DataLoader2(build_rich())
    fresh.seed(4)
    state = fresh.state_dict()
    assert state["in_progress"] is False and state["epoch"] == 0
    other = DataLoader2(build_rich())
    other.load_state_dict(json.loads(json.dumps(state)))
    assert list(other) == epochs[0]
    between = DataLoader2(build_rich())
    between.load_state_dict(other.state_dict())
    assert list(between) == epochs[1]


def test_state_after_the_last_item_resumes_into_the_next_epoch():
    """A state taken after an epoch's last item, before its StopIteration: the resumed
    loader's first iter() is the next epoch (a trainer calls iter() once per epoch)."""
    reference = DataLoader2(build_rich())
    reference.seed(2)
    epochs = [list(reference) for _ in range(2)]
    loader = DataLoader2(build_rich())
    loader.seed(2)
    iterator = iter(loader)
    for _ in range(len(epochs[0])):
        next(iterator)
    state = loader.state_dict()
    assert state["in_progress"] is True
    resumed = DataLoader2(build_rich())
    resumed.load_state_dict(state)
    assert list(resumed) == epochs[1]


def test_state_dict_round_trips_right_after_loading():
    loader = DataLoader2(build_rich())
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    other = DataLoader2(build_rich())
    other.load_state_dict(state)
    assert other.state_dict() == state


def test_load_state_into_a_used_loader_restarts_it_there():
    loader = DataLoader2(build_rich())
    loader.seed(1)
    iterator = iter(loader)
    head = [next(iterator) for _ in range(5)]
    state = loader.state_dict()
    rest = list(iterator)
    loader.load_state_dict(state)
    with pytest.raises(RuntimeError, match="has been invalidated"):
        next(iterator)
    assert list(loader) == rest
    assert head


def test_state_is_versioned_and_fingerprinted():
    loader = DataLoader2(build_rich())
    state = loader.state_dict()
    assert state["format"] == "conveyor.DataLoader2" and state["version"] == 5
    assert isinstance(state["fingerprint"], str) and len(state["fingerprint"]) >= 16
    other_graph = DataLoader2(IterableWrapper(range(30)).shuffle(buffer_size=8).sharding_filter())
    with pytest.raises(StateError, match="another pipeline"):
        other_graph.load_state_dict(state)
    with pytest.raises(StateError, match="version"):
        loader.load_state_dict({**state, "version": 99})
    for bad in (None, b"bytes", [], "text", 3):
        with pytest.raises(StateError):
            loader.load_state_dict(bad)
    with pytest.raises(ValueError, match="missing keys"):
        loader.load_state_dict({k: v for k, v in state.items() if k != "seed"})


def test_fingerprint_ignores_the_service_settings():
    a = DataLoader2(build_rich(), reading_service=InProcessReadingService(prefetch_cnt=2))
    b = DataLoader2(build_rich())
    assert a.state_dict()["fingerprint"] == b.state_dict()["fingerprint"]


def test_corrupt_node_state_is_rejected_at_once():
    loader = DataLoader2(build_rich())
    iterator = iter(loader)
    next(iterator)
    state = json.loads(json.dumps(loader.state_dict()))
    source = state["pipeline"]
    while "source" in source:  # the nested states lead down to the source's own
        source = source["source"]
    assert set(source) == {"index"}
    source["index"] = -3
    with pytest.raises(StateError, match="IterableWrapper"):
        DataLoader2(build_rich()).load_state_dict(state)
    source["index"] = 10**6
    with pytest.raises(StateError, match="past the end"):
        DataLoader2(build_rich()).load_state_dict(state)


def test_seed_after_loading_a_state_is_refused():
    loader = DataLoader2(build_rich())
    state = loader.state_dict()
    other = DataLoader2(build_rich())
    other.load_state_dict(state)
    with pytest.raises(RuntimeError, match="discard the restored position"):
        other.seed(1)


def test_map_datapipe_resume_is_o1_index():
    calls = []

    def record(x):
        calls.append(x)
        return x

    def build():
        return SequenceWrapper(list(range(100))).map(record).shuffle()

    loader = DataLoader2(build())
    loader.seed(5)
    iterator = iter(loader)
    head = [next(iterator) for _ in range(60)]
    state = loader.state_dict()
    calls.clear()
    resumed = DataLoader2(build())
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert sorted(head + rest) == list(range(100))
    assert len(calls) == 40, "resuming a random-access pipe must not replay earlier items"


def test_apply_random_seed_is_what_the_loader_uses():
    pipe = build_rich()
    loader = DataLoader2(build_rich())
    loader.seed(8)
    apply_random_seed(pipe, SeedGenerator(8, epoch=0))
    assert list(pipe) == list(loader)


FAIL_NEXT_EPOCH_START = []


class FlakyStart(InProcessReadingService):
    """Fails to start an epoch while FAIL_NEXT_EPOCH_START holds a token (one per failure)."""

    def initialize_iteration(self, seed_generator, iter_reset_fn=None):
        if FAIL_NEXT_EPOCH_START:
            FAIL_NEXT_EPOCH_START.pop()
            raise RuntimeError("the service could not start the epoch")
        return super().initialize_iteration(seed_generator, iter_reset_fn)


def test_a_resume_that_fails_to_start_is_kept_for_the_next_iter():
    def build():
        return IterableWrapper(range(20)).shuffle(buffer_size=5)

    loader = DataLoader2(build(), reading_service=FlakyStart())
    loader.seed(3)
    full = list(loader)
    loader.seed(3)
    iterator = iter(loader)
    head = [next(iterator) for _ in range(7)]
    state = loader.state_dict()
    resumed = DataLoader2(build(), reading_service=FlakyStart())
    resumed.load_state_dict(state)
    FAIL_NEXT_EPOCH_START.append("once")
    with pytest.raises(RuntimeError, match="could not start"):
        iter(resumed)
    assert resumed.state_dict() == state  # nothing lost, no epoch skipped
    assert head + list(resumed) == full
    resumed.shutdown()
    loader.shutdown()
