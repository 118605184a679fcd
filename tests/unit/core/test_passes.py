"""Passes are objects: two passes over one graph share nothing, an abandoned pass harms
nothing, and states are found by following the graph, never by class names."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conveyor import DataLoader2, MultiProcessingReadingService, SeedGenerator
from conveyor.core.passes import PassContext, ThroughPass
from conveyor.graph import apply_random_seed
from conveyor.pipes import IterableWrapper, IterDataPipe
from hypothesis_profiles import scaled
from pipeline_helpers import finish_epoch
from pipeline_specs import SEEDS, build, epochs, make_loader, specs
from resume_checks import json_state

pytestmark = pytest.mark.timeout(120)


class Gate:
    """Holds epoch 0's item 1 until epoch 1 has begun, then lets it finish while epoch 1
    runs (module-level: the loader copies its graph, and events do not copy)."""

    first_epoch = True
    entered = threading.Event()  # epoch 0's thread is inside item 1
    release = threading.Event()  # epoch 1 started: item 1 of epoch 0 may finish
    finished = threading.Event()  # epoch 0's thread went on past item 1


def gated(x: int) -> int:
    if Gate.first_epoch and x == 1:
        Gate.entered.set()
        Gate.release.wait(60)
    elif not Gate.first_epoch and x == 0:
        Gate.release.set()
        Gate.finished.wait(30)  # the old thread runs its stages now, beside this epoch
    return x


def after(pair: tuple[int, int]) -> tuple[int, int]:
    if pair[1] == 1:  # first reached by epoch 0's thread: epoch 1's waits in its item 0
        Gate.finished.set()
    return pair


def test_an_abandoned_pass_does_not_hold_back_or_corrupt_the_next_epoch() -> None:
    """The prefetch thread of epoch 0 is stuck in item 1 when epoch 1 starts; it finishes
    that item while epoch 1 runs. Epoch 1 does not wait for it (it is released only from
    inside epoch 1: waiting would hang) and shares nothing with it (its indices start at
    0 and miss none)."""
    pipe = IterableWrapper(range(6)).map(gated).enumerate().map(after).prefetch(1)
    try:
        with DataLoader2(pipe) as loader:
            first = iter(loader)
            assert next(first) == (0, 0)
            assert Gate.entered.wait(30)  # the old thread is inside item 1 now
            second = iter(loader)
            Gate.first_epoch = False
            items = list(second)
    finally:
        Gate.release.set()
    assert items == [(i, i) for i in range(6)]


class MainProcessGate(IterDataPipe):
    """``gated`` over its input, in the main process (not replicable into workers)."""

    replicable = False

    def __init__(self, source: IterDataPipe) -> None:
        self.source = source

    def __iter__(self):
        for x in self.source:
            yield gated(x)


@pytest.mark.parametrize("num_workers", [1, 2, 3])
def test_an_abandoned_pass_over_workers_does_not_corrupt_the_next_epoch(num_workers: int) -> None:
    """The same with worker processes: epoch 0's main-process prefetch thread is stuck in
    item 1 while epoch 1 takes the workers over; epoch 1 is whole and in order, whatever
    the number of workers."""
    Gate.first_epoch = True
    for event in (Gate.entered, Gate.release, Gate.finished):
        event.clear()
    graph = MainProcessGate(IterableWrapper(range(12)).sharding_filter()).enumerate().map(after).prefetch(1)
    try:
        with DataLoader2(graph, reading_service=MultiProcessingReadingService(num_workers)) as loader:
            first = iter(loader)
            assert next(first) == (0, 0)
            assert Gate.entered.wait(30)
            second = iter(loader)
            Gate.first_epoch = False
            items = list(second)
    finally:
        Gate.release.set()
    assert items == [(i, i) for i in range(12)]


def test_two_passes_over_one_pipe_are_independent() -> None:
    pipe = IterableWrapper(range(10)).shuffle(buffer_size=4).enumerate().batch(3)
    apply_random_seed(pipe, SeedGenerator(3))  # passes opened after this draw alike
    a, b = pipe.open(), pipe.open()
    head_a = [next(a) for _ in range(2)]
    head_b = next(b)
    state_a = a.state()
    rest_a = list(a)
    assert [i for batch in head_a + rest_a for i, _ in batch] == list(range(10))
    assert [i for i, _ in head_b] == [0, 1, 2]
    resumed = pipe.open(json.loads(json.dumps(state_a)))
    assert list(resumed) == rest_a


@settings(max_examples=scaled(60), deadline=None)
@given(spec=specs(), seed=SEEDS, data=st.data())
def test_a_second_pass_running_alongside_changes_nothing(spec: Any, seed: int, data: st.DataObject) -> None:
    """While a loader reads an epoch, another pass over the same graph runs to its end in a
    thread; the epoch, a state saved in it and its resume are what they are alone."""
    full = epochs(spec, seed)
    cut = data.draw(st.integers(0, len(full[0])), label="cut")
    loader = make_loader(spec)
    try:
        loader.seed(seed)
        it = iter(loader)
        head = [next(it) for _ in range(cut)]
        other = loader.datapipe.open()  # type: ignore[union-attr]
        runner = threading.Thread(target=lambda: sum(1 for _ in other), daemon=True)
        runner.start()
        state = json_state(loader)
        rest = list(it)
        runner.join(60)
        assert not runner.is_alive()
        assert head + rest == full[0]
    finally:
        loader.shutdown()
    resumed = make_loader(spec)
    try:
        resumed.load_state_dict(state)
        assert finish_epoch(resumed, head, full[0]) == full[0]
        assert list(resumed) == full[1]
    finally:
        resumed.shutdown()


class ShardingFilter(IterDataPipe):
    """A user's op that happens to bear the name of conveyor's sharding point."""

    per_item = True
    keeps_order = True

    def __init__(self, source: IterDataPipe) -> None:
        self.source = source

    def __iter__(self):
        for item in self.source:
            yield item + 1000


def named_like_ours() -> Any:
    return ShardingFilter(IterableWrapper(range(30)).sharding_filter().map(lambda x: x * 2))


@pytest.mark.parametrize("resume_workers", [0, 3])
def test_a_user_class_named_like_a_conveyor_op_changes_nothing(resume_workers: int) -> None:
    """States are walked by following the graph: a user's op named ``ShardingFilter`` is
    not taken for the sharding point when a state is re-split for another worker count."""
    expected = [x * 2 + 1000 for x in range(30)]
    with DataLoader2(named_like_ours(), reading_service=MultiProcessingReadingService(2)) as loader:
        it = iter(loader)
        head = [next(it) for _ in range(11)]
        state = json_state(loader)
    with DataLoader2(named_like_ours(), reading_service=MultiProcessingReadingService(resume_workers)) as resumed:
        resumed.load_state_dict(state)
        assert head + list(resumed) == expected


def test_a_state_key_named_nodes_is_just_a_key() -> None:
    """A user op's input state is nested under its own keys, whatever they hold."""

    class Nodes(IterDataPipe):
        def __init__(self, source: IterDataPipe) -> None:
            self.source = source

        def __iter__(self):
            for item in self.source:
                yield {"nodes": [item]}

    pipe = Nodes(IterableWrapper(range(5)))
    with DataLoader2(pipe) as loader:
        it = iter(loader)
        head = [next(it) for _ in range(2)]
        state = json_state(loader)
    with DataLoader2(Nodes(IterableWrapper(range(5)))) as resumed:
        resumed.load_state_dict(state)
        assert head + list(resumed) == [{"nodes": [i]} for i in range(5)]


