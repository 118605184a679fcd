"""Files: ``FileLister``, ``FileOpener`` and ``LineReader``; a path with a scheme
(``s3://...``) is listed and opened through fsspec (:mod:`conveyor.pipes.io.fsspec_files`).

Listing is sorted, so every rank and worker sees the same order. Reading lines resumes
by re-opening the file being read and skipping the lines already yielded.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import IO, Any

from conveyor.core.base import IterDataPipe
from conveyor.core.passes import PassContext, State, ThroughPass
from conveyor.pipes.flatmap import Expander
from conveyor.pipes.io.fsspec_files import is_url, list_url, open_url
from conveyor.pipes.iterable_wrapper import IterableWrapper


class FileLister(Expander):
    """Paths of the files under each root (a path, a list of paths, or a pipe of paths)
    whose name matches one of ``masks`` (glob patterns; empty matches all), sorted.
    A root that is a file is listed as itself.
    """

    _params = ("masks", "recursive", "abspath")

    def __init__(
        self,
        root: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | IterDataPipe = ".",
        masks: str | Sequence[str] = "",
        recursive: bool = False,
        abspath: bool = False,
    ):
        if isinstance(root, IterDataPipe):
            source = root
        elif isinstance(root, (str, os.PathLike)):
            source = IterableWrapper([os.fspath(root)])
        else:
            source = IterableWrapper([os.fspath(r) for r in root])
        super().__init__(source)
        self.masks = [masks] if isinstance(masks, str) else list(masks)
        self.recursive = recursive
        self.abspath = abspath

    def expand(self, item: Any) -> Iterable[str]:
        root = os.fspath(item)
        if is_url(root):  # through fsspec
            return list_url(root, self.masks, self.recursive, {})
        if os.path.isfile(root):
            paths = [root]
        elif os.path.isdir(root):
            paths = sorted(self._walk(root))
        else:
            raise FileNotFoundError(f"{self!r}: no such file or directory: {root!r}")
        return [os.path.abspath(p) for p in paths] if self.abspath else paths

    def _walk(self, root: str) -> Iterator[str]:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in filenames:
                if self._matches(name):
                    yield os.path.join(dirpath, name)
            if not self.recursive:
                return

    def _matches(self, name: str) -> bool:
        masks = [m for m in self.masks if m]
        return not masks or any(fnmatch.fnmatch(name, mask) for mask in masks)


@IterDataPipe.register_functional("list_files", builds=FileLister)
def list_files(
    self: IterDataPipe[str | os.PathLike[str]],
    masks: str | Sequence[str] = "",
    recursive: bool = False,
    abspath: bool = False,
) -> IterDataPipe[str]:
    """Lists the files under each root path this pipe yields, sorted.

    A root that is a file is listed as itself; URLs go through fsspec
    (``conveyor[fsspec]``).

    Args:
        masks: Glob patterns a file's name must match one of; empty: every file.
        recursive: Descend into subdirectories.
        abspath: Yield absolute paths.

    Returns:
        A pipe of file paths.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> paths = IterableWrapper(["data/"]).list_files(masks=["*.csv", "*.tsv"], recursive=True)
    """
    return FileLister(self, masks, recursive, abspath)


class FileOpenerPass(ThroughPass):
    def __init__(self, pipe: FileOpener, state: State | None, context: PassContext):
        super().__init__(pipe, state, context)
        self.items = self._open_files(pipe.mode, pipe.encoding)

    def _open_files(self, mode: str, encoding: str | None) -> Iterator[tuple[str, IO[Any]]]:
        for path in self.source:
            if is_url(path):  # through fsspec, with retries
                yield path, open_url(path, mode, {}, encoding)
            else:
                yield path, open(path, mode, encoding=encoding)  # noqa: SIM115 - the consumer closes it


class FileOpener(IterDataPipe):
    """Yields ``(path, file)`` for each path; the consumer closes the file
    (``LineReader`` does). ``mode`` is ``"r"`` (text) or ``"b"``/``"rb"`` (binary)."""

    per_item = True
    keeps_order = True
    pass_type = FileOpenerPass
    state_fields = {"source": dict}

    _params = ("mode", "encoding")

    def __init__(self, source: IterDataPipe, mode: str = "r", encoding: str | None = None):
        if mode not in ("r", "rb", "b", "rt", "t"):
            raise ValueError(f"mode must be 'r' or 'b' (read-only), got {mode!r}")
        if "b" in mode and encoding is not None:
            raise ValueError("encoding applies to text mode only")
        self.source = source
        self.mode = "rb" if "b" in mode else "r"
        self.encoding = encoding

    def __len__(self) -> int:
        return len(self.source)


@IterDataPipe.register_functional("open_files", builds=FileOpener)
def open_files(
    self: IterDataPipe[str | os.PathLike[str]], mode: str = "r", encoding: str | None = None
) -> IterDataPipe[tuple[str, IO[Any]]]:
    """Opens each path, as ``(path, file)``; the consumer closes the file (``readlines`` does).

    Args:
        mode: ``"r"`` (text) or ``"b"``/``"rb"`` (binary).
        encoding: The text encoding; None: the platform's.

    Returns:
        A pipe of ``(path, open file)`` pairs.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> files = IterableWrapper(["data/"]).list_files(masks="*.tar").open_files(mode="b")
    """
    return FileOpener(self, mode, encoding)


class LineReader(Expander):
    """Yields ``(path, line)`` for every line of every ``(path, file)`` item (just the line
    when ``return_path`` is false), closing each file when it has been read."""

    _params = ("skip_lines", "strip_newline", "return_path")

    def __init__(
        self,
        source: IterDataPipe,
        skip_lines: int = 0,
        strip_newline: bool = True,
        return_path: bool = True,
    ):
        super().__init__(source)
        self.skip_lines = skip_lines
        self.strip_newline = strip_newline
        self.return_path = return_path

    def expand(self, item: Any) -> Iterable[Any]:
        path, stream = item
        return self._lines(path, stream)

    def _lines(self, path: str, stream: IO[Any]) -> Iterator[Any]:
        with stream:
            for number, line in enumerate(stream):
                if number < self.skip_lines:
                    continue
                if self.strip_newline:
                    line = line.rstrip(b"\r\n" if isinstance(line, bytes) else "\r\n")
                yield (path, line) if self.return_path else line


@IterDataPipe.register_functional("readlines", builds=LineReader)
def readlines(
    self: IterDataPipe[tuple[str, IO[Any]]], skip_lines: int = 0, strip_newline: bool = True, return_path: bool = True
) -> IterDataPipe[Any]:
    """Yields every line of every ``(path, file)`` item, closing each file once read.

    Args:
        skip_lines: Lines to leave out at the top of each file.
        strip_newline: Remove each line's line ending.
        return_path: Yield ``(path, line)``; False: the line alone.

    Returns:
        A pipe of lines, or of ``(path, line)`` pairs.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> import io
        >>> list(IterableWrapper([("a.txt", io.StringIO("x\\ny\\n"))]).readlines())
        [('a.txt', 'x'), ('a.txt', 'y')]
    """
    return LineReader(self, skip_lines, strip_newline, return_path)
