"""Files through fsspec: ``file://`` and ``memory://`` (``s3://``, through a real
S3-protocol server, is tests/system/storage/test_s3_files.py): listing, opening, saving,
retries of transient read failures, and resume inside Parquet files by URL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

import conveyor.pipes.io.fsspec_files as fsspec_files
from conveyor.core.graph import fingerprint
from conveyor.pipes import FileLister, FileOpener, FSSpecFileLister, FSSpecFileOpener, FSSpecSaver, IterableWrapper
from fsspec_data import parquet_ids, write_parquet_to
from resume_checks import check_resume_at_every_cut

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


def test_parquet_files_are_read_from_urls_resuming_at_every_cut() -> None:
    urls = [f"memory://parquet-urls/part-{k}.parquet" for k in range(2)]
    ids = [i for k, url in enumerate(urls) for i in write_parquet_to(url, 100 * k)]
    assert list(parquet_ids(urls)) == ids
    check_resume_at_every_cut(lambda: parquet_ids(urls), seed=1, cut_epochs=(0,))
