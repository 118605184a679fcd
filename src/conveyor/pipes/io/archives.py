"""Archives, with the standard library: ``load_from_tar`` and ``load_from_zip``, under
torchdata's names and arguments (compressed files are :mod:`conveyor.pipes.io.compression`'s).

They read ``(path, stream)`` items, as ``FileOpener(mode="b")`` yields them. An archive's
members come out as ``(archive path/member name, stream)``, each member read whole into
an in-memory stream (``io.BytesIO``): it stays valid after the archive moves on (a
streaming tar cannot go back), pickles from a worker to the main process, and needs no
closing.

An archive resumes inside itself: the state is the input's state before the archive and
the members yielded; a resume opens the archive again and passes over those members
without reading their data (a tar's headers are read, a zip's directory is looked up).
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Iterator
from typing import IO, Any

from conveyor.core.base import IterDataPipe
from conveyor.pipes.flatmap import Expander


def _member_path(archive: str, name: str) -> str:
    """``archive/name``, normalised as torchdata does; a URL keeps its ``scheme://``."""
    scheme, separator, path = archive.rpartition("://")
    return scheme + separator + os.path.normpath(os.path.join(path, name))


def _close(stream: Any) -> None:
    close = getattr(stream, "close", None)
    if close is not None:
        close()


class _ArchiveLoader(Expander):
    """An archive's members as parts: :meth:`expand_from` passes over the first ``skip``
    without extracting them; ``length`` is the number of members yielded in all, when
    known (``-1``: not known)."""

    def __init__(self, source: IterDataPipe, length: int = -1):
        super().__init__(source)
        self.length = length

    def expand(self, item: Any) -> Iterable[tuple[str, IO[bytes]]]:
        return self.expand_from(item, 0)

    def __len__(self) -> int:
        if self.length < 0:
            raise self._no_length("the number of members is not known in advance (give length=)")
        return self.length


class TarArchiveLoader(_ArchiveLoader):
    """``(archive path/member name, stream)`` for every regular file in each tar archive
    (``mode``: ``tarfile.open``'s, ``"r:*"`` detects the compression; ``"r|*"`` streams).
    ``length`` is the number of members the loader yields in all, when known (``-1``)."""

    _params = ("mode", "length")

    def __init__(self, source: IterDataPipe, mode: str = "r:*", length: int = -1):
        if not isinstance(mode, str) or not mode.startswith("r"):
            raise ValueError(
                f"load_from_tar: mode must be a read mode of tarfile.open ('r:*', 'r|*', ...), got {mode!r}"
            )
        super().__init__(source, length)
        self.mode = mode

    def expand_from(self, item: Any, skip: int) -> Iterator[tuple[str, IO[bytes]]]:
        import tarfile

        path, stream = item
        try:
            # The user's mode string: tarfile checks it (its stubs take literal modes only).
            with tarfile.open(fileobj=stream, mode=self.mode) as archive:  # type: ignore[call-overload]
                seen = 0
                for member in archive:
                    if not member.isfile():
                        continue
                    seen += 1
                    if seen <= skip:
                        continue  # its data is passed over, not read
                    extracted = archive.extractfile(member)
                    assert extracted is not None  # a regular file
                    yield _member_path(path, member.name), io.BytesIO(extracted.read())
        except tarfile.TarError as error:
            raise tarfile.TarError(f"load_from_tar: {path!r} is not a readable tar archive ({error})") from error
        finally:
            _close(stream)


@IterDataPipe.register_functional("load_from_tar", builds=TarArchiveLoader)
def load_from_tar(
    self: IterDataPipe[tuple[str, Any]], mode: str = "r:*", length: int = -1
) -> IterDataPipe[tuple[str, Any]]:
    """Yields every regular file in each tar archive, as ``(archive path/member name, stream)``.

    Args:
        mode: As ``tarfile.open``'s: ``"r:*"`` detects the compression, ``"r|*"`` reads
            the archive as a stream (no seeking).
        length: How many members in all, when known, for ``len()``; ``-1``: unknown.

    Returns:
        A pipe of ``(name, binary stream)`` pairs, one per member; the consumer reads
        each stream before the next member.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> members = IterableWrapper(["shards/"]).list_files(masks="*.tar").open_files(mode="b").load_from_tar()
    """
    return TarArchiveLoader(self, mode, length)


class ZipArchiveLoader(_ArchiveLoader):
    """``(archive path/member name, stream)`` for every file in each zip archive (the
    input's streams must be seekable, as files are)."""

    _params = ("length",)

    def expand_from(self, item: Any, skip: int) -> Iterator[tuple[str, IO[bytes]]]:
        import zipfile

        path, stream = item
        try:
            with zipfile.ZipFile(stream) as archive:
                members = [info for info in archive.infolist() if not info.is_dir()]
                for info in members[skip:]:
                    yield _member_path(path, info.filename), io.BytesIO(archive.read(info))
        except zipfile.BadZipFile as error:
            raise zipfile.BadZipFile(f"load_from_zip: {path!r} is not a readable zip archive ({error})") from error
        finally:
            _close(stream)


@IterDataPipe.register_functional("load_from_zip", builds=ZipArchiveLoader)
def load_from_zip(self: IterDataPipe[tuple[str, Any]], length: int = -1) -> IterDataPipe[tuple[str, Any]]:
    """Yields every file in each zip archive, as ``(archive path/member name, stream)``.

    The input's streams must be seekable, as files are.

    Args:
        length: How many members in all, when known, for ``len()``; ``-1``: unknown.

    Returns:
        A pipe of ``(name, binary stream)`` pairs, one per member.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> members = IterableWrapper(["data/"]).list_files(masks="*.zip").open_files(mode="b").load_from_zip()
    """
    return ZipArchiveLoader(self, length)
