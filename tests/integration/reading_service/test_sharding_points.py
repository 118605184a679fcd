"""Which sharding point splits the items: a source's own split (``load_parquet``'s row
groups, ``DataLoader2``'s split of a map-style source) yields to a sharding point the user
writes downstream, for every reading service, ranks and workers alike; a branch the user
shards twice is refused when ``DataLoader2`` is built, naming both points as written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conveyor import (
    DataLoader2,
    DistributedReadingService,
    MultiProcessingReadingService,
    SequentialReadingService,
)
from conveyor.core.base import IterDataPipe
from conveyor.errors import GraphError
from conveyor.graph import SHARDING_PRIORITIES, apply_sharding, find_dps
from conveyor.pipes import FileLister, IterableWrapper, SequenceWrapper, ShardingFilter
from distributed_helpers import run_ranks, succeeded

pytestmark = pytest.mark.timeout(120)


def write_ids(root: Path, files: int = 3, rows: int = 10, group: int = 4) -> list[int]:
    for f in range(files):
        table = pa.table({"id": list(range(f * rows, (f + 1) * rows))})
        pq.write_table(table, root / f"p{f}.parquet", row_group_size=group)
    return list(range(files * rows))


def row_id(row: dict[str, Any]) -> int:
    return int(row["id"])


def double(x: int) -> int:
    return 2 * x


def read(graph: Any, workers: int, **options: Any) -> list[Any]:
    service = MultiProcessingReadingService(num_workers=workers, multiprocessing_context="fork") if workers else None
    loader = DataLoader2(graph, reading_service=service, **options)
    try:
        return list(loader)
    finally:
        loader.shutdown()


# --- a branch sharded twice ----------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_a_branch_sharded_twice_is_refused_when_the_loader_is_built(workers: int) -> None:
    twice = IterableWrapper(range(8)).sharding_filter().map(double).sharding_filter()
    service = MultiProcessingReadingService(num_workers=workers) if workers else None
    with pytest.raises(GraphError) as refused:
        DataLoader2(twice, reading_service=service)  # no iter(): refused before any worker starts
    message = str(refused.value)
    assert "sharding_filter() after IterableWrapper" in message
    assert "and then sharding_filter() after Mapper(fn=test_sharding_points.double" in message
    assert "between ranks and workers" in message
    assert "sharded once: remove one of them" in message
    assert "ShardingFilter()" not in message


def test_an_unnamed_dispatch_after_a_sharding_filter_is_twice_between_ranks_only() -> None:
    """Without ranks the main process reads the branch before a dispatch point, and the
    workers' level never reaches it: every item once. Between ranks both would split."""
    pipe = IterableWrapper(range(8)).sharding_filter().sharding_round_robin_dispatch()
    assert read(pipe.map(double), 2) == [2 * i for i in range(8)]
    with pytest.raises(GraphError, match=r"name the dispatch's level.*SHARDING_PRIORITIES\.MULTIPROCESSING") as refused:
        apply_sharding(pipe, 2, 0, SHARDING_PRIORITIES.DISTRIBUTED)  # as DistributedReadingService does
    message = str(refused.value)
    assert "sharding_filter() after IterableWrapper" in message
    assert "sharding_round_robin_dispatch() after sharding_filter() both split its items between ranks," in message


def test_points_on_separate_branches_or_after_a_dispatch_are_not_twice() -> None:
    zipped = IterableWrapper(range(6)).sharding_filter().zip(IterableWrapper(range(6)).sharding_filter())
    assert read(zipped, 2) == [(i, i) for i in range(6)]
    split = IterableWrapper(range(6)).sharding_filter()
    named = split.sharding_round_robin_dispatch(SHARDING_PRIORITIES.MULTIPROCESSING)
    assert read(named.map(double), 2) == [2 * i for i in range(6)]


# --- a source's own split yields ------------------------------------------------------------


def test_load_parquets_own_split_yields_to_the_users_point_in_apply_sharding(tmp_path: Path) -> None:
    ids = write_ids(tmp_path)
    graph = FileLister(str(tmp_path), masks="*.parquet").load_parquet().sharding_filter()
    apply_sharding(graph, 2, 1, SHARDING_PRIORITIES.MULTIPROCESSING)
    own, users = find_dps(graph, ShardingFilter)[::-1]
    assert users is graph and users.sharding == [(2, 1)] and own.sharding == []
    assert [row_id(row) for row in graph] == ids[1::2]


def test_load_parquets_own_split_keeps_the_ranks_before_a_named_dispatch(tmp_path: Path) -> None:
    """The user's dispatch point takes the workers' level only: the ranks' level stays with
    ``load_parquet``'s split (each rank reads its own row groups, its workers get rows)."""
    ids = write_ids(tmp_path)
    rows = FileLister(str(tmp_path), masks="*.parquet").load_parquet()
    graph = rows.sharding_round_robin_dispatch(SHARDING_PRIORITIES.MULTIPROCESSING).map(row_id)
    apply_sharding(graph, 2, 0, SHARDING_PRIORITIES.DISTRIBUTED)
    assert rows.source.sharding == [(2, 0)]
    unit = {i: 3 * (i // 10) + (i % 10) // 4 for i in ids}  # (file, row group) in listing order
    assert read(rows.map(row_id), 0) == [i for i in ids if unit[i] % 2 == 0]
    fresh = FileLister(str(tmp_path), masks="*.parquet").load_parquet()
    assert read(fresh.sharding_round_robin_dispatch(SHARDING_PRIORITIES.MULTIPROCESSING).map(row_id), 2) == ids
    unnamed = FileLister(str(tmp_path), masks="*.parquet").load_parquet().sharding_round_robin_dispatch()
    assert read(unnamed.map(row_id), 2) == ids  # the user's dispatch takes every level: the own split goes


class ShardAfter:
    """An adapter that maps and shards the loader's graph (after its own split)."""

    def __call__(self, graph: IterDataPipe) -> IterDataPipe:
        return graph.map(double).sharding_filter()


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_a_map_style_source_sharded_downstream_gives_every_item_once_in_order(workers: int) -> None:
    expected = [2 * i for i in range(23)]
    assert read(SequenceWrapper(list(range(23))), workers, datapipe_adapter_fn=ShardAfter()) == expected
    assert read(SequenceWrapper(list(range(23))).to_iter_datapipe().map(double).sharding_filter(), workers) == expected
    assert read(SequenceWrapper(list(range(23))).to_iter_datapipe().sharding_filter().map(double), workers) == expected


# --- ranks x workers ------------------------------------------------------------------------


def _rank_rows(rank: int, world: int, root: str, workers: int | None) -> list[int]:
    service: Any = DistributedReadingService()
    if workers is not None:
        service = SequentialReadingService(service, MultiProcessingReadingService(num_workers=workers))
    graph = FileLister(root, masks="*.parquet").load_parquet().sharding_filter().map(row_id)
    loader = DataLoader2(graph, reading_service=service)
    try:
        return list(loader)
    finally:
        loader.shutdown()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("workers", [None, 2])
def test_ranks_and_workers_read_every_row_once_from_the_users_split(tmp_path: Path, workers: int | None) -> None:
    ids = write_ids(tmp_path)  # 30 rows: 15 a rank, so the agreed epoch end drops none
    results = succeeded(run_ranks(2, _rank_rows, str(tmp_path), workers))
    assert results == [ids[0::2], ids[1::2]]  # rank r keeps positions r mod 2, in order