def test_build_is_importable() -> None:
    assert list(build((3, ()))) == [0, 1, 2]


class _Through(IterDataPipe):
    def __init__(self, source: IterDataPipe):
        self.source = source


def _state_after_two(pass_type: Any) -> Any:
    opened = pass_type(_Through(IterableWrapper(range(5))), None, PassContext())
    next(opened.items)
    next(opened.items)
    return opened.state()


def test_a_through_pass_reports_its_own_state_however_it_defines_it() -> None:
    """A through pass with no state of its own reports its input's alone, without a
    call to own_state() per item; one that adds own_state(), at any depth of
    subclassing, or defines state() itself, keeps what it defines."""

    class NoOwn(ThroughPass):
        def __init__(self, pipe: Any, state: Any, context: PassContext):
            super().__init__(pipe, state, context)
            self.items = iter(self.source)

    class WithOwn(NoOwn):
        def own_state(self) -> dict[str, Any]:
            return {"mine": 1}

    class BelowWithOwn(WithOwn):
        pass

    class Custom(NoOwn):
        def state(self) -> dict[str, Any]:
            return {"custom": True}

    class BelowCustom(Custom):
        pass

    class OwnAgain(Custom):  # own_state under a custom state(): the custom one still rules
        def own_state(self) -> dict[str, Any]:
            return {"mine": 2}

    source = {"index": 2}
    assert _state_after_two(NoOwn) == {"source": source}
    assert NoOwn.state is not ThroughPass.state  # the shortcut, not the merge
    assert _state_after_two(WithOwn) == {"mine": 1, "source": source}
    assert _state_after_two(BelowWithOwn) == {"mine": 1, "source": source}
    assert _state_after_two(Custom) == {"custom": True}
    assert _state_after_two(BelowCustom) == {"custom": True}
    assert _state_after_two(OwnAgain) == {"custom": True}
