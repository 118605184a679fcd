"""Autotuning: num_workers="auto" and the prefetch counts "auto", chosen from a probe of the
pipeline and revised between epochs from what the epochs measured."""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import pytest

from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.core.base import IterDataPipe
from conveyor.errors import StateError
from conveyor.pipes import IterableWrapper
from conveyor.reading_service.autotune import AutoTuner, Probe

pytestmark = pytest.mark.timeout(180)


def spin(x: int) -> int:
    """About 2 ms of CPU."""
    deadline = time.thread_time() + 0.002
    while time.thread_time() < deadline:
        pass
    return x


def small() -> IterDataPipe:
    return IterableWrapper(range(20_000)).shuffle().sharding_filter().map(abs)


def heavy() -> IterDataPipe:
    return IterableWrapper(range(400)).shuffle().sharding_filter().map(spin)


def tuner(cores: int = 2, memory: int = 16 << 30, **values: Any) -> AutoTuner:
    arguments = {"num_workers": "auto", "worker_prefetch_cnt": "auto", "main_prefetch_cnt": "auto", **values}
    return AutoTuner(**arguments, ring_bytes=64 << 20, cores=cores, memory=memory)  # type: ignore[arg-type]


# --- the model -------------------------------------------------------------------------------


def test_cheap_items_are_read_in_process() -> None:
    t = tuner()
    t.probe = Probe(item_s=0.5e-6, item_bytes=0, items=2000)
    assert t._decide().num_workers == 0


def test_expensive_items_get_a_worker_per_core() -> None:
    for cores in (2, 4, 8):
        t = tuner(cores=cores)
        t.probe = Probe(item_s=2e-3, item_bytes=0, items=20)
        choice = t._decide()
        assert choice.num_workers == cores
        assert f"{cores} usable cores" in choice.why


def test_memory_caps_the_workers() -> None:
    t = tuner(cores=8, memory=4 * (128 << 20) * 3)  # a quarter holds 3 workers (64 MiB + a 64 MiB ring each)
    t.probe = Probe(item_s=2e-3, item_bytes=0, items=20)
    assert t._decide().num_workers == 3


def test_the_fewest_workers_within_a_few_percent_win() -> None:
    t = tuner(cores=8)
    # Receiving caps the rate at 1 / 3 us: above a few workers, more add nothing.
    t.probe = Probe(item_s=10e-6, item_bytes=0, items=2000)
    choice = t._decide()
    assert 1 <= choice.num_workers < 8
    rates = {n: t.predict(n, t.probe) for n in range(9)}
    assert rates[choice.num_workers] >= 0.95 * max(rates.values())


def test_a_given_value_is_kept_and_the_others_tuned() -> None:
    t = tuner(num_workers=1)
    t.probe = Probe(item_s=2e-3, item_bytes=1 << 20, items=20)
    choice = t._decide()
    assert choice.num_workers == 1
    assert 10 <= choice.worker_prefetch_cnt <= 64 and choice.main_prefetch_cnt >= 10


def test_the_prefetch_counts_never_go_below_the_defaults_and_grow_for_fast_items() -> None:
    t = tuner()
    t.probe = Probe(item_s=40e-3, item_bytes=4 << 20, items=2)  # slow, large items
    slow = t._decide()
    assert (slow.worker_prefetch_cnt, slow.main_prefetch_cnt) == (10, 10)
    t.probe = Probe(item_s=0.3e-6, item_bytes=0, items=500)  # fast, small items
    fast = t._decide()
    assert fast.main_prefetch_cnt > 10 and 10 <= fast.worker_prefetch_cnt <= 64


def test_without_a_probe_every_core_gets_a_worker() -> None:
    t = tuner(cores=4)
    t.probe = Probe(why_not="a dispatched source is read once")
    choice = t._decide()
    assert choice.num_workers == 4 and "dispatched" in choice.why


def test_an_epoch_far_below_the_model_tries_the_next_count_then_keeps_the_best() -> None:
    t = tuner(cores=2)
    t.probe = Probe(item_s=2e-3, item_bytes=0, items=20)
    first = t._decide()
    assert first.num_workers == 2
    t.measured[2] = first.predicted_items_s / 3  # the epoch ran far slower than predicted
    second = t.next_choice()
    assert second is not None and second.num_workers != 2
    t.measured[second.num_workers] = first.predicted_items_s / 4  # worse still
    third = t.next_choice()
    assert third is not None and third.num_workers == 2
    t.measured[2] = first.predicted_items_s / 3
    assert t.next_choice() is None  # settled on the best measured


def test_the_report_is_plain_data() -> None:
    t = tuner()
    t.probe = Probe(item_s=1e-3, item_bytes=0, items=50)
    t._decide()
    report = t.report()
    assert json.loads(json.dumps(report)) == report
    assert report["num_workers"] == 2 and report["probe"]["items"] == 50


# --- through the loader ----------------------------------------------------------------------


