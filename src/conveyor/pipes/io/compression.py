"""Compressed files, with the standard library (and ``zstandard`` for zstd):
``decompress`` (and ``extract``, its old name), ``load_from_xz`` and ``load_from_bz2``,
under torchdata's names and arguments.

They read ``(path, stream)`` items, as ``FileOpener(mode="b")`` yields them, and yield
``(path, decompressing stream)``, read lazily; a tar or zip comes out as a ``tarfile`` or
``zipfile`` object (:mod:`conveyor.pipes.io.archives` reads their members). A pass
resumes by passing over the files already yielded.
"""

from __future__ import annotations

import enum
import pathlib
from collections.abc import Iterator
from typing import IO, Any

from conveyor.core.base import IterDataPipe
from conveyor.core.passes import PassContext, State, ThroughPass
from conveyor.errors import MissingDependencyError


class CompressionType(enum.Enum):
    """What ``decompress`` handles (torchdata's values), plus ``zstd`` with ``zstandard``."""

    GZIP = "gzip"
    LZMA = "lzma"
    TAR = "tar"
    ZIP = "zip"
    BZIP2 = "bz2"
    ZSTD = "zstd"


_SUFFIXES = {
    ".gz": CompressionType.GZIP,
    ".tgz": CompressionType.TAR,
    ".xz": CompressionType.LZMA,
    ".lzma": CompressionType.LZMA,
    ".bz2": CompressionType.BZIP2,
    ".zip": CompressionType.ZIP,
    ".tar": CompressionType.TAR,
    ".zst": CompressionType.ZSTD,
    ".zstd": CompressionType.ZSTD,
}
_MAGIC = [
    (b"\x1f\x8b", CompressionType.GZIP),
    (b"\xfd7zXZ\x00", CompressionType.LZMA),
    (b"BZh", CompressionType.BZIP2),
    (b"PK\x03\x04", CompressionType.ZIP),
    (b"\x28\xb5\x2f\xfd", CompressionType.ZSTD),
]


def _zstd_reader(stream: IO[bytes]) -> IO[bytes]:
    try:
        import zstandard
    except ImportError:
        raise MissingDependencyError(
            "decompress: zstd needs the zstandard package: pip install 'conveyor[zstd]'"
        ) from None
    return zstandard.ZstdDecompressor().stream_reader(stream, closefd=True)


def _decompressed(kind: CompressionType, stream: IO[bytes]) -> Any:
    # Each format's module is imported when first used: together they are ~1.7 MiB in
    # every process that imports conveyor, and most pipelines read none of them.
    if kind is CompressionType.GZIP:
        import gzip

        return gzip.GzipFile(fileobj=stream)
    if kind is CompressionType.LZMA:
        import lzma

        return lzma.LZMAFile(stream)
    if kind is CompressionType.BZIP2:
        import bz2

        return bz2.BZ2File(stream)
    if kind is CompressionType.TAR:
        import tarfile

        return tarfile.open(fileobj=stream, mode="r:*")
    if kind is CompressionType.ZIP:
        import zipfile

        return zipfile.ZipFile(stream)
    return _zstd_reader(stream)


class DecompressorPass(ThroughPass):
    def __init__(self, pipe: Decompressor, state: State | None, context: PassContext):
        super().__init__(pipe, state, context)
        self.items = self._decompress(pipe)

    def _decompress(self, pipe: Decompressor) -> Iterator[tuple[str, Any]]:
        for path, stream in self.source:
            yield pipe.output_path(path), _decompressed(pipe.detect(path, stream), stream)


class Decompressor(IterDataPipe):
    """``(path, decompressed stream)`` for each ``(path, stream)``: gzip, xz/lzma, bz2,
    zstd (with ``zstandard``) as a stream, tar and zip as ``tarfile``/``zipfile`` objects
    (torchdata's). ``file_type`` (a name or :class:`CompressionType`) says which; without
    it, the file's suffix does, else its first bytes (when the stream can peek or seek)."""

    per_item = True
    keeps_order = True
    pass_type = DecompressorPass
    state_fields = {"source": dict}
    _params = ("file_type",)
    types = CompressionType

    def __init__(self, source: IterDataPipe, file_type: str | enum.Enum | None = None):
        names = [t.value for t in CompressionType]
        if isinstance(file_type, str):
            try:
                file_type = CompressionType(file_type.lower())
            except ValueError:
                raise ValueError(f"decompress: file_type must be one of {names}, got {file_type!r}") from None
        elif file_type is not None and not isinstance(file_type, CompressionType):
            raise TypeError(f"decompress: file_type must be a CompressionType or one of {names}, got {file_type!r}")
        self.source = source
        self.file_type = file_type

    def detect(self, path: str, stream: IO[bytes]) -> CompressionType:
        if self.file_type is not None:
            return self.file_type
        suffixes = pathlib.PurePath(path).suffixes
        if len(suffixes) >= 2 and suffixes[-2] == ".tar":
            return CompressionType.TAR
        if suffixes and suffixes[-1].lower() in _SUFFIXES:
            return _SUFFIXES[suffixes[-1].lower()]
        head = _peek(stream, 6)
        for magic, kind in _MAGIC:
            if head.startswith(magic):
                return kind
        raise ValueError(
            f"decompress: cannot tell how {path!r} is compressed (suffix {''.join(suffixes) or 'none'}, "
            f"first bytes {head!r}); give file_type="
        )

    def output_path(self, path: str) -> str:
        return path

    def __len__(self) -> int:
        return len(self.source)


