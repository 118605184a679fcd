"""2 ranks x 2 workers under ``torchrun`` (gloo on 127.0.0.1) read WebDataset shards and
Parquet files by URL, and nothing is read twice: every byte a reader fetched is logged
(``rank_reads.py``), and each shard is read whole by one process, each row group's data
by one process, and every sample and row delivered by exactly one rank. Every reader
also reads each Parquet file's footer (to list its row groups): those reads are counted
apart."""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys
import tarfile
from collections import defaultdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from launches import torchrun

pytestmark = pytest.mark.timeout(300)

SCRIPT = Path(__file__).resolve().with_name("rank_reads.py")
SHARDS, SAMPLES_PER_SHARD = 8, 6
FILES, GROUPS_PER_FILE, ROWS_PER_GROUP = 2, 4, 150


def write_data(root: Path) -> tuple[list[str], list[int]]:
    draw = random.Random(16)
    keys: list[str] = []
    (root / "shards").mkdir(parents=True)
    for shard in range(SHARDS):
        with tarfile.open(root / "shards" / f"shard-{shard:06d}.tar", "w") as archive:
            for sample in range(SAMPLES_PER_SHARD):
                key = f"s{shard:02d}/sample{sample:03d}"
                keys.append(key)
                for extension, data in (("bin", draw.randbytes(8192)), ("cls", str(sample % 3).encode())):
                    info = tarfile.TarInfo(f"{key}.{extension}")
                    info.size = len(data)
                    archive.addfile(info, io.BytesIO(data))
    (root / "tables").mkdir()
    ids: list[int] = []
    for f in range(FILES):
        rows = GROUPS_PER_FILE * ROWS_PER_GROUP
        file_ids = list(range(f * rows, (f + 1) * rows))
        ids += file_ids
        table = pa.table({"id": file_ids, "payload": [draw.randbytes(600) for _ in file_ids], "extra": file_ids})
        pq.write_table(table, root / "tables" / f"part-{f}.parquet", row_group_size=ROWS_PER_GROUP)
    return keys, ids


def read_logs(out: Path) -> list[tuple[int, str, str, int, int]]:
    """``(rank, reader, path, offset, bytes)`` for every read, ``reader`` naming the process."""
    reads = []
    for log in sorted(out.glob("reads-*.log")):
        rank, pid = log.stem.split("-")[1:]
        for line in log.read_text().splitlines():
            path, offset, count = line.rsplit(" ", 2)
            reads.append((int(rank), f"{rank}-{pid}", path, int(offset), int(count)))
    return reads


def chunk_ranges(path: str, columns: set[str]) -> list[tuple[int, int]]:
    """The byte range of each row group's chunks of ``columns``: what reading it fetches."""
    metadata = pq.ParquetFile(path).metadata
    ranges = []
    for group in range(metadata.num_row_groups):
        chunks = [metadata.row_group(group).column(c) for c in range(metadata.num_columns)]
        chosen = [chunk for chunk in chunks if chunk.path_in_schema in columns]
        starts = [chunk.dictionary_page_offset or chunk.data_page_offset for chunk in chosen]
        ends = [start + chunk.total_compressed_size for start, chunk in zip(starts, chosen, strict=True)]
        ranges.append((min(starts), max(ends)))
    return ranges


def test_two_ranks_of_two_workers_read_each_byte_once(tmp_path: Path) -> None:
    keys, ids = write_data(tmp_path / "data")
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run(
        [*torchrun(), "--standalone", "--nproc-per-node", "2", str(SCRIPT), "--data", str(tmp_path / "data")],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "OMP_NUM_THREADS": "1", "RANK_READS_OUT": str(out), "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    delivered = [json.loads((out / f"items-{rank}.json").read_text()) for rank in (0, 1)]

    # every sample and row, by exactly one rank, each rank half of them
    for items in delivered:  # a sample's key is its shard's URL and its name inside
        assert all(key.startswith(f"counted://{tmp_path}/data/shards/shard-") for key in items["webdataset"])
        items["webdataset"] = [key.split(".tar/", 1)[1] for key in items["webdataset"]]
    for name, everything in (("webdataset", keys), ("parquet", ids)):
        by_rank = [items[name] for items in delivered]
        assert sorted(by_rank[0] + by_rank[1]) == sorted(everything), name
        assert len(by_rank[0]) == len(by_rank[1]) == len(everything) // 2, name

    reads = read_logs(out)
    assert {rank for rank, *_ in reads} == {0, 1}
    bytes_by_rank: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))

    # shards: each read whole, once, by one reader (a worker of one rank)
    for shard in sorted((tmp_path / "data" / "shards").glob("*.tar")):
        shard_reads = [r for r in reads if r[2] == str(shard)]
        assert len({reader for _, reader, *_ in shard_reads}) == 1, shard.name
        assert sorted((offset, count) for *_, offset, count in shard_reads)[0][0] == 0
        assert sum(count for *_, count in shard_reads) == shard.stat().st_size, shard.name
        bytes_by_rank["shards"][shard_reads[0][0]] += shard.stat().st_size
    assert len({reader for _, reader, path, *_ in reads if path.endswith(".tar")}) == 4  # 2 ranks x 2 workers

    # Parquet: each row group's chunks fetched by one reader; nothing else but footers
    for table in sorted((tmp_path / "data" / "tables").glob("*.parquet")):
        size = table.stat().st_size
        table_reads = [r for r in reads if r[2] == str(table)]
        footer = [r for r in table_reads if r[3] + r[4] == size]  # read back from the file's end
        assert len({reader for _, reader, *_ in footer}) == 4, table.name  # each reader lists the groups
        data_reads = [r for r in table_reads if r not in footer]
        for start, end in chunk_ranges(str(table), {"id", "payload"}):
            inside = [r for r in data_reads if r[3] < end and start < r[3] + r[4]]
            assert len({reader for _, reader, *_ in inside}) == 1, (table.name, start, end)
            assert sum(count for *_, count in inside) == end - start, (table.name, start, end)
            bytes_by_rank["row groups"][inside[0][0]] += end - start
        assert sum(count for *_, count in data_reads) == sum(
            end - start for start, end in chunk_ranges(str(table), {"id", "payload"})
        )

    # each rank fetched exactly the bytes of the shards and row groups whose items it delivered
    expected: dict[str, dict[int, int]] = {"shards": {}, "row groups": {}}
    tables = sorted((tmp_path / "data" / "tables").glob("*.parquet"))
    for rank, items in enumerate(delivered):
        shards = {key.split("/")[0] for key in items["webdataset"]}
        shard_paths = [tmp_path / "data" / "shards" / f"shard-{int(s[1:]):06d}.tar" for s in shards]
        expected["shards"][rank] = sum(path.stat().st_size for path in shard_paths)
        rows_per_file = GROUPS_PER_FILE * ROWS_PER_GROUP
        groups = {(i // rows_per_file, i % rows_per_file // ROWS_PER_GROUP) for i in items["parquet"]}
        ranges = {f: chunk_ranges(str(table), {"id", "payload"}) for f, table in enumerate(tables)}
        expected["row groups"][rank] = sum(ranges[f][g][1] - ranges[f][g][0] for f, g in groups)
    assert {kind: dict(per_rank) for kind, per_rank in bytes_by_rank.items()} == expected
