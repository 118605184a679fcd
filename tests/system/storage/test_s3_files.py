"""Files on ``s3://``, through a real S3-protocol server on 127.0.0.1 (moto's, started
by a session fixture): listing, opening and saving with the storage options, tar shards
and Parquet files read back, split between workers, and resumed at every cut."""

from __future__ import annotations

import io
import tarfile
from typing import Any

import pytest
import s3fs

from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.pipes import FSSpecFileLister, IterableWrapper
from fsspec_data import parquet_ids, write_parquet_to
from resume_checks import check_resume_at_every_cut
from s3_server import s3_endpoint, s3_options  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(180)


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