@IterDataPipe.register_functional("decompress", builds=Decompressor)
def decompress(
    self: IterDataPipe[tuple[str, Any]], file_type: str | enum.Enum | None = None
) -> IterDataPipe[tuple[str, Any]]:
    """Decompresses each ``(path, stream)`` item: gzip, xz/lzma, bz2, zstd, tar, zip.

    A compressed file becomes a stream (zstd needs ``zstandard``), a tar or zip archive a
    ``tarfile`` or ``zipfile`` object, as torchdata's ``decompress`` gives them.

    Args:
        file_type: Which format (a name such as ``"gzip"``, or a ``CompressionType``);
            None: the file's suffix says, else its first bytes.

    Returns:
        A pipe of ``(path, decompressed)`` pairs, the paths as they came.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> import gzip, io
        >>> item = ("a.txt.gz", io.BytesIO(gzip.compress(b"hello")))
        >>> [(path, stream.read()) for path, stream in IterableWrapper([item]).decompress()]
        [('a.txt.gz', b'hello')]
    """
    return Decompressor(self, file_type)


def _peek(stream: IO[bytes], size: int) -> bytes:
    peek = getattr(stream, "peek", None)
    if peek is not None:
        return bytes(peek(size)[:size])
    if stream.seekable():
        at = stream.tell()
        head = stream.read(size)
        stream.seek(at)
        return head
    return b""


@IterDataPipe.register_functional("extract")
def extract(
    self: IterDataPipe[tuple[str, Any]], file_type: str | enum.Enum | None = None
) -> IterDataPipe[tuple[str, Any]]:
    """Decompresses each ``(path, stream)`` item: torchdata's old name for ``decompress``.

    Args:
        file_type: Which format (a name such as ``"gzip"``, or a ``CompressionType``);
            None: the file's suffix says, else its first bytes.

    Returns:
        A pipe of ``(path, decompressed)`` pairs, as ``decompress`` gives them.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> import bz2, io
        >>> item = ("a.txt.bz2", io.BytesIO(bz2.compress(b"hello")))
        >>> [(path, stream.read()) for path, stream in IterableWrapper([item]).extract()]
        [('a.txt.bz2', b'hello')]
    """
    return Decompressor(self, file_type)


class _SingleCompressed(Decompressor):
    """A loader of one compression (``load_from_xz``, ``load_from_bz2``): its output path
    drops the suffix, as torchdata's does."""

    _kind: CompressionType
    _suffix: str

    def __init__(self, source: IterDataPipe, length: int = -1):
        super().__init__(source, self._kind)
        self.length = length

    def output_path(self, path: str) -> str:
        return path[: -len(self._suffix)] if path.endswith(self._suffix) else path

    def __len__(self) -> int:
        if self.length >= 0:
            return self.length
        return len(self.source)


class XzFileLoader(_SingleCompressed):
    """``(path without .xz, decompressing stream)`` for each xz/lzma file."""

    _kind = CompressionType.LZMA
    _suffix = ".xz"
    _params = ("length",)


@IterDataPipe.register_functional("load_from_xz", builds=XzFileLoader)
def load_from_xz(self: IterDataPipe[tuple[str, Any]], length: int = -1) -> IterDataPipe[tuple[str, Any]]:
    """Decompresses each xz/lzma file, as ``(path without .xz, stream)``.

    Args:
        length: How many files, when known, for ``len()``; ``-1``: the input's length.

    Returns:
        A pipe of ``(path, decompressing stream)`` pairs.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> import io, lzma
        >>> item = ("a.txt.xz", io.BytesIO(lzma.compress(b"hello")))
        >>> [(path, stream.read()) for path, stream in IterableWrapper([item]).load_from_xz()]
        [('a.txt', b'hello')]
    """
    return XzFileLoader(self, length)


class Bz2FileLoader(_SingleCompressed):
    """``(path without .bz2, decompressing stream)`` for each bz2 file."""

    _kind = CompressionType.BZIP2
    _suffix = ".bz2"
    _params = ("length",)


@IterDataPipe.register_functional("load_from_bz2", builds=Bz2FileLoader)
def load_from_bz2(self: IterDataPipe[tuple[str, Any]], length: int = -1) -> IterDataPipe[tuple[str, Any]]:
    """Decompresses each bz2 file, as ``(path without .bz2, stream)``.

    Args:
        length: How many files, when known, for ``len()``; ``-1``: the input's length.

    Returns:
        A pipe of ``(path, decompressing stream)`` pairs.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> import bz2, io
        >>> item = ("a.txt.bz2", io.BytesIO(bz2.compress(b"hello")))
        >>> [(path, stream.read()) for path, stream in IterableWrapper([item]).load_from_bz2()]
        [('a.txt', b'hello')]
    """
    return Bz2FileLoader(self, length)
