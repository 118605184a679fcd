"""Property tests of the file formats: for generated contents (member counts and sizes,
sample layouts, rows and row-group sizes, CSV and JSON lines, compression), a format reads
back what was written, and a state saved at any cut inside a file, shard or row group
resumes to the same items (:func:`test_properties.check_resume_at_every_cut`)."""

from __future__ import annotations

import gzip
import io
import json
import re
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conveyor import DataLoader2
from conveyor.pipes import FileLister, FileOpener, IterableWrapper, IterDataPipe
from hypothesis_profiles import scaled
from resume_checks import check_resume_at_every_cut

pytestmark = pytest.mark.timeout(300)

SETTINGS = settings(max_examples=scaled(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])

names = st.text(alphabet="abcdefgh", min_size=1, max_size=4)
member_data = st.binary(max_size=300)


ARCHIVE_PREFIX = re.compile(r"^.*/a\d+\.(tar\.gz|tar|zip)/")


def read_member(member: tuple[str, Any]) -> tuple[str, bytes]:
    """``(member name inside its archive, data)``."""
    path, stream = member
    return ARCHIVE_PREFIX.sub("", path), stream.read()


def plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value.item() if isinstance(value, np.generic) else value


def as_plain(row: dict[str, Any]) -> dict[str, Any]:
    return {key: plain(value) for key, value in row.items()}


def read_all(pipe: IterDataPipe) -> list[Any]:
    loader = DataLoader2(pipe)
    try:
        return list(loader)
    finally:
        loader.shutdown()


@st.composite
def archives(draw: st.DrawFn) -> list[list[tuple[str, bytes]]]:
    """Archives of members with unique paths (some in directories, some empty)."""
    layout = []
    for _ in range(draw(st.integers(1, 3))):
        paths = draw(st.lists(st.tuples(st.lists(names, max_size=2), names), max_size=5, unique_by=str))
        layout.append([("/".join([*dirs, f"{name}.bin"]), draw(member_data)) for dirs, name in paths])
    return layout


@SETTINGS
@given(layout=archives(), kind=st.sampled_from(["tar", "tar.gz", "zip"]))
def test_archive_members_read_back_and_resume_at_every_cut(layout: list[list[tuple[str, bytes]]], kind: str) -> None:
    with tempfile.TemporaryDirectory() as root:
        for index, members in enumerate(layout):
            path = Path(root, f"a{index}.{kind}")
            if kind == "zip":
                with zipfile.ZipFile(path, "w") as archive:
                    for name, data in members:
                        archive.writestr(name, data)
                continue
            with tarfile.open(path, "w:gz" if kind == "tar.gz" else "w") as archive:
                for name, data in members:
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    archive.addfile(info, io.BytesIO(data))

        def make() -> IterDataPipe:
            opened = FileOpener(FileLister(root, f"*.{kind}"), mode="b")
            loaded = opened.load_from_zip() if kind == "zip" else opened.load_from_tar()
            return loaded.map(read_member)

        assert read_all(make()) == [member for members in layout for member in members]
        check_resume_at_every_cut(make, seed=0, cut_epochs=(0,))


@st.composite
def sample_shards(draw: st.DrawFn) -> list[list[dict[str, bytes]]]:
    """Shards of WebDataset samples: unique keys (dots allowed in directories), 1-3 fields."""
    shards = []
    for shard in range(draw(st.integers(1, 3))):
        keys = draw(st.lists(names, max_size=4, unique=True))
        samples = []
        for key in keys:
            fields = draw(
                st.lists(st.sampled_from(["jpg", "cls", "seg.png", "json"]), min_size=1, max_size=3, unique=True)
            )
            sample = {"__key__": f"d{shard}.v2/{key}"}
            sample.update({field: draw(member_data) for field in fields})
            samples.append(sample)
        shards.append(samples)
    return shards


def sample_fields(sample: dict[str, Any]) -> dict[str, Any]:
    return {key: value if key == "__key__" else value.read() for key, value in sample.items()}


