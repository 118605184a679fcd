"""``check_hash`` (bytes, text, seekable and one-way streams, md5 and sha256) and
``save_to_disk`` (whole files only, text and binary), and their resumes."""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conveyor.errors import HashMismatchError
from conveyor.pipes import IterableWrapper
from conveyor.pipes.io.saver import write_atomically
from hypothesis_profiles import scaled
from resume_checks import check_resume_at_every_cut

pytestmark = pytest.mark.timeout(120)


class OneWay(io.RawIOBase):
    """A stream that cannot seek, like a network read."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        chunk = self._data.read(len(buffer))
        buffer[: len(chunk)] = chunk
        return len(chunk)


DATA = {"a": b"alpha" * 1000, "b": b"", "c": "text, not bytes"}
SHA = {
    name: hashlib.sha256(data if isinstance(data, bytes) else data.encode()).hexdigest() for name, data in DATA.items()
}


def read(data: Any) -> Any:
    return data if isinstance(data, (bytes, str)) else data.read()


def test_check_hash_passes_matching_data_on_rewound() -> None:
    items = [("a", io.BytesIO(DATA["a"])), ("b", OneWay(DATA["b"])), ("c", DATA["c"])]
    checked = list(IterableWrapper(items).check_hash(SHA))
    assert [(name, read(data)) for name, data in checked] == list(DATA.items())
    [(_, one_way)] = IterableWrapper([("a", OneWay(DATA["a"]))]).check_hash(SHA)
    assert isinstance(one_way, io.BytesIO) and one_way.read() == DATA["a"]  # kept, since it cannot seek
    [(_, not_rewound)] = IterableWrapper([("a", io.BytesIO(DATA["a"]))]).check_hash(SHA, rewind=False)
    assert not_rewound.read() == b""
    md5 = {"a": hashlib.md5(DATA["a"]).hexdigest()}
    [(_, checked_md5)] = IterableWrapper([("a", DATA["a"])]).check_hash(md5, "md5")
    assert checked_md5 == DATA["a"]


def test_check_hash_raises_naming_the_file() -> None:
    with pytest.raises(HashMismatchError, match=r"'a' is [0-9a-f]{64}, not "):
        list(IterableWrapper([("a", b"tampered")]).check_hash(SHA))
    with pytest.raises(HashMismatchError, match=r"no hash is given for 'z'"):
        list(IterableWrapper([("z", b"")]).check_hash(SHA))
    with pytest.raises(RuntimeError):  # torchdata's type for both
        list(IterableWrapper([("a", b"")]).check_hash(SHA))
    with pytest.raises(ValueError, match="hash_type"):
        IterableWrapper([]).check_hash(SHA, hash_type="crc32")
    with pytest.raises(TypeError, match="hash_dict"):
        IterableWrapper([]).check_hash([("a", "0")])  # type: ignore[arg-type]


def test_save_to_disk_writes_whole_files_and_yields_their_paths(tmp_path: Path) -> None:
    def where(name: str) -> str:
        return str(tmp_path / "out" / f"{name}.txt")

    text = list(IterableWrapper([("x", "one"), ("y", io.StringIO("two"))]).save_to_disk(filepath_fn=where))
    assert text == [where("x"), where("y")] and Path(where("y")).read_text() == "two"
    binary = list(IterableWrapper([(where("z"), b"\x00\x01")]).save_to_disk(mode="wb"))
    assert binary == [where("z")] and Path(where("z")).read_bytes() == b"\x00\x01"
    with pytest.raises(TypeError, match=r"mode 'w' must be str or a text stream, got bytes"):
        list(IterableWrapper([("q", b"bytes")]).save_to_disk(filepath_fn=where))
    assert sorted(os.listdir(tmp_path / "out")) == ["x.txt", "y.txt", "z.txt"]  # nothing partial left
    with pytest.raises(ValueError, match="mode"):
        IterableWrapper([]).save_to_disk(mode="a")


def test_a_failed_write_leaves_the_old_file_whole(tmp_path: Path) -> None:
    target = tmp_path / "kept.bin"
    target.write_bytes(b"old")

    class Broken(io.RawIOBase):
        def readable(self) -> bool:
            return True

        def readinto(self, buffer: Any) -> int:
            raise ConnectionResetError("the connection dropped mid-file")

    with pytest.raises(ConnectionResetError):
        write_atomically(str(target), Broken(), "wb")
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["kept.bin"]
    mode = target.stat().st_mode & 0o777
    write_atomically(str(target), b"new", "wb")
    assert target.read_bytes() == b"new" and target.stat().st_mode & 0o777 == mode  # a plain open's permissions


@settings(max_examples=scaled(20), deadline=None)
@given(st.lists(st.binary(max_size=64), min_size=1, max_size=6))
def test_check_hash_and_save_resume_at_every_cut(tmp_path_factory: Any, blobs: list[bytes]) -> None:
    root = tmp_path_factory.mktemp("saved")
    names = [str(root / f"{i}.bin") for i in range(len(blobs))]
    hashes = {name: hashlib.sha256(blob).hexdigest() for name, blob in zip(names, blobs, strict=True)}
    items = list(zip(names, blobs, strict=True))
    check_resume_at_every_cut(
        lambda: IterableWrapper(items).check_hash(hashes).save_to_disk(mode="wb"), seed=0, cut_epochs=(0,)
    )
    assert [Path(name).read_bytes() for name in names] == blobs
