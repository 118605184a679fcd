"""Archives and compressed files: tar (plain, gzip, streaming), zip, xz, bz2, gzip, zstd;
members in order, resume inside an archive without reading the members passed over."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest
import zstandard

from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.pipes import (
    Bz2FileLoader,
    Decompressor,
    FileLister,
    FileOpener,
    IterableWrapper,
    TarArchiveLoader,
    XzFileLoader,
    ZipArchiveLoader,
)
from resume_checks import check_resume_at_every_cut

pytestmark = pytest.mark.timeout(120)

MEMBERS = {f"dir/{i:02d}.txt": f"member {i}\n".encode() * (i + 1) for i in range(7)}


def write_tar(path: Path, mode: str = "w") -> Path:
    with tarfile.open(path, mode) as archive:
        info = tarfile.TarInfo("dir")
        info.type = tarfile.DIRTYPE
        archive.addfile(info)  # a directory entry: not yielded
        for name, data in MEMBERS.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def write_zip(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("dir/", b"")
        for name, data in MEMBERS.items():
            archive.writestr(name, data)
    return path


def members_of(pipe: Any, root: Path) -> list[tuple[str, bytes]]:
    return [(os.path.relpath(name, root), stream.read()) for name, stream in pipe]


@pytest.mark.parametrize(
    ("suffix", "mode", "read_mode"),
    [(".tar", "w", "r:*"), (".tar.gz", "w:gz", "r:*"), (".tar", "w", "r|*"), (".tgz", "w:gz", "r|gz")],
)
def test_load_from_tar_yields_each_regular_member_in_order(
    tmp_path: Path, suffix: str, mode: str, read_mode: str
) -> None:
    archive = write_tar(tmp_path / f"a{suffix}", mode)
    pipe = FileOpener(IterableWrapper([str(archive)]), mode="b").load_from_tar(mode=read_mode)
    assert isinstance(pipe, TarArchiveLoader)
    got = members_of(pipe, tmp_path)
    assert got == [(os.path.join(f"a{suffix}", name), data) for name, data in MEMBERS.items()]


def test_load_from_zip_yields_each_file_in_order(tmp_path: Path) -> None:
    archive = write_zip(tmp_path / "a.zip")
    pipe = FileOpener(IterableWrapper([str(archive)]), mode="b").load_from_zip()
    assert isinstance(pipe, ZipArchiveLoader)
    assert members_of(pipe, tmp_path) == [(os.path.join("a.zip", name), data) for name, data in MEMBERS.items()]


def test_members_stay_readable_after_the_archive_moves_on(tmp_path: Path) -> None:
    archive = write_tar(tmp_path / "s.tar")
    members = list(FileOpener(IterableWrapper([str(archive)]), mode="b").load_from_tar(mode="r|*"))
    assert [stream.read() for _, stream in members] == list(MEMBERS.values())


def compressed_files(tmp_path: Path) -> dict[str, Path]:
    data = b"0123456789abcdef" * 100
    files = {
        "gz": tmp_path / "f.txt.gz",
        "xz": tmp_path / "f.txt.xz",
        "bz2": tmp_path / "f.txt.bz2",
        "zst": tmp_path / "f.txt.zst",
    }
    files["gz"].write_bytes(gzip.compress(data))
    files["xz"].write_bytes(lzma.compress(data))
    files["bz2"].write_bytes(bz2.compress(data))
    files["zst"].write_bytes(zstandard.ZstdCompressor().compress(data))
    return files


def test_decompress_tells_the_format_by_suffix_or_magic_bytes(tmp_path: Path) -> None:
    files = compressed_files(tmp_path)
    expected = b"0123456789abcdef" * 100
    by_suffix = Decompressor(FileOpener(IterableWrapper([str(p) for p in files.values()]), mode="b"))
    assert [stream.read() for _, stream in by_suffix] == [expected] * 4
    for kind, path in files.items():  # the same bytes without a telling name
        plain = tmp_path / f"{kind}-noname"
        plain.write_bytes(path.read_bytes())
        ((name, stream),) = list(FileOpener(IterableWrapper([str(plain)]), mode="b").decompress())
        assert name == str(plain) and stream.read() == expected
    explicit = FileOpener(IterableWrapper([str(files["xz"])]), mode="b").extract(file_type="lzma")
    assert [s.read() for _, s in explicit] == [expected]


def test_decompress_opens_archives_as_torchdata_does(tmp_path: Path) -> None:
    tar = write_tar(tmp_path / "a.tar")
    zipped = write_zip(tmp_path / "a.zip")
    (_, opened_tar), (_, opened_zip) = list(FileOpener(IterableWrapper([str(tar), str(zipped)]), mode="b").decompress())
    assert isinstance(opened_tar, tarfile.TarFile) and isinstance(opened_zip, zipfile.ZipFile)


def test_load_from_xz_and_bz2_drop_the_suffix(tmp_path: Path) -> None:
    files = compressed_files(tmp_path)
    xz = FileOpener(IterableWrapper([str(files["xz"])]), mode="b").load_from_xz()
    b2 = FileOpener(IterableWrapper([str(files["bz2"])]), mode="b").load_from_bz2()
    assert isinstance(xz, XzFileLoader) and isinstance(b2, Bz2FileLoader)
    ((xz_name, xz_stream),) = list(xz)
    ((b2_name, b2_stream),) = list(b2)
    assert xz_name == str(tmp_path / "f.txt") == b2_name
    assert xz_stream.read() == b2_stream.read() == b"0123456789abcdef" * 100


def test_what_cannot_be_read_is_an_error_naming_the_file(tmp_path: Path) -> None:
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"not a tar at all" * 100)
    with pytest.raises(tarfile.TarError, match=r"junk\.tar"):
        list(FileOpener(IterableWrapper([str(junk)]), mode="b").load_from_tar())
    with pytest.raises(zipfile.BadZipFile, match=r"junk\.tar"):
        list(FileOpener(IterableWrapper([str(junk)]), mode="b").load_from_zip())
    unknown = tmp_path / "data.bin"
    unknown.write_bytes(b"\x00\x01\x02plain")
    with pytest.raises(ValueError, match=r"cannot tell how .*data\.bin"):
        list(FileOpener(IterableWrapper([str(unknown)]), mode="b").decompress())
    with pytest.raises(ValueError, match="file_type must be one of"):
        IterableWrapper([]).decompress(file_type="rar")


def shards(root: Path) -> Path:
    for k in range(3):
        write_tar(root / f"shard-{k}.tar")
    return root


def tar_members(root: str) -> Any:
    return FileOpener(FileLister(root, "*.tar"), mode="b").load_from_tar().map(read_member)


def read_member(member: tuple[str, Any]) -> tuple[str, bytes]:
    name, stream = member
    return os.path.basename(os.path.dirname(os.path.dirname(name))) + "/" + os.path.basename(name), stream.read()


def test_tar_members_resume_at_every_cut(tmp_path: Path) -> None:
    root = str(shards(tmp_path))
    check_resume_at_every_cut(lambda: tar_members(root), seed=1, cut_epochs=(0,))


def test_zip_members_resume_at_every_cut(tmp_path: Path) -> None:
    for k in range(2):
        write_zip(tmp_path / f"z-{k}.zip")
    root = str(tmp_path)
    check_resume_at_every_cut(
        lambda: FileOpener(FileLister(root, "*.zip"), mode="b").load_from_zip().map(read_member),
        seed=1,
        cut_epochs=(0,),
    )


def test_a_resume_passes_over_members_without_reading_them(tmp_path: Path) -> None:
    """Only the member being read is extracted: the resume opens the archive again and
    passes over the members already yielded by their headers."""
    archive = write_tar(tmp_path / "a.tar")
    loader = DataLoader2(FileOpener(IterableWrapper([str(archive)]), mode="b").load_from_tar().map(read_member))
    it = iter(loader)
    head = [next(it) for _ in range(5)]
    state = loader.state_dict()
    loader.shutdown()
    extracted: list[str] = []
    real = tarfile.TarFile.extractfile

    def counting(self: tarfile.TarFile, member: Any) -> Any:
        extracted.append(member.name if isinstance(member, tarfile.TarInfo) else member)
        return real(self, member)

    again = DataLoader2(FileOpener(IterableWrapper([str(archive)]), mode="b").load_from_tar().map(read_member))
    again.load_state_dict(state)
    tarfile.TarFile.extractfile = counting  # type: ignore[method-assign]
    try:
        rest = list(again)
    finally:
        tarfile.TarFile.extractfile = real  # type: ignore[method-assign]
        again.shutdown()
    assert [name for name, _ in head + rest] == [f"a.tar/{os.path.basename(n)}" for n in MEMBERS]
    assert extracted == list(MEMBERS)[5:]


def test_shards_split_between_workers_read_every_member_once(tmp_path: Path) -> None:
    root = str(shards(tmp_path))

    def read(workers: int) -> list[Any]:
        graph = FileLister(root, "*.tar").sharding_filter()
        graph = FileOpener(graph, mode="b").load_from_tar().map(read_member)
        loader = DataLoader2(graph, reading_service=MultiProcessingReadingService(workers) if workers else None)
        try:
            return list(loader)
        finally:
            loader.shutdown()

    assert read(0) == read(2)
    assert len(read(0)) == 3 * len(MEMBERS)