@SETTINGS
@given(shards=sample_shards())
def test_webdataset_samples_read_back_and_resume_at_every_cut(shards: list[list[dict[str, bytes]]]) -> None:
    with tempfile.TemporaryDirectory() as root:
        expected = []
        for index, samples in enumerate(shards):
            shard = Path(root, f"shard-{index:06d}.tar")
            with tarfile.open(shard, "w") as archive:
                for sample in samples:
                    for field, data in sample.items():
                        if field == "__key__":
                            continue
                        info = tarfile.TarInfo(f"{sample['__key__']}.{field}")
                        info.size = len(data)
                        archive.addfile(info, io.BytesIO(data))
                    expected.append(
                        {
                            "__key__": f"{shard}/{sample['__key__']}",
                            **{f".{k}": v for k, v in sample.items() if k != "__key__"},
                        }
                    )

        def make() -> IterDataPipe:
            return FileOpener(FileLister(root, "*.tar"), mode="b").load_from_tar().webdataset().map(sample_fields)

        assert read_all(make()) == expected
        check_resume_at_every_cut(make, seed=0, cut_epochs=(0,))


@SETTINGS
@given(
    files=st.lists(st.integers(0, 25), min_size=1, max_size=3),
    group=st.integers(1, 8),
    batch_rows=st.one_of(st.none(), st.integers(1, 6)),
)
def test_parquet_rows_read_back_and_resume_at_every_cut(files: list[int], group: int, batch_rows: int | None) -> None:
    with tempfile.TemporaryDirectory() as root:
        rows: list[dict[str, Any]] = []
        first = 0
        for index, count in enumerate(files):
            ids = list(range(first, first + count))
            first += count
            table = pa.table({"id": pa.array(ids, pa.int64()), "word": [f"w{i}" * (i % 3) for i in ids]})
            pq.write_table(table, Path(root, f"part-{index}.parquet"), row_group_size=group)
            rows += [{"id": i, "word": f"w{i}" * (i % 3)} for i in ids]

        def make() -> IterDataPipe:
            return FileLister(root, "*.parquet").load_parquet(batch_rows=batch_rows).map(as_plain)

        got = read_all(make())
        if batch_rows is None:
            assert got == rows
        else:  # batches of up to batch_rows rows, never across a row group
            assert [
                {"id": i, "word": w} for batch in got for i, w in zip(batch["id"], batch["word"], strict=True)
            ] == rows
            assert all(0 < len(batch["id"]) <= batch_rows for batch in got)
        check_resume_at_every_cut(make, seed=0, cut_epochs=(0,))


cells = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\r\x00"), max_size=6)


@SETTINGS
@given(
    tables=st.lists(st.lists(st.lists(cells, min_size=2, max_size=2), max_size=5), min_size=1, max_size=3),
    compressed=st.booleans(),
)
def test_csv_and_json_lines_read_back_and_resume_at_every_cut(tables: list[list[list[str]]], compressed: bool) -> None:
    import csv

    with tempfile.TemporaryDirectory() as root:
        for index, table in enumerate(tables):
            text = io.StringIO()
            csv.writer(text).writerows(table)
            lines = "".join(json.dumps({"a": a, "b": b}) + "\n" for a, b in table)
            for suffix, content in (("csv", text.getvalue()), ("jsonl", lines)):
                data = content.encode()
                name = Path(root, f"t{index}.{suffix}" + (".gz" if compressed else ""))
                name.write_bytes(gzip.compress(data, mtime=0) if compressed else data)

        def make(suffix: str) -> IterDataPipe:
            opened = FileOpener(FileLister(root, f"*.{suffix}*"), mode="b")
            if compressed:
                opened = opened.decompress()
            if suffix == "csv":
                return opened.parse_csv(as_tuple=True)
            return opened.parse_jsonl_files(return_path=False)

        assert read_all(make("csv")) == [tuple(row) for table in tables for row in table]
        assert read_all(make("jsonl")) == [{"a": a, "b": b} for table in tables for a, b in table]
        for suffix in ("csv", "jsonl"):
            check_resume_at_every_cut(lambda suffix=suffix: make(suffix), seed=0, cut_epochs=(0,))


def test_an_empty_file_list_reads_nothing() -> None:
    assert read_all(IterableWrapper([]).load_parquet()) == []
