"""Files anywhere fsspec reaches (``file://``, ``memory://``, ``s3://`` with s3fs, ...):
``list_files_by_fsspec``, ``open_files_by_fsspec``, ``save_by_fsspec`` (torchdata's
``FSSpecFileLister``, ``FSSpecFileOpener``, ``FSSpecSaver``).

``storage_options`` (credentials, endpoints) go to fsspec and nowhere else: they are not
part of the pipe's description, so they never reach a state's fingerprint or a ``repr``.
A file is opened as a stream that survives transient failures: a read that fails with a
connection or server error opens the file again at the same offset and reads again, up
to :data:`READ_ATTEMPTS` times with a doubling pause, then raises naming the URL.
Listing is sorted, so every rank and worker sees the same order; a resume inside a listing
or a file works as for local files.
"""

from __future__ import annotations

import fnmatch
import io
import posixpath
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import IO, Any

from conveyor.core.base import IterDataPipe
from conveyor.core.passes import PassContext, State, ThroughPass
from conveyor.errors import MissingDependencyError
from conveyor.pipes.flatmap import Expander
from conveyor.pipes.iterable_wrapper import IterableWrapper

#: Reads (and opens) tried before a transient failure is raised, pausing
#: ``RETRY_PAUSE_S``, then twice that, and so on, between them.
READ_ATTEMPTS = 5
RETRY_PAUSE_S = 0.05
#: Failures that retrying cannot mend.
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, ValueError, TypeError)


def _fsspec() -> Any:
    try:
        import fsspec
    except ImportError:
        raise MissingDependencyError("URLs need fsspec: pip install 'conveyor[fsspec]' (and s3fs for s3://)") from None
    return fsspec


def is_url(path: Any) -> bool:
    return isinstance(path, str) and "://" in path


def transient(error: BaseException) -> bool:
    """Whether ``error`` may pass if the read is tried again (a dropped connection, a
    server error), as opposed to a missing file or a bad request."""
    return isinstance(error, (OSError, ConnectionError, TimeoutError)) and not isinstance(error, _PERMANENT)


def with_retries(action: Callable[[], Any], what: str) -> Any:
    pause = RETRY_PAUSE_S
    for attempt in range(1, READ_ATTEMPTS + 1):
        try:
            return action()
        except Exception as error:
            if not transient(error) or attempt == READ_ATTEMPTS:
                if transient(error):
                    raise OSError(f"{what} failed {READ_ATTEMPTS} times; the last error: {error!r}") from error
                raise
            time.sleep(pause)
            pause *= 2
    raise AssertionError("unreachable: the last attempt returns or raises")


class RetryingFile(io.RawIOBase):
    """A binary file at ``url`` that opens itself again at the same offset when a read
    fails transiently (see the module)."""

    def __init__(self, url: str, storage_options: dict[str, Any]) -> None:
        super().__init__()
        self.name = url
        self._url, self._options = url, storage_options
        self._offset = 0
        self._file: Any = with_retries(self._open, f"opening {url!r}")

    def _open(self) -> Any:
        opened = _fsspec().open(self._url, mode="rb", **self._options).open()
        if self._offset:
            opened.seek(self._offset)
        return opened

    def _reopen(self) -> None:
        old, self._file = self._file, None
        if old is not None:
            old.close()
        self._file = self._open()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        def attempt() -> int:
            if self._file is None:
                self._reopen()
            try:
                data = self._file.read(len(buffer))
            except Exception:
                self._file = None  # the next attempt opens it again at the offset
                raise
            buffer[: len(data)] = data
            return len(data)

        count = with_retries(attempt, f"reading {self._url!r} at byte {self._offset}")
        self._offset += count
        return count

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if self._file is None:
            self._reopen()
        self._offset = self._file.seek(offset, whence)
        return self._offset

    def tell(self) -> int:
        return self._offset

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        super().close()


