"""Files through fsspec: ``file://``, ``memory://`` and ``s3://`` (a real S3-protocol
server on 127.0.0.1: moto's, started by a fixture), listing, opening, saving, retries of
transient read failures, and resume inside remote archives and Parquet files."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import s3fs
from fsspec.implementations.memory import MemoryFileSystem

import conveyor.pipes.io.fsspec_files as fsspec_files
from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.core.graph import fingerprint
from conveyor.pipes import FileLister, FileOpener, FSSpecFileLister, FSSpecFileOpener, FSSpecSaver, IterableWrapper
from resume_checks import check_resume_at_every_cut
from s3_server import s3_endpoint, s3_options  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(180)


def fill_memory(prefix: str) -> None:
    fs = fsspec.filesystem("memory")
    for name, text in {"a.txt": "a1\na2\n", "b.txt": "b1\n", "c.csv": "x,y\n", "sub/d.txt": "d1\n"}.items():
        fs.pipe(f"{prefix}/{name}", text.encode())


def test_list_and_open_files_by_fsspec_on_memory() -> None:
    fill_memory("/listing")
    lister = IterableWrapper(["memory://listing"]).list_files_by_fsspec(masks="*.txt")
    assert isinstance(lister, FSSpecFileLister)
    assert list(lister) == ["memory:///listing/a.txt", "memory:///listing/b.txt"]
    deep = list(FSSpecFileLister("memory://listing", masks=["*.txt"], recursive=True))
    assert deep == ["memory:///listing/a.txt", "memory:///listing/b.txt", "memory:///listing/sub/d.txt"]
    opener = lister.open_files_by_fsspec(mode="r")
    assert isinstance(opener, FSSpecFileOpener)
    assert [(url, stream.read()) for url, stream in opener] == [
        ("memory:///listing/a.txt", "a1\na2\n"),
        ("memory:///listing/b.txt", "b1\n"),
    ]


def test_file_lister_and_opener_take_urls() -> None:
    fill_memory("/urls")
    lines = FileOpener(FileLister("memory://urls", "*.txt"), mode="r").readlines(return_path=False)
    assert list(lines) == ["a1", "a2", "b1"]


def test_file_urls_read_as_local_paths(tmp_path: Path) -> None:
    (tmp_path / "x.txt").write_text("local\n")
    pipe = FSSpecFileLister(f"file://{tmp_path}").open_files_by_fsspec(mode="r")
    assert [stream.read() for _, stream in pipe] == ["local\n"]


def test_save_by_fsspec_writes_each_item_and_yields_its_url() -> None:
    items = IterableWrapper([("one", b"1"), ("two", b"22")])
    saver = items.save_by_fsspec(mode="wb", filepath_fn=lambda name: f"memory://saved/{name}.bin")
    assert isinstance(saver, FSSpecSaver)
    assert list(saver) == ["memory://saved/one.bin", "memory://saved/two.bin"]
    assert fsspec.filesystem("memory").cat("/saved/two.bin") == b"22"


class Flaky(MemoryFileSystem):
    """A memory filesystem whose reads fail ``failures`` times with a dropped connection."""

    protocol = "flaky"
    failures = 0

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        return MemoryFileSystem._strip_protocol(path.removeprefix("flaky://"))

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        opened = super()._open(path, mode, **kwargs)
        real_read = opened.read

        def read(*args: Any) -> Any:
            if Flaky.failures > 0:
                Flaky.failures -= 1
                raise ConnectionResetError("connection reset by peer")
            return real_read(*args)

        opened.read = read
        return opened


@pytest.fixture
def flaky(monkeypatch: pytest.MonkeyPatch) -> type[Flaky]:
    fsspec.register_implementation("flaky", Flaky, clobber=True)
    monkeypatch.setattr(fsspec_files, "RETRY_PAUSE_S", 0.001)
    Flaky.store = MemoryFileSystem.store  # type: ignore[attr-defined]
    fsspec.filesystem("memory").pipe("/flaky/data.bin", bytes(range(256)) * 100)
    return Flaky


def test_transient_read_failures_are_retried_from_the_same_offset(flaky: type[Flaky]) -> None:
    flaky.failures = 3
    ((url, stream),) = list(FSSpecFileOpener(IterableWrapper(["flaky:///flaky/data.bin"])))
    assert stream.read(10) == bytes(range(10))
    flaky.failures = 2
    assert stream.read() == (bytes(range(256)) * 100)[10:]
    assert url == "flaky:///flaky/data.bin"


def test_a_read_that_keeps_failing_is_raised_naming_the_url(flaky: type[Flaky]) -> None:
    flaky.failures = 1000
    ((_, stream),) = list(FSSpecFileOpener(IterableWrapper(["flaky:///flaky/data.bin"])))
    with pytest.raises(OSError, match=r"reading 'flaky:///flaky/data\.bin' at byte 0 failed 5 times"):
        stream.read()
    flaky.failures = 0


def test_a_missing_file_is_not_retried() -> None:
    with pytest.raises(FileNotFoundError):
        list(FSSpecFileOpener(IterableWrapper(["memory:///no/such/file"])))


def test_storage_options_stay_out_of_the_description() -> None:
    secret = "s3cr3t-value"
    lister = FSSpecFileLister("memory://x", masks="*.txt", key="id", secret=secret)
    opener = lister.open_files_by_fsspec(secret=secret)
    assert secret not in repr(opener) and secret not in repr(lister)
    assert fingerprint(opener) == fingerprint(FSSpecFileLister("memory://x", masks="*.txt").open_files_by_fsspec())


# --- s3:// through a real S3-protocol server ------------------------------------------------


def write_shards_to_s3(fs: s3fs.S3FileSystem, bucket: str, shards: int = 3, members: int = 4) -> list[str]:
    names = []
    for k in range(shards):
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            for m in range(members):
                data = f"shard {k} member {m}".encode()
                info = tarfile.TarInfo(f"s{k}/m{m}.txt")
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
                names.append(data.decode())
        fs.pipe(f"{bucket}/shards/part-{k}.tar", buffer.getvalue())
    return names


@pytest.fixture
def s3_bucket(s3_endpoint: str, request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:  # noqa: F811
    options = s3_options(s3_endpoint)
    fs = s3fs.S3FileSystem(**options)
    bucket = f"bucket-{abs(hash(request.node.name)) % 10**8}"
    fs.mkdir(bucket)
    return bucket, options


def member_text(member: tuple[str, Any]) -> str:
    return member[1].read().decode()


def s3_members(bucket: str, options: dict[str, Any]) -> Any:
    urls = FSSpecFileLister(f"s3://{bucket}/shards", masks="*.tar", **options)
    return urls.open_files_by_fsspec(**options).load_from_tar().map(member_text)


def test_tar_shards_on_s3_read_as_written(s3_bucket: tuple[str, dict[str, Any]]) -> None:
    bucket, options = s3_bucket
    written = write_shards_to_s3(s3fs.S3FileSystem(**options), bucket)
    assert list(FSSpecFileLister(f"s3://{bucket}/shards", **options)) == [
        f"s3://{bucket}/shards/part-{k}.tar" for k in range(3)
    ]
    assert list(s3_members(bucket, options)) == written


def test_tar_shards_on_s3_resume_at_every_cut(s3_bucket: tuple[str, dict[str, Any]]) -> None:
    bucket, options = s3_bucket
    write_shards_to_s3(s3fs.S3FileSystem(**options), bucket, shards=2, members=2)
    check_resume_at_every_cut(lambda: s3_members(bucket, options), seed=1, cut_epochs=(0,))


def test_save_by_fsspec_to_s3(s3_bucket: tuple[str, dict[str, Any]]) -> None:
    bucket, options = s3_bucket
    saver = IterableWrapper([(f"s3://{bucket}/out/{i}.txt", str(i) * 3) for i in range(3)]).save_by_fsspec(**options)
    assert list(saver) == [f"s3://{bucket}/out/{i}.txt" for i in range(3)]
    assert s3fs.S3FileSystem(**options).cat(f"{bucket}/out/2.txt") == b"222"


def write_parquet_to(url: str, first_id: int, rows: int = 12, **options: Any) -> list[int]:
    ids = list(range(first_id, first_id + rows))
    with fsspec.open(url, "wb", **options) as out:
        pq.write_table(pa.table({"id": ids, "half": [i / 2 for i in ids]}), out, row_group_size=5)
    return ids


def parquet_ids(urls: list[str], **options: Any) -> Any:
    return IterableWrapper(urls).load_parquet(columns=["id"], **options).map(lambda row: int(row["id"]))


def test_parquet_files_are_read_from_urls_resuming_at_every_cut() -> None:
    urls = [f"memory://parquet-urls/part-{k}.parquet" for k in range(2)]
    ids = [i for k, url in enumerate(urls) for i in write_parquet_to(url, 100 * k)]
    assert list(parquet_ids(urls)) == ids
    check_resume_at_every_cut(lambda: parquet_ids(urls), seed=1, cut_epochs=(0,))


def test_parquet_on_s3_by_row_group_with_the_storage_options(s3_bucket: tuple[str, dict[str, Any]]) -> None:
    bucket, options = s3_bucket
    urls = [f"s3://{bucket}/table/part-{k}.parquet" for k in range(2)]
    ids = [i for k, url in enumerate(urls) for i in write_parquet_to(url, 100 * k, **options)]
    pipe = parquet_ids(urls, **options)
    assert "testing" not in repr(pipe) and list(pipe) == ids
    loader = DataLoader2(pipe, reading_service=MultiProcessingReadingService(num_workers=2))
    try:
        assert list(loader) == ids
    finally:
        loader.shutdown()


def test_members_of_a_remote_archive_are_named_by_its_url(s3_bucket: tuple[str, dict[str, Any]]) -> None:
    bucket, options = s3_bucket
    write_shards_to_s3(s3fs.S3FileSystem(**options), bucket, shards=1, members=2)
    urls = FSSpecFileLister(f"s3://{bucket}/shards", masks="*.tar", **options)
    paths = [path for path, _ in urls.open_files_by_fsspec(**options).load_from_tar()]
    assert paths == [f"s3://{bucket}/shards/part-0.tar/s0/m{m}.txt" for m in range(2)]
    samples = urls.open_files_by_fsspec(**options).load_from_tar().webdataset()
    assert [sample["__key__"] for sample in samples] == [f"s3://{bucket}/shards/part-0.tar/s0/m{m}" for m in range(2)]
