"""``save_to_disk``: each ``(meta, data)`` item's data written to a local file (torchdata's
``Saver``), and the one way conveyor writes a file: whole or not at all.

A file is written under a temporary name in its directory, flushed to the disk
(``fsync``), then renamed over its path (:func:`write_atomically`). A reader, another
worker writing the same file, or a crash part-way therefore never leaves or sees a
partial file at the path; a crash can leave a ``*.partial`` file beside it, which nothing
reads.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from typing import Any

from conveyor.core.base import IterDataPipe
from conveyor.core.passes import PassContext, State, ThroughPass
from conveyor.pipes.io.hash_check import CHUNK_BYTES, as_bytes, new_hasher

WRITE_MODES = ("w", "wb", "wt")


def check_write_mode(mode: str, where: str) -> str:
    if mode not in WRITE_MODES:
        raise ValueError(f"{where}: mode must be one of {WRITE_MODES}, got {mode!r}")
    return mode


def _chunks(data: Any, binary: bool, where: str) -> Iterator[Any]:
    whole = (bytes, bytearray, memoryview) if binary else str
    if isinstance(data, whole):
        yield data
    elif hasattr(data, "read"):
        try:
            while chunk := data.read(CHUNK_BYTES):
                yield chunk
        finally:
            data.close()
    else:
        wanted = "bytes or a binary stream" if binary else "str or a text stream"
        mode = "wb" if binary else "w"
        raise TypeError(f"{where}: data to write in mode {mode!r} must be {wanted}, got {type(data).__name__}")


def _create_partial(directory: str, name: str) -> tuple[int, str]:
    """A new file beside the target, created by this call alone (``O_EXCL``) with the
    permissions a plain ``open`` would give (``0o666`` less the umask)."""
    while True:
        partial = os.path.join(directory, f"{name}.{os.getpid()}-{secrets.token_hex(4)}.partial")
        try:
            return os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666), partial
        except FileExistsError:
            continue  # another writer drew the same name: draw again


def write_atomically(
    path: str, data: Any, mode: str, hash_type: str | None = None, check: Callable[[str], None] | None = None
) -> str | None:
    """Write ``data`` (bytes, text or a stream, which is read to its end and closed) to
    ``path`` whole or not at all (see the module), making its directory if needed.

    With ``hash_type``, the digest of what was written is computed on the way and returned,
    and ``check(digest)`` runs before the rename: when it raises, nothing is written."""
    where = f"writing {path!r}"
    binary = "b" in mode
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    hasher = new_hasher(hash_type) if hash_type is not None else None
    descriptor, partial = _create_partial(directory, os.path.basename(path))
    try:
        with os.fdopen(descriptor, "wb" if binary else "w", encoding=None if binary else "utf-8") as out:
            for chunk in _chunks(data, binary, where):
                out.write(chunk)
                if hasher is not None:
                    hasher.update(as_bytes(chunk))
            out.flush()
            os.fsync(out.fileno())
        digest = hasher.hexdigest() if hasher is not None else None
        if check is not None and digest is not None:
            check(digest)
        os.replace(partial, path)
    except BaseException:
        if os.path.exists(partial):
            os.unlink(partial)
        raise
    return digest


class SaverPass(ThroughPass):
    def __init__(self, pipe: Saver, state: State | None, context: PassContext):
        super().__init__(pipe, state, context)
        self.items = self._save(pipe)

    def _save(self, pipe: Saver) -> Iterator[str]:
        for meta, data in self.source:
            path = os.fspath(pipe.filepath_fn(meta) if pipe.filepath_fn is not None else meta)
            write_atomically(path, data, pipe.mode)
            yield path


class Saver(IterDataPipe):
    """Writes each ``(meta, data)`` item's data to ``filepath_fn(meta)`` (``meta`` itself
    without it) and yields the path; ``mode`` is ``"w"`` (text) or ``"wb"``. Each file is
    written whole or not at all (see the module). A resume writes the files after the cut
    again (the same bytes)."""

    per_item = True
    keeps_order = True
    pass_type = SaverPass
    state_fields = {"source": dict}
    _params = ("mode", "filepath_fn")

    def __init__(self, source: IterDataPipe, mode: str = "w", filepath_fn: Callable[[Any], Any] | None = None):
        if filepath_fn is not None and not callable(filepath_fn):
            raise TypeError(f"save_to_disk: filepath_fn must be callable, got {type(filepath_fn).__name__}")
        self.source = source
        self.mode = check_write_mode(mode, "save_to_disk")
        self.filepath_fn = filepath_fn

    def __len__(self) -> int:
        return len(self.source)


@IterDataPipe.register_functional("save_to_disk", builds=Saver)
def save_to_disk(
    self: IterDataPipe[tuple[Any, Any]], mode: str = "w", filepath_fn: Callable[[Any], Any] | None = None
) -> IterDataPipe[str]:
    """Writes each ``(meta, data)`` item's data to a file and yields its path.

    Each file is written whole or not at all; a resume writes the files after the cut
    again (the same bytes).

    Args:
        mode: ``"w"`` (text) or ``"wb"``.
        filepath_fn: Called with ``meta``; returns the path to write. None: ``meta`` is.

    Returns:
        A pipe of the paths written.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> import os, tempfile
        >>> folder = tempfile.mkdtemp()
        >>> items = IterableWrapper([("a.txt", "hello")])
        >>> [os.path.basename(path) for path in items.save_to_disk(filepath_fn=lambda n: os.path.join(folder, n))]
        ['a.txt']
    """
    return Saver(self, mode, filepath_fn)
