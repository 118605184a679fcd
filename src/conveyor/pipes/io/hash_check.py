"""``check_hash``: each ``(name, data)`` item's data checked against the digest expected for
its name (torchdata's ``HashChecker``), and the hashing that ``on_disk_cache`` shares.

Data is bytes, text (hashed as UTF-8) or a binary stream, read in chunks. A stream is
handed on rewound when ``rewind`` (the default): sought back to its start, or, when it
cannot seek (a network read), replaced by an in-memory stream over the bytes read.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

from conveyor.core.base import IterDataPipe
from conveyor.core.passes import PassContext, State, ThroughPass
from conveyor.errors import HashMismatchError

T = TypeVar("T")


#: The digests ``check_hash`` and ``on_disk_cache`` compute (torchdata's two).
HASH_TYPES = ("sha256", "md5")
#: Bytes read per call when hashing a stream or a file.
CHUNK_BYTES = 1 << 20


def check_hash_type(hash_type: str, where: str) -> str:
    if hash_type not in HASH_TYPES:
        raise ValueError(f"{where}: hash_type must be one of {HASH_TYPES}, got {hash_type!r}")
    return hash_type


def new_hasher(hash_type: str) -> Any:
    """A fresh ``hashlib`` object of ``hash_type`` (one of :data:`HASH_TYPES`)."""
    return hashlib.sha256() if hash_type == "sha256" else hashlib.md5()


def file_digest(path: str, hash_type: str) -> str:
    """The hex digest of the file at ``path``."""
    hasher = new_hasher(hash_type)
    with open(path, "rb") as stream:
        while chunk := stream.read(CHUNK_BYTES):
            hasher.update(chunk)
    return hasher.hexdigest()


def as_bytes(chunk: Any) -> bytes:
    """A chunk of data as bytes: text is encoded as UTF-8."""
    return chunk.encode() if isinstance(chunk, str) else bytes(chunk)


def expected_digest(hash_dict: Mapping[str, str], name: str, where: str) -> str:
    """The digest ``hash_dict`` expects for ``name``; :class:`HashMismatchError` when none."""
    try:
        return hash_dict[name]
    except KeyError:
        raise HashMismatchError(
            f"{where}: no hash is given for {name!r}; add it to hash_dict ({len(hash_dict)} names)"
        ) from None


def mismatch(where: str, name: str, computed: str, expected: str) -> HashMismatchError:
    return HashMismatchError(
        f"{where}: the {len(computed) * 4}-bit digest of {name!r} is {computed}, not {expected} as hash_dict "
        "says: the data is corrupt or the hash is wrong. Delete the file (or correct the hash) and retry."
    )


def _digest_and_rewind(data: Any, hash_type: str, rewind: bool) -> tuple[str, Any]:
    hasher = new_hasher(hash_type)
    if isinstance(data, (str, bytes, bytearray, memoryview)):
        hasher.update(as_bytes(data))
        return hasher.hexdigest(), data
    seekable = getattr(data, "seekable", None)
    can_seek = bool(seekable()) if seekable is not None else False
    start = data.tell() if can_seek else 0
    kept: list[bytes] | None = [] if rewind and not can_seek else None
    while chunk := data.read(CHUNK_BYTES):
        piece = as_bytes(chunk)
        hasher.update(piece)
        if kept is not None:
            kept.append(piece)
    if not rewind:
        return hasher.hexdigest(), data
    if can_seek:
        data.seek(start)
        return hasher.hexdigest(), data
    close = getattr(data, "close", None)
    if close is not None:
        close()
    return hasher.hexdigest(), io.BytesIO(b"".join(kept or []))


class HashCheckerPass(ThroughPass):
    def __init__(self, pipe: HashChecker, state: State | None, context: PassContext):
        super().__init__(pipe, state, context)
        self.items = self._check(pipe)

    def _check(self, pipe: HashChecker) -> Iterator[tuple[Any, Any]]:
        where = repr(pipe)
        for name, data in self.source:
            key = os.fspath(name) if isinstance(name, os.PathLike) else name
            expected = expected_digest(pipe.hash_dict, key, where)
            computed, data = _digest_and_rewind(data, pipe.hash_type, pipe.rewind)
            if computed != expected:
                raise mismatch(where, key, computed, expected)
            yield name, data


class HashChecker(IterDataPipe):
    """Checks each ``(name, data)`` item's data against ``hash_dict[name]`` (a hex digest of
    ``hash_type``, ``"sha256"`` or ``"md5"``) and yields the item, its stream rewound when
    ``rewind`` (see the module). A digest that differs, or a name without one, raises
    :class:`~conveyor.errors.HashMismatchError` naming the file."""

    per_item = True
    keeps_order = True
    pass_type = HashCheckerPass
    state_fields = {"source": dict}
    _params = ("hash_type", "rewind")

    def __init__(
        self, source: IterDataPipe, hash_dict: Mapping[str, str], hash_type: str = "sha256", rewind: bool = True
    ):
        if not isinstance(hash_dict, Mapping):
            raise TypeError(f"check_hash: hash_dict must map names to hex digests, got {type(hash_dict).__name__}")
        self.source = source
        self.hash_dict = dict(hash_dict)
        self.hash_type = check_hash_type(hash_type, "check_hash")
        self.rewind = rewind

    def __len__(self) -> int:
        return len(self.source)


@IterDataPipe.register_functional("check_hash", builds=HashChecker)
def check_hash(
    self: IterDataPipe[tuple[str, T]], hash_dict: Mapping[str, str], hash_type: str = "sha256", rewind: bool = True
) -> IterDataPipe[tuple[str, T]]:
    """Checks each ``(name, data)`` item's data against its expected digest, and passes it on.

    A digest that differs, or a name without one, raises
    :class:`~conveyor.errors.HashMismatchError` naming the file.

    Args:
        hash_dict: Name -> the hex digest its data must have.
        hash_type: ``"sha256"`` or ``"md5"``.
        rewind: Rewind a stream after reading it, so the next step reads it from its
            start (the stream must seek).

    Returns:
        A pipe of the same items, checked.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> import hashlib
        >>> digest = hashlib.sha256(b"hello").hexdigest()
        >>> list(IterableWrapper([("a.txt", b"hello")]).check_hash({"a.txt": digest}))
        [('a.txt', b'hello')]
    """
    return HashChecker(self, hash_dict, hash_type, rewind)