def open_url(url: str, mode: str, storage_options: dict[str, Any], encoding: str | None = None) -> IO[Any]:
    """``url`` opened for reading: a buffered retrying binary stream, text over it for
    ``"r"``."""
    binary = io.BufferedReader(RetryingFile(url, storage_options), buffer_size=1 << 20)
    return binary if "b" in mode else io.TextIOWrapper(binary, encoding=encoding)


def list_url(root: str, masks: Sequence[str], recursive: bool, storage_options: dict[str, Any]) -> list[str]:
    """The URLs of the files under ``root`` (or ``root`` itself for a file) matching one
    of ``masks`` by name, sorted."""
    fs, path = _fsspec().core.url_to_fs(root, **storage_options)

    def listing() -> list[str]:
        if fs.isfile(path):
            return [path]
        if recursive:
            return list(fs.find(path))
        return [entry["name"] for entry in fs.ls(path, detail=True) if entry["type"] == "file"]

    names = with_retries(listing, f"listing {root!r}")
    wanted = [m for m in masks if m]
    kept = [n for n in names if not wanted or any(fnmatch.fnmatch(posixpath.basename(n), m) for m in wanted)]
    return sorted(fs.unstrip_protocol(n) for n in kept)


def _roots(root: Any) -> IterDataPipe:
    if isinstance(root, IterDataPipe):
        return root
    return IterableWrapper([root] if isinstance(root, str) else list(root))


class FSSpecFileLister(Expander):
    """URLs of the files under each root URL (a URL, a list, or a pipe of them) whose name
    matches one of ``masks`` (glob patterns; empty matches all), sorted; ``recursive``
    descends into directories. ``storage_options`` go to fsspec."""

    _params = ("masks", "recursive")

    def __init__(
        self,
        root: str | Sequence[str] | IterDataPipe,
        masks: str | Sequence[str] = "",
        recursive: bool = False,
        **storage_options: Any,
    ):
        super().__init__(_roots(root))
        self.masks = [masks] if isinstance(masks, str) else list(masks)
        self.recursive = recursive
        self._storage_options = storage_options

    def expand(self, item: Any) -> Iterable[str]:
        return list_url(str(item), self.masks, self.recursive, self._storage_options)


@IterDataPipe.register_functional("list_files_by_fsspec", builds=FSSpecFileLister)
def list_files_by_fsspec(
    self: IterDataPipe[str], masks: str | Sequence[str] = "", recursive: bool = False, **storage_options: Any
) -> IterDataPipe[str]:
    """Lists the files under each root URL this pipe yields, through fsspec, sorted.

    Needs ``conveyor[fsspec]`` (``conveyor[s3]`` for ``s3://``).

    Args:
        masks: Glob patterns a file's name must match one of; empty: every file.
        recursive: Descend into directories.
        **storage_options: Given to fsspec (credentials, endpoints); never shown in a
            ``repr`` or saved in a state.

    Returns:
        A pipe of file URLs.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> urls = IterableWrapper(["s3://bucket/shards/"]).list_files_by_fsspec(masks="*.tar", anon=True)
    """
    return FSSpecFileLister(self, masks, recursive, **storage_options)


class FSSpecFileOpenerPass(ThroughPass):
    def __init__(self, pipe: FSSpecFileOpener, state: State | None, context: PassContext):
        super().__init__(pipe, state, context)
        self.items = self._open(pipe)

    def _open(self, pipe: FSSpecFileOpener) -> Iterator[tuple[str, IO[Any]]]:
        for url in self.source:
            yield url, open_url(str(url), pipe.mode, pipe._storage_options, pipe.encoding)


class FSSpecFileOpener(IterDataPipe):
    """``(url, stream)`` for each URL, read through fsspec with retries (see the module);
    ``mode`` is ``"rb"`` or ``"r"`` (text). The consumer closes the stream."""

    per_item = True
    keeps_order = True
    pass_type = FSSpecFileOpenerPass
    state_fields = {"source": dict}
    _params = ("mode", "encoding")

    def __init__(self, source: IterDataPipe, mode: str = "rb", encoding: str | None = None, **storage_options: Any):
        if mode not in ("r", "rb", "b", "rt"):
            raise ValueError(f"open_files_by_fsspec: mode must be 'r' or 'rb' (read-only), got {mode!r}")
        self.source = source
        self.mode = "rb" if "b" in mode else "r"
        self.encoding = encoding
        self._storage_options = storage_options

    def __len__(self) -> int:
        return len(self.source)


