"""Property tests of the multiprocessing service on random pipelines (fork, small sizes).

Per-item pipelines after the sharding point: the same items as one process for every
worker count, and exact resume across worker counts. Any pipeline: the same items on
every run, and exact resume with the same worker count.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conveyor import DataLoader2, MultiProcessingReadingService
from hypothesis_profiles import scaled
from pipeline_helpers import resume_after
from pipeline_specs import GROUPING, PER_ITEM, build, sharded_specs

pytestmark = pytest.mark.timeout(300)

SETTINGS = settings(max_examples=scaled(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def read(spec: Any, seed: int, workers: int | None, count: int = 2) -> list[list[Any]]:
    service = MultiProcessingReadingService(workers, multiprocessing_context="fork") if workers is not None else None
    loader = DataLoader2(build(spec), reading_service=service)
    loader.seed(seed)
    try:
        return [list(loader) for _ in range(count)]
    finally:
        loader.shutdown()


def resumed(spec: Any, seed: int, cut: int, saved_with: int, resumed_with: int) -> tuple[list[Any], list[Any]]:
    return resume_after(lambda: build(spec), cut, seed, saved_with, resumed_with)


@SETTINGS
@given(spec=sharded_specs(PER_ITEM), seed=st.integers(0, 1 << 32), workers=st.integers(1, 3))
def test_per_item_pipelines_match_one_process(spec: Any, seed: int, workers: int) -> None:
    assert read(spec, seed, workers) == read(spec, seed, None)


@SETTINGS
@given(
    spec=sharded_specs(PER_ITEM),
    seed=st.integers(0, 1 << 32),
    saved_with=st.integers(0, 3),
    resumed_with=st.integers(0, 3),
    data=st.data(),
)
def test_per_item_pipelines_resume_across_worker_counts(
    spec: Any, seed: int, saved_with: int, resumed_with: int, data: st.DataObject
) -> None:
    expected = read(spec, seed, None)
    cut = data.draw(st.integers(0, len(expected[0])), label="cut")
    epoch, following = resumed(spec, seed, cut, saved_with, resumed_with)
    assert epoch == expected[0]
    assert following == expected[1]


@SETTINGS
@given(spec=sharded_specs(GROUPING), seed=st.integers(0, 1 << 32), workers=st.integers(1, 3), data=st.data())
def test_any_pipeline_is_reproducible_and_resumes_with_the_same_workers(
    spec: Any, seed: int, workers: int, data: st.DataObject
) -> None:
    expected = read(spec, seed, workers)
    assert read(spec, seed, workers) == expected
    cut = data.draw(st.integers(0, len(expected[0])), label="cut")
    epoch, following = resumed(spec, seed, cut, workers, workers)
    assert epoch == expected[0]
    assert following == expected[1]
