"""A chunk's states travel pickled together and are unpickled in the main process only
when one is looked at (``conveyor.workers.transport.chunk_states``); a checkpoint still names the
state after exactly the last item handed out."""

from __future__ import annotations

from typing import Any

import pytest

from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.pipes import IterableWrapper
from conveyor.workers.transport.chunk_states import ChunkStates, StateRef, last_state, resolve

pytestmark = pytest.mark.timeout(120)


class CountedLoad:
    """A state value that counts how often it is unpickled."""

    loads = 0

    def __init__(self, name: str):
        self.name = name

    def __reduce__(self) -> tuple[Any, ...]:
        return _load_counted, (self.name,)


def _load_counted(name: str) -> str:
    CountedLoad.loads += 1
    return name


def test_states_are_unpickled_at_the_first_look_and_only_then():
    CountedLoad.loads = 0
    sent = ChunkStates.of((CountedLoad("after a"), CountedLoad("after b")))
    assert sent.last == 1
    states = sent.snapshot()  # as the main process receives them: pickled
    ref = StateRef(states, 0)
    assert CountedLoad.loads == 0
    assert resolve(ref) == "after a"
    assert CountedLoad.loads == 2  # the chunk's states are unpickled together, once
    assert states[1] == "after b" and resolve(StateRef(states, 1)) == "after b"
    assert CountedLoad.loads == 2
    assert resolve({"plain": 1}) == {"plain": 1}  # a state that never travelled is itself


def test_last_names_the_last_entry_with_a_state():
    """A skipped item's record has no state: ``last`` passes over it."""
    assert last_state(({"i": 1}, None, None)) == 0
    assert ChunkStates.of(({"i": 1}, None, None)).last == 0
    assert last_state((None,)) == -1
    assert last_state(()) == -1


@pytest.mark.parametrize("num_workers", [1, 2])
def test_a_checkpoint_after_any_item_resumes_at_the_next(num_workers: int) -> None:
    """Checkpoints taken after items spread over several chunks, and in the middle of
    one, resume exactly after their item."""
    n = 300

    def loader() -> DataLoader2:
        pipe = IterableWrapper(range(n)).sharding_filter().map(lambda i: i * 3)
        return DataLoader2(pipe, reading_service=MultiProcessingReadingService(num_workers=num_workers))

    expected = [i * 3 for i in range(n)]
    for stop in (1, 5, 64, 129, 200, n - 1):
        first = loader()
        try:
            it = iter(first)
            head = [next(it) for _ in range(stop)]
            state = first.state_dict()
        finally:
            first.shutdown()
        second = loader()
        try:
            second.load_state_dict(state)
            rest = list(second)
        finally:
            second.shutdown()
        assert head + rest == expected, stop