@IterDataPipe.register_functional("open_files_by_fsspec", builds=FSSpecFileOpener)
def open_files_by_fsspec(
    self: IterDataPipe[str], mode: str = "rb", encoding: str | None = None, **storage_options: Any
) -> IterDataPipe[tuple[str, IO[Any]]]:
    """Opens each URL through fsspec, as ``(url, stream)``, reading with retries.

    Needs ``conveyor[fsspec]``. The consumer closes the stream.

    Args:
        mode: ``"rb"`` or ``"r"`` (text).
        encoding: The text encoding, in text mode.
        **storage_options: Given to fsspec; never shown in a ``repr`` or saved in a state.

    Returns:
        A pipe of ``(url, stream)`` pairs.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> streams = IterableWrapper(["s3://bucket/a.tar"]).open_files_by_fsspec(anon=True)
    """
    return FSSpecFileOpener(self, mode, encoding, **storage_options)


class FSSpecSaverPass(ThroughPass):
    def __init__(self, pipe: FSSpecSaver, state: State | None, context: PassContext):
        super().__init__(pipe, state, context)
        self.items = self._save(pipe)

    def _save(self, pipe: FSSpecSaver) -> Iterator[str]:
        fsspec = _fsspec()
        for meta, data in self.source:
            url = pipe.filepath_fn(meta) if pipe.filepath_fn is not None else str(meta)

            def write(url: str = url, data: Any = data) -> None:
                with fsspec.open(url, mode=pipe.mode, **pipe._storage_options) as out:
                    out.write(data)

            with_retries(write, f"writing {url!r}")
            yield url


class FSSpecSaver(IterDataPipe):
    """Writes each ``(meta, data)`` item's data to ``filepath_fn(meta)`` (``meta`` itself
    without it) through fsspec, and yields the URL. A resume writes the files after the
    cut again (the same bytes)."""

    per_item = True
    keeps_order = True
    pass_type = FSSpecSaverPass
    state_fields = {"source": dict}
    _params = ("mode", "filepath_fn")

    def __init__(
        self,
        source: IterDataPipe,
        mode: str = "w",
        filepath_fn: Callable[[Any], str] | None = None,
        **storage_options: Any,
    ):
        if mode not in ("w", "wb", "wt"):
            raise ValueError(f"save_by_fsspec: mode must be 'w' or 'wb', got {mode!r}")
        if filepath_fn is not None and not callable(filepath_fn):
            raise TypeError(f"save_by_fsspec: filepath_fn must be callable, got {type(filepath_fn).__name__}")
        self.source = source
        self.mode = mode
        self.filepath_fn = filepath_fn
        self._storage_options = storage_options

    def __len__(self) -> int:
        return len(self.source)


@IterDataPipe.register_functional("save_by_fsspec", builds=FSSpecSaver)
def save_by_fsspec(
    self: IterDataPipe[tuple[Any, Any]],
    mode: str = "w",
    filepath_fn: Callable[[Any], str] | None = None,
    **storage_options: Any,
) -> IterDataPipe[str]:
    """Writes each ``(meta, data)`` item's data through fsspec and yields where it went.

    A resume writes the files after the cut again (the same bytes). Needs
    ``conveyor[fsspec]``.

    Args:
        mode: ``"w"`` (text) or ``"wb"``.
        filepath_fn: Called with ``meta``; returns the URL to write. None: ``meta`` is.
        **storage_options: Given to fsspec; never shown in a ``repr`` or saved in a state.

    Returns:
        A pipe of the URLs written.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> saved = IterableWrapper([("memory://a.txt", "hello")]).save_by_fsspec()
    """
    return FSSpecSaver(self, mode, filepath_fn, **storage_options)
