"""WebDataset shards: ``webdataset()`` samples from ``load_from_tar`` members, read back
from shards the webdataset package wrote; ``shard_expand()``; resume inside a shard."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest
import webdataset as wds

from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.pipes import FileLister, FileOpener, IterableWrapper, ShardExpander, WebDataset
from conveyor.pipes.io.webdataset import expand_shards, split_member_path
from resume_checks import check_resume_at_every_cut

pytestmark = pytest.mark.timeout(120)


def write_shards(root: Path, samples: int = 23, per_shard: int = 7) -> list[dict[str, Any]]:
    written = [{"__key__": f"sample{i:04d}", "txt": f"text {i}", "cls": i % 5} for i in range(samples)]
    with wds.ShardWriter(str(root / "shard-%06d.tar"), maxcount=per_shard, verbose=0) as sink:
        for sample in written:
            sink.write(dict(sample))
    return written


def read_fields(sample: dict[str, Any]) -> dict[str, Any]:
    """A sample with its streams read and its key's shard part dropped."""
    return {
        "__key__": os.path.basename(sample["__key__"]),
        **{k: v.read() for k, v in sample.items() if k != "__key__"},
    }


def samples_under(root: str) -> Any:
    return FileOpener(FileLister(root, "*.tar"), mode="b").load_from_tar().webdataset().map(read_fields)


def test_shards_written_by_the_webdataset_package_read_back_identically(tmp_path: Path) -> None:
    written = write_shards(tmp_path)
    assert len(list(tmp_path.glob("shard-*.tar"))) == 4
    pipe = FileOpener(FileLister(str(tmp_path), "*.tar"), mode="b").load_from_tar().webdataset()
    assert isinstance(pipe, WebDataset)
    first = next(iter(pipe))
    assert first["__key__"] == os.path.join(str(tmp_path), "shard-000000.tar", "sample0000")
    assert sorted(first) == [".cls", ".txt", "__key__"]
    read = list(samples_under(str(tmp_path)))
    assert read == [
        {"__key__": w["__key__"], ".cls": str(w["cls"]).encode(), ".txt": w["txt"].encode()} for w in written
    ]


def add_member(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data))


def test_dots_in_directories_stay_in_the_key_and_suffixless_members_are_skipped(tmp_path: Path) -> None:
    with tarfile.open(tmp_path / "a.tar", "w") as archive:
        add_member(archive, "dir.v2/img001.seg.png", b"p")
        add_member(archive, "dir.v2/img001.json", b"j")
        add_member(archive, "README", b"metadata")
        add_member(archive, "dir.v2/img002.json", b"k")
    samples = list(FileOpener(IterableWrapper([str(tmp_path / "a.tar")]), mode="b").load_from_tar().webdataset())
    prefix = os.path.join(str(tmp_path), "a.tar", "dir.v2")
    assert [s["__key__"] for s in samples] == [f"{prefix}/img001", f"{prefix}/img002"]
    assert sorted(samples[0]) == [".json", ".seg.png", "__key__"]
    assert split_member_path("x\\y.z/w.tar.gz") == ("x/y.z/w", ".tar.gz")


def test_samples_resume_at_every_cut(tmp_path: Path) -> None:
    write_shards(tmp_path, samples=9, per_shard=4)
    root = str(tmp_path)
    check_resume_at_every_cut(lambda: samples_under(root), seed=2, cut_epochs=(0,))


def test_shards_split_between_workers_give_every_sample_once(tmp_path: Path) -> None:
    written = write_shards(tmp_path)
    root = str(tmp_path)

    def read(workers: int) -> list[Any]:
        graph = FileOpener(FileLister(root, "*.tar").sharding_filter(), mode="b")
        graph = graph.load_from_tar().webdataset().map(read_fields)
        loader = DataLoader2(graph, reading_service=MultiProcessingReadingService(workers) if workers else None)
        try:
            return list(loader)
        finally:
            loader.shutdown()

    assert read(0) == read(2)
    assert sorted(s["__key__"] for s in read(2)) == [w["__key__"] for w in written]


@pytest.mark.parametrize(
    ("spec", "names"),
    [
        ("s-{000..002}.tar", ["s-000.tar", "s-001.tar", "s-002.tar"]),
        ("a{1..2}-{08..10}", ["a1-08", "a1-09", "a1-10", "a2-08", "a2-09", "a2-10"]),
        ("x{8..10}", ["x8", "x9", "x10"]),
        ("plain.tar", ["plain.tar"]),
    ],
)
def test_shard_expand_expands_ranges(spec: str, names: list[str]) -> None:
    assert expand_shards(spec) == names
    pipe = IterableWrapper([spec]).shard_expand()
    assert isinstance(pipe, ShardExpander) and list(pipe) == names


@pytest.mark.parametrize(("spec", "message"), [("s{3..1}", "goes down"), ("s{001..9}", "wider")])
def test_shard_expand_refuses_bad_ranges(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        expand_shards(spec)
