"""Property tests of thread workers on random pipelines (small sizes): the same items as
worker processes (and, for per-item pipelines, as one process), and exact resume at any
cut, from a state saved by either kind of worker into either kind."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conveyor import DataLoader2, MultiProcessingReadingService
from hypothesis_profiles import scaled
from pipeline_specs import GROUPING, PER_ITEM, build, sharded_specs

pytestmark = pytest.mark.timeout(300)

SETTINGS = settings(max_examples=scaled(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
KINDS = st.sampled_from(["thread", "process"])


def service(kind: str, workers: int) -> MultiProcessingReadingService:
    context = "fork" if kind == "process" and workers else None
    return MultiProcessingReadingService(workers, worker_type=kind, multiprocessing_context=context)


def read(spec: Any, seed: int, kind: str | None, workers: int, count: int = 2) -> list[list[Any]]:
    """``count`` seeded epochs; ``kind`` None: in the calling process, without a service."""
    loader = DataLoader2(build(spec), reading_service=service(kind, workers) if kind else None)
    loader.seed(seed)
    try:
        return [list(loader) for _ in range(count)]
    finally:
        loader.shutdown()


def resume_at(
    spec: Any, seed: int, cut: int, saved: tuple[str, int], resumed: tuple[str, int], whole: int
) -> list[list[Any]]:
    """``cut`` items read, the state saved (through JSON), a new loader resumed from it:
    ``[head + rest of the epoch, the next epoch]``. After the epoch's last item (``cut ==
    whole``) the resumed loader's first ``iter()`` is already the next epoch."""
    loader = DataLoader2(build(spec), reading_service=service(*saved))
    loader.seed(seed)
    try:
        iterator = iter(loader)
        head = [next(iterator) for _ in range(cut)]
        state = json.loads(json.dumps(loader.state_dict()))
    finally:
        loader.shutdown()
    again = DataLoader2(build(spec), reading_service=service(*resumed))
    again.load_state_dict(state)
    try:
        return [head if cut == whole else head + list(again), list(again)]
    finally:
        again.shutdown()


@SETTINGS
@given(spec=sharded_specs(PER_ITEM), seed=st.integers(0, 1 << 32), workers=st.integers(1, 3))
def test_per_item_pipelines_in_threads_match_one_process(spec: Any, seed: int, workers: int) -> None:
    assert read(spec, seed, "thread", workers) == read(spec, seed, None, 0)


@SETTINGS
@given(spec=sharded_specs(GROUPING), seed=st.integers(0, 1 << 32), workers=st.integers(1, 3))
def test_any_pipeline_in_threads_matches_worker_processes(spec: Any, seed: int, workers: int) -> None:
    assert read(spec, seed, "thread", workers) == read(spec, seed, "process", workers)


@SETTINGS
@given(
    spec=sharded_specs(PER_ITEM),
    seed=st.integers(0, 1 << 32),
    saved=st.tuples(KINDS, st.integers(0, 3)),
    resumed=st.tuples(KINDS, st.integers(0, 3)),
    data=st.data(),
)
def test_per_item_pipelines_resume_across_worker_types_and_counts(
    spec: Any, seed: int, saved: tuple[str, int], resumed: tuple[str, int], data: st.DataObject
) -> None:
    expected = read(spec, seed, None, 0)
    cut = data.draw(st.integers(0, len(expected[0])), label="cut")
    assert resume_at(spec, seed, cut, saved, resumed, len(expected[0])) == expected


@SETTINGS
@given(
    spec=sharded_specs(GROUPING),
    seed=st.integers(0, 1 << 32),
    workers=st.integers(1, 3),
    kinds=st.tuples(KINDS, KINDS),
    data=st.data(),
)
def test_any_pipeline_resumes_with_the_same_workers_of_either_type(
    spec: Any, seed: int, workers: int, kinds: tuple[str, str], data: st.DataObject
) -> None:
    expected = read(spec, seed, "thread", workers)
    cut = data.draw(st.integers(0, len(expected[0])), label="cut")
    assert resume_at(spec, seed, cut, (kinds[0], workers), (kinds[1], workers), len(expected[0])) == expected
