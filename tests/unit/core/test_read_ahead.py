"""Reading ahead only while it pays: the verdicts, and the hand-overs between the consumer
and a thread (no entry lost, duplicated or reordered; everything closed on every path)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conveyor.core.read_ahead import ReadAheadCosts, adaptive_read_ahead
from hypothesis_profiles import scaled

NAME = "test-read-ahead"


class ScriptedCosts(ReadAheadCosts):
    """A costs whose verdicts follow a script, one verdict per decision (then the last)."""

    def __init__(self, script: list[bool]):
        super().__init__()
        self.script = list(script)
        self.decisions = 0

    def _next(self) -> bool:
        verdict = self.script[min(self.decisions, len(self.script) - 1)] if self.script else False
        self.decisions += 1
        return verdict

    @property
    def thread_pays(self) -> bool:
        return self._next()

    @property
    def thread_costs(self) -> bool:
        return not self._next()


class Source:
    """Entries 0..n-1 that remember whether they were closed and in which threads they
    were produced."""

    def __init__(self, n: int, fail_at: int | None = None):
        self.n, self.fail_at = n, fail_at
        self.closed = False
        self.threads: list[str] = []

    def __iter__(self) -> Iterator[int]:
        try:
            for i in range(self.n):
                if i == self.fail_at:
                    raise KeyError(f"entry {i}")
                self.threads.append(threading.current_thread().name)
                yield i
        finally:
            self.closed = True


def _no_thread_left() -> bool:
    return not any(t.name == NAME for t in threading.enumerate())


def test_a_pace_keeps_the_consumer_reading_while_production_waits():
    costs = ReadAheadCosts()
    for _ in range(50):  # workers slower than the consumer: production mostly waits
        costs.produced(work_s=50e-6, wait_s=400e-6)
        costs.consumed(away_s=5e-3)
    assert not costs.thread_pays and costs.thread_costs


def test_a_pace_keeps_the_consumer_reading_while_it_is_not_away():
    costs = ReadAheadCosts()
    for _ in range(50):  # a loop that only reads: nothing to hide production behind
        costs.produced(work_s=50e-6, wait_s=0.0)
        costs.consumed(away_s=10e-6)
    assert not costs.thread_pays and costs.thread_costs


def test_a_pace_starts_a_thread_for_a_busy_consumer_and_has_a_band():
    costs = ReadAheadCosts()
    for _ in range(50):  # training: the consumer is away long, the workers are ahead
        costs.produced(work_s=50e-6, wait_s=1e-6)
        costs.consumed(away_s=20e-3)
    assert costs.thread_pays and not costs.thread_costs
    for _ in range(100):  # between the verdicts: neither starts nor stops
        costs.consumed(away_s=75e-6)
    assert not costs.thread_pays and not costs.thread_costs


class FakeClocks:
    """Stands in for ``time`` in the read-ahead module: producing an entry costs ``work_s``
    of CPU (and as much wall time), nothing else moves the clocks."""

    def __init__(self) -> None:
        self.cpu = self.wall = 0.0

    def thread_time(self) -> float:
        return self.cpu

    def perf_counter(self) -> float:
        return self.wall

    def entries(self, work_s: float) -> Iterator[int]:
        for i in range(10**6):
            self.cpu += work_s
            self.wall += work_s
            yield i


@pytest.mark.parametrize("away_over_work, pays", [(0.5, False), (1.5, False), (1.9, False), (2.2, True), (4.0, True)])
def test_sampled_production_times_give_the_verdicts_that_timing_every_entry_would(monkeypatch, away_over_work, pays):
    """Production is timed for one entry in a few, the consumer for every entry: from the
    first decision on, the two averages must be comparable (a thread starts only when the
    consumer is away more than twice as long as production works)."""
    import conveyor.core.read_ahead as read_ahead

    clocks = FakeClocks()
    monkeypatch.setattr(read_ahead, "time", clocks)
    work_s = 100e-6
    entries, costs = clocks.entries(work_s), ReadAheadCosts()
    for count in range(1, 161):
        read_ahead._timed_next(entries, costs)
        costs.consumed(away_over_work * work_s)
        if count == 16 or count == 160:  # the first decision, and a steady state
            assert costs.thread_pays is pays, (count, costs.away_s / costs.work_s)
    assert costs.work_s == pytest.approx(work_s, rel=0.01) and costs.wait_s == pytest.approx(0.0, abs=1e-12)


@pytest.mark.timing
def test_a_consumer_that_waits_on_its_upstream_reads_by_itself():
    readers: set[str] = set()

    def slow() -> Iterator[int]:
        for i in range(60):
            time.sleep(0.001)  # blocked on upstream, no work
            readers.add(threading.current_thread().name)
            yield i

    costs = ReadAheadCosts()
    assert list(adaptive_read_ahead(slow(), 4, NAME, costs=costs)) == list(range(60))
    assert costs.wait_s > costs.work_s
    assert readers == {threading.current_thread().name}


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "script", [[True], [True, False], [False, True, False, True, True, False], [True] * 3 + [False]]
)
def test_hand_overs_lose_nothing_and_keep_the_order(script):
    source = Source(200)
    costs = ScriptedCosts(script)
    assert list(adaptive_read_ahead(iter(source), 3, NAME, costs=costs)) == list(range(200))
    assert source.closed and _no_thread_left()
    consumer = threading.current_thread().name
    assert set(source.threads[:16]) == {consumer}  # the first decision comes after 16 entries
    assert (NAME in source.threads) == (True in script)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("script", [[False], [True], [True, False]])
@pytest.mark.parametrize("stop_after", [1, 2, 17, 40, 90])
def test_leaving_early_closes_the_source_and_ends_the_thread(script, stop_after):
    source = Source(100)
    entries = adaptive_read_ahead(iter(source), 3, NAME, costs=ScriptedCosts(script))
    taken = [entry for _, entry in zip(range(stop_after), entries, strict=False)]
    entries.close()
    assert taken == list(range(stop_after))
    assert source.closed and _no_thread_left()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("script", [[False], [True], [True, False]])
@pytest.mark.parametrize("fail_at", [0, 20, 50])
def test_a_failing_source_fails_the_consumer_whoever_reads_it(script, fail_at):
    source = Source(100, fail_at=fail_at)
    seen: list[int] = []
    with pytest.raises(KeyError, match=f"entry {fail_at}"):
        seen.extend(adaptive_read_ahead(iter(source), 3, NAME, costs=ScriptedCosts(script)))
    assert seen == list(range(fail_at))
    assert source.closed and _no_thread_left()


@pytest.mark.timeout(120)
@settings(max_examples=scaled(40), deadline=None)
@given(
    n=st.integers(0, 120),
    capacity=st.integers(1, 8),
    script=st.lists(st.booleans(), max_size=10),
    weights=st.booleans(),
)
def test_any_schedule_of_hand_overs_yields_the_source(n, capacity, script, weights):
    source = Source(n)
    weigh = (lambda entry: 1 + entry % 3) if weights else None
    out = list(adaptive_read_ahead(iter(source), capacity, NAME, weigh=weigh, costs=ScriptedCosts(script)))
    assert out == list(range(n))
    assert source.closed and _no_thread_left()