def read(pipe: IterDataPipe, epochs: int = 1, **service: Any) -> tuple[list[list[Any]], dict[str, Any]]:
    dl = DataLoader2(pipe, reading_service=MultiProcessingReadingService(**service))
    dl.seed(2)
    try:
        out = [list(dl) for _ in range(epochs)]
        return out, dict(dl.stats().tuning or {})
    finally:
        dl.shutdown()


def test_arguments_are_checked() -> None:
    for name in ("num_workers", "worker_prefetch_cnt", "main_prefetch_cnt"):
        with pytest.raises(ValueError, match=name):
            MultiProcessingReadingService(**{name: "fast"})
    service = MultiProcessingReadingService(num_workers="auto")
    assert service.num_workers == "auto"


def test_cheap_items_auto_reads_in_process_with_the_same_items() -> None:
    expected, _ = read(small(), num_workers=0)
    items, tuning = read(small(), num_workers="auto")
    assert items == expected
    assert tuning["num_workers"] == 0 and tuning["probe"]["items"] > 0
    assert "predicted items/s" in tuning["why"]


def test_expensive_items_auto_uses_the_cores_with_the_same_items() -> None:
    expected, _ = read(heavy(), num_workers=0)
    items, tuning = read(heavy(), num_workers="auto")
    assert items == expected
    assert tuning["num_workers"] >= 1


def test_a_state_saved_under_auto_resumes_exactly() -> None:
    (expected,), _ = read(heavy(), num_workers="auto")
    dl = DataLoader2(heavy(), reading_service=MultiProcessingReadingService(num_workers="auto"))
    dl.seed(2)
    it = iter(dl)
    head = [next(it) for _ in range(150)]
    state = json.loads(json.dumps(dl.state_dict()))
    dl.shutdown()
    for service in (MultiProcessingReadingService(num_workers="auto"), MultiProcessingReadingService(num_workers=1)):
        resumed = DataLoader2(heavy(), reading_service=service)
        resumed.load_state_dict(state)
        try:
            assert head + list(resumed) == expected
        finally:
            resumed.shutdown()


def test_a_grouping_pipeline_resumes_with_the_worker_count_it_was_saved_with() -> None:
    def grouped() -> IterDataPipe:
        return IterableWrapper(range(400)).sharding_filter().map(spin).batch(4)

    dl = DataLoader2(grouped(), reading_service=MultiProcessingReadingService(num_workers="auto"))
    dl.seed(1)
    it = iter(dl)
    head = [next(it) for _ in range(20)]
    state = dl.state_dict()
    chosen = dl.stats().tuning["num_workers"]
    dl.shutdown()
    expected, _ = read(grouped(), num_workers=chosen)
    resumed = DataLoader2(grouped(), reading_service=MultiProcessingReadingService(num_workers="auto"))
    resumed.load_state_dict(state)
    try:
        assert sorted(map(tuple, head + list(resumed))) == sorted(map(tuple, expected[0]))
        assert resumed.stats().tuning["num_workers"] == chosen
    finally:
        resumed.shutdown()
    with pytest.raises(StateError, match="num_workers"):
        other = DataLoader2(grouped(), reading_service=MultiProcessingReadingService(num_workers=chosen % 2 + 1))
        try:
            other.load_state_dict(state)
            next(iter(other))
        finally:
            other.shutdown()


def test_epochs_are_measured_and_the_output_never_depends_on_the_choice() -> None:
    items, tuning = read(heavy(), epochs=3, num_workers="auto")
    reference, _ = read(heavy(), epochs=3, num_workers=0)
    assert items == reference
    assert tuning["measured_items_s"], "whole epochs are measured"


def test_arrays_auto_with_the_same_items() -> None:
    def arrays() -> IterDataPipe:
        return IterableWrapper(range(64)).sharding_filter().map(lambda i: np.full(1 << 20, i % 251, np.uint8))

    expected, _ = read(arrays(), num_workers=0)
    items, tuning = read(arrays(), num_workers="auto", multiprocessing_context="fork")
    assert [int(a[0]) for a in items[0]] == [int(a[0]) for a in expected[0]]
    assert tuning["probe"]["item_bytes"] == 1 << 20


def test_an_epoch_short_of_the_model_rebuilds_the_workers_for_the_next_and_changes_no_item() -> None:
    reference, _ = read(heavy(), epochs=3, num_workers=0)
    dl = DataLoader2(heavy(), reading_service=MultiProcessingReadingService(num_workers="auto"))
    dl.seed(2)
    try:
        epochs = [list(dl)]
        tuner_ = dl.reading_service._tuner  # type: ignore[attr-defined]
        first = tuner_.choice.num_workers
        tuner_.choice.predicted_items_s = 1e12  # the epoch just read fell far short of it ...
        tuner_.probe = Probe(item_s=1e-7, item_bytes=0, items=100)  # ... and another count promises more
        epochs += [list(dl), list(dl)]
        tuning = dl.stats().tuning
    finally:
        dl.shutdown()
    assert epochs == reference
    measured = tuning["measured_items_s"]
    assert len(measured) == 2 and str(first) in measured  # the first choice and one other were tried
    assert str(tuning["num_workers"]) in measured  # the third epoch ran one of the measured counts
