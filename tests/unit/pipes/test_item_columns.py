"""``drop``, ``slice``, ``flatten``: torchdata's column ops on tuple, list and dict items."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.pipes import Dropper, Flattener, IterableWrapper, Slicer
from resume_checks import check_resume_at_every_cut

pytestmark = pytest.mark.timeout(120)

ROWS = [(i, 10 + i, 100 + i) for i in range(5)]


def test_drop_removes_positions_and_keys() -> None:
    assert list(IterableWrapper(ROWS[:2]).drop(1)) == [(0, 100), (1, 101)]
    assert list(IterableWrapper([list(r) for r in ROWS[:2]]).drop([0, 2])) == [[10], [11]]
    assert list(IterableWrapper([{"a": 1, "b": 2, "c": 3}]).drop(["a", "c"])) == [{"b": 2}]
    assert isinstance(IterableWrapper(ROWS).drop(0), Dropper)


def test_slice_takes_a_range_or_listed_columns() -> None:
    assert list(IterableWrapper(ROWS[:2]).slice(0, 2)) == [(0, 10), (1, 11)]
    assert list(IterableWrapper(ROWS[:1]).slice(0, None, 2)) == [(0, 100)]
    assert list(IterableWrapper(ROWS[:1]).slice(1)) == [(10, 100)]
    assert list(IterableWrapper([list(ROWS[0])]).slice([0, 2])) == [[0, 100]]
    assert list(IterableWrapper([{"a": 1, "b": 2, "c": 3}]).slice(["a", "c"])) == [{"a": 1, "c": 3}]
    assert list(IterableWrapper([{"a": 1, "b": 2}]).slice("b")) == [{"b": 2}]
    assert isinstance(IterableWrapper(ROWS).slice(0), Slicer)


def test_flatten_splices_nested_columns_one_level() -> None:
    nested = [(0, 10, (100, 1000)), (1, 11, (111, 1001))]
    assert list(IterableWrapper(nested).flatten(2)) == [(0, 10, 100, 1000), (1, 11, 111, 1001)]
    assert list(IterableWrapper([(0, (1, 2)), (3, [4, [5]])]).flatten()) == [(0, 1, 2), (3, 4, [5])]
    assert list(IterableWrapper([[0, (1, 2), (3,)]]).flatten([1])) == [[0, 1, 2, (3,)]]
    assert list(IterableWrapper([{"a": 1, "b": {"c": 2, "d": 3}}]).flatten()) == [{"a": 1, "c": 2, "d": 3}]
    assert list(IterableWrapper([{"b": {"c": 2}, "e": {"f": 4}}]).flatten("e")) == [{"b": {"c": 2}, "f": 4}]
    assert isinstance(IterableWrapper(ROWS).flatten(), Flattener)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: IterableWrapper([5]).drop(0), "not a tuple, list or dict"),
        (lambda: IterableWrapper([5]).slice(0), "not a tuple, list or dict"),
        (lambda: IterableWrapper([5]).flatten(), "not a tuple, list or dict"),
        (lambda: IterableWrapper([(1, 2)]).drop([1, 7]), "no column 7"),
        (lambda: IterableWrapper([{"a": 1}]).slice(["a", "z"]), "no column 'z'"),
        (lambda: IterableWrapper([{"a": 1}]).slice("z"), "no key 'z'"),
        (lambda: IterableWrapper([{"a": 1, "b": {"a": 2}}]).flatten(), "key 'a' is in the item already"),
    ],
)
def test_what_torchdata_warns_about_is_a_warning_naming_the_op(make: Any, message: str) -> None:
    with pytest.warns(UserWarning, match=message):
        list(make())


def test_a_list_with_stop_or_step_warns_that_only_the_list_is_used() -> None:
    with pytest.warns(UserWarning, match="only the list is used"):
        IterableWrapper(ROWS).slice([0], 2)


def test_lengths_pass_through() -> None:
    assert len(IterableWrapper(ROWS).drop(0)) == len(IterableWrapper(ROWS).slice(0, 1)) == 5
    assert len(IterableWrapper(ROWS).flatten()) == 5


def _pipeline() -> Any:
    rows = [(i, (i, -i), {"k": i}) for i in range(9)]
    return IterableWrapper(rows).shuffle(buffer_size=4).flatten(1).drop(0).slice(0, 2)


def test_they_resume_at_every_cut_of_two_epochs() -> None:
    check_resume_at_every_cut(_pipeline, seed=3, cut_epochs=(0, 1))


def test_the_output_does_not_depend_on_the_worker_count() -> None:
    def read(workers: int) -> list[Any]:
        graph = IterableWrapper([(i, (i, i + 1), i * 2) for i in range(20)]).sharding_filter().flatten(1).drop(2)
        service = MultiProcessingReadingService(workers) if workers else None
        loader = DataLoader2(graph, reading_service=service)
        try:
            return list(loader)
        finally:
            loader.shutdown()

    assert read(0) == read(2) == [(i, i, 2 * i) for i in range(20)]


def test_the_graphs_fingerprint_does_not_depend_on_string_hashing() -> None:
    """A state is checked against the graph's fingerprint: a column set ordered by hash
    would make a state saved in one process foreign to the next."""
    code = (
        "from conveyor.core.graph import fingerprint; from conveyor.pipes import IterableWrapper; "
        "print(fingerprint(IterableWrapper([{}]).drop(['alpha', 'beta', 'gamma']).flatten(['x', 'y'])))"
    )
    prints = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert len(prints) == 1
