"""``on_disk_cache`` / ``end_caching``: the files a few steps make from each item (a
download, a decompression, an archive's extraction), kept on disk and reused on later
epochs and runs (torchdata's ``OnDiskCacheHolder`` and ``EndOnDiskCacheHolder``)::

    urls.on_disk_cache(filepath_fn=local_path, hash_dict=digests) \\
        .open_files_by_fsspec().end_caching(mode="wb", same_filepath_fn=True)

``on_disk_cache(filepath_fn)`` names the file an item stands for; the steps after it, up
to ``end_caching``, turn the item into ``(metadata, data)`` pairs, each saved to a file.
``end_caching`` yields the paths of each item's files, in the items' order: those on disk
when the file is there (whole, and matching ``hash_dict`` and ``extra_check_fn`` when
given), else those the steps make for it now. An item that becomes one file of its own
name is cached as that file; one that becomes other files (an archive's members) is
cached as the list of them, in ``<file>.torchdata_list`` (torchdata's format, so its
caches are read too), written once all of them are.

How it differs from torchdata, on purpose:

- **The order is the items' order**, cached or not, so an epoch is the same whether the
  cache was cold or warm, and a state resumes in either. torchdata yields newly made files
  first, then cached ones.
- **Files are written whole or not at all** (:func:`~conveyor.pipes.io.saver.write_atomically`):
  a crash leaves no partial file that a later run would take for a cached one.
- **One process makes a file, the others wait** (:mod:`~conveyor.pipes.io.cache_lock`): a
  lock the kernel drops when its holder dies, not a promise file left behind by a crash.
  ``timeout`` bounds the wait.

The steps run once per item that is not cached, in a pass of their own whose only input
is that item, so they must treat items one by one: ``end_caching`` refuses steps that
keep items between items (``batch``, ``shuffle``), draw random numbers, split items
between workers, or read from anything but ``on_disk_cache``. The pass's state is its
input's, before the item whose files it is yielding, and how many it has yielded (as any
expanding op): a resume finds that item's files made, and yields the rest of them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, TypeVar

from conveyor.core.base import DataPipe, IterDataPipe
from conveyor.core.op_roles import RandomOp, ShardingPoint
from conveyor.core.passes import Pass, PassContext, Position, State
from conveyor.errors import GraphError
from conveyor.pipes.flatmap import Expander, ExpanderPass
from conveyor.pipes.io.cache_lock import making
from conveyor.pipes.io.hash_check import check_hash_type, expected_digest, file_digest, mismatch
from conveyor.pipes.io.saver import check_write_mode, write_atomically

T = TypeVar("T")


#: Beside a file that stands for several: the list of their paths, one per line.
LIST_SUFFIX = ".torchdata_list"


class HeldItemPass(Pass):
    """The one item ``end_caching`` hands to its steps, standing in for ``on_disk_cache``."""

    def __init__(self, pipe: OnDiskCacheHolder, item: Any, position: Position | None, context: PassContext):
        super().__init__(pipe, context)
        self._position = position
        self.items = iter((item,))

    def state(self) -> State:
        return {}

    def position(self) -> Position | None:
        return self._position


class OnDiskCacheHolder(IterDataPipe):
    """Where caching begins: ``filepath_fn(item)`` (the item itself without it) is the file
    the item stands for. A file on disk counts as cached when it matches
    ``hash_dict[path]`` (a hex digest of ``hash_type``, ``"sha256"`` or ``"md5"``; a path
    missing from a given ``hash_dict`` is never cached) and ``extra_check_fn(path)`` is
    true, each when given. Iterate the ``end_caching()`` after it, never this pipe itself;
    see the module."""

    per_item = True
    keeps_order = True
    state_fields: ClassVar[Mapping[str, Any]] = {}
    _params = ("filepath_fn", "hash_type", "extra_check_fn")

    def __init__(
        self,
        source: IterDataPipe,
        filepath_fn: Callable[[Any], Any] | None = None,
        hash_dict: Mapping[str, str] | None = None,
        hash_type: str = "sha256",
        extra_check_fn: Callable[[str], bool] | None = None,
    ):
        for name, fn in (("filepath_fn", filepath_fn), ("extra_check_fn", extra_check_fn)):
            if fn is not None and not callable(fn):
                raise TypeError(f"on_disk_cache: {name} must be callable, got {type(fn).__name__}")
        if hash_dict is not None and not isinstance(hash_dict, Mapping):
            raise TypeError(f"on_disk_cache: hash_dict must map paths to hex digests, got {type(hash_dict).__name__}")
        self.source = source
        self.filepath_fn = filepath_fn
        self.hash_dict = dict(hash_dict) if hash_dict is not None else None
        self.hash_type = check_hash_type(hash_type, "on_disk_cache")
        self.extra_check_fn = extra_check_fn

    def _open(self, state: State | None, context: PassContext) -> Pass:
        held = context.shared.get((id(self), context.rounds))
        if held is None:
            raise GraphError(
                f"{self!r} is read only through the end_caching() after it: call .end_caching(...) on the last "
                "step that makes the files, and iterate that"
            )
        return held

    def _iterates_itself(self) -> bool:
        return False  # an op: its pass is the HeldItemPass that end_caching hands its steps

    def first_path(self, item: Any) -> str:
        """The file ``item`` stands for."""
        path = self.filepath_fn(item) if self.filepath_fn is not None else item
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"{self!r}: a file path must be a str, got {type(path).__name__} for {item!r:.200}")
        return os.fspath(path)

    def cached_files(self, first: str) -> list[str] | None:
        """The files cached for the item that stands for ``first``, or None when they must
        be made (again)."""
        listing = first + LIST_SUFFIX
        if os.path.exists(listing):
            with open(listing, encoding="utf-8") as lines:
                paths = [line.rstrip("\n") for line in lines if line.strip()]
            return paths if all(os.path.exists(path) for path in paths) else None
        if not os.path.exists(first):
            return None
        if self.hash_dict is not None:
            expected = self.hash_dict.get(first)
            if expected is None or file_digest(first, self.hash_type) != expected:
                return None
        if self.extra_check_fn is not None and not self.extra_check_fn(first):
            return None
        return [first]


@IterDataPipe.register_functional("on_disk_cache", builds=OnDiskCacheHolder)
def on_disk_cache(
    self: IterDataPipe[T],
    filepath_fn: Callable[[T], Any] | None = None,
    hash_dict: Mapping[str, str] | None = None,
    hash_type: str = "sha256",
    extra_check_fn: Callable[[str], bool] | None = None,
) -> IterDataPipe[T]:
    """Marks where caching on disk begins: each item stands for a file, made once.

    The steps between it and ``end_caching`` (a download, a decompression) run only for
    items whose file is not on disk yet; iterate the ``end_caching()`` pipe, never this
    one.

    Args:
        filepath_fn: Called with each item; returns the path of its file. None: the item
            is the path.
        hash_dict: Path -> the hex digest a cached file must have; a path missing from
            it is never taken as cached.
        hash_type: ``"sha256"`` or ``"md5"``.
        extra_check_fn: Called with a cached file's path; it counts only when true.

    Returns:
        The pipe to build the caching steps on, ended by ``end_caching``.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> cached = (
        ...     IterableWrapper(["https://example.com/a.csv"])
        ...     .on_disk_cache(filepath_fn=lambda url: "/tmp/cache/" + url.rsplit("/", 1)[1])
        ...     .open_files_by_fsspec()
        ...     .end_caching(mode="wb", same_filepath_fn=True)
        ... )
    """
    return OnDiskCacheHolder(self, filepath_fn, hash_dict, hash_type, extra_check_fn)


class EndCachingPass(ExpanderPass):
    """Expands each item of ``on_disk_cache``'s input into its files' paths."""

    pipe: EndOnDiskCacheHolder

    def parts(self, item: Any, skip: int) -> Iterable[str]:
        return self._files(item)[skip:]

    def _files(self, item: Any) -> list[str]:
        pipe = self.pipe
        holder = pipe.holder
        first = holder.first_path(item)
        cached = holder.cached_files(first)
        if cached is not None:
            return cached
        with making(first, pipe.timeout, repr(pipe)):
            cached = holder.cached_files(first)  # made by another process while we waited
            return cached if cached is not None else self._make(item, first)

    def _make(self, item: Any, first: str) -> list[str]:
        pipe, context = self.pipe, self.context
        held = HeldItemPass(pipe.holder, item, self.source.position(), context)
        steps_context = PassContext(
            context.rounds, context.meters, context.retired, context.stats, {(id(pipe.holder), context.rounds): held}
        )
        steps = steps_context.open(pipe.steps, None)
        try:
            saved = [pipe.save(output) for output in steps.items]
        finally:
            steps.close()
            context.retire(steps)
        if saved and saved != [first]:
            write_atomically(first + LIST_SUFFIX, "".join(f"{path}\n" for path in saved), "w")
        return saved


class EndOnDiskCacheHolder(Expander):
    """Where caching ends: saves each ``(metadata, data)`` pair the steps since the last
    ``on_disk_cache`` make to ``filepath_fn(metadata)`` (``metadata`` itself without it; the
    ``on_disk_cache``'s ``filepath_fn`` with ``same_filepath_fn=True``), in ``mode``
    (``"wb"``, or ``"w"`` for text), and yields each item's files' paths (see the module).

    ``data`` is bytes or text, or a stream that is read to its end and closed; with
    ``skip_read=True`` it must already be bytes or text. Every saved file is checked
    against ``on_disk_cache``'s ``hash_dict`` when one is given; a mismatch raises
    :class:`~conveyor.errors.HashMismatchError` and saves nothing. ``timeout`` (seconds)
    bounds the wait for a file that another process is making
    (:class:`~conveyor.errors.CacheTimeoutError`).
    """

    pass_type = EndCachingPass
    _params = ("mode", "filepath_fn", "skip_read", "timeout", "steps_description")

    def __init__(
        self,
        datapipe: IterDataPipe,
        mode: str = "wb",
        filepath_fn: Callable[[Any], Any] | None = None,
        *,
        same_filepath_fn: bool = False,
        skip_read: bool = False,
        timeout: float = 300,
    ):
        if filepath_fn is not None and same_filepath_fn:
            raise ValueError("end_caching: filepath_fn and same_filepath_fn=True exclude each other")
        if filepath_fn is not None and not callable(filepath_fn):
            raise TypeError(f"end_caching: filepath_fn must be callable, got {type(filepath_fn).__name__}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError(f"end_caching: timeout must be a positive number of seconds, got {timeout!r}")
        holder, steps = _caching_steps(datapipe)
        super().__init__(holder.source)
        self.mode = check_write_mode(mode, "end_caching")
        self.filepath_fn = holder.filepath_fn if same_filepath_fn else filepath_fn
        self.skip_read = skip_read
        self.timeout = float(timeout)
        self._holder = holder
        self._steps = datapipe
        self.steps_description = " <- ".join(type(step).__name__ for step in steps) or "(none)"

    @property
    def holder(self) -> OnDiskCacheHolder:
        return self._holder

    @property
    def steps(self) -> IterDataPipe:
        """The last step before ``end_caching`` (``on_disk_cache`` itself when none)."""
        return self._steps

    def save(self, output: Any) -> str:
        """Save one ``(metadata, data)`` pair of the steps; its file's path."""
        where = repr(self)
        if not (isinstance(output, (tuple, list)) and len(output) == 2):
            raise TypeError(f"{where}: the steps before it must make (metadata, data) pairs, got {output!r:.200}")
        meta, data = output
        path = self.filepath_fn(meta) if self.filepath_fn is not None else meta
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"{where}: a file path must be a str, got {type(path).__name__} for {meta!r:.200}")
        path = os.fspath(path)
        if self.skip_read and hasattr(data, "read"):
            raise TypeError(f"{where}: skip_read=True, but the data for {path!r} is a stream: drop skip_read")
        hash_dict = self._holder.hash_dict
        if hash_dict is None:
            write_atomically(path, data, self.mode)
            return path
        expected = expected_digest(hash_dict, path, where)

        def check(digest: str) -> None:
            if digest != expected:
                raise mismatch(where, path, digest, expected)

        write_atomically(path, data, self.mode, self._holder.hash_type, check)
        return path


@IterDataPipe.register_functional("end_caching", builds=EndOnDiskCacheHolder)
def end_caching(
    self: IterDataPipe[Any],
    mode: str = "wb",
    filepath_fn: Callable[[Any], Any] | None = None,
    *,
    same_filepath_fn: bool = False,
    skip_read: bool = False,
    timeout: float = 300,
) -> IterDataPipe[Any]:
    """Marks where caching on disk ends: saves what the steps since ``on_disk_cache`` make.

    The steps turn each item into ``(metadata, data)`` pairs; each is saved whole to a
    file. It yields each item's files' paths, in the items' order, whether cached or
    made now. One process makes a file while the others wait.

    Args:
        mode: ``"wb"``, or ``"w"`` for text.
        filepath_fn: Called with ``metadata``; returns the path to save to. None:
            ``metadata`` is.
        same_filepath_fn: Use ``on_disk_cache``'s ``filepath_fn`` instead.
        skip_read: The data is bytes or text already (not a stream to read).
        timeout: Seconds to wait for a file another process is making, before
            :class:`~conveyor.errors.CacheTimeoutError`.

    Returns:
        A pipe of each item's cached path (a list of paths for an item that became
        several files).

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> cached = (
        ...     IterableWrapper(["https://example.com/a.csv"])
        ...     .on_disk_cache(filepath_fn=lambda url: "/tmp/cache/" + url.rsplit("/", 1)[1])
        ...     .open_files_by_fsspec()
        ...     .end_caching(mode="wb", same_filepath_fn=True)
        ... )
    """
    return EndOnDiskCacheHolder(
        self, mode, filepath_fn, same_filepath_fn=same_filepath_fn, skip_read=skip_read, timeout=timeout
    )


def _unfit_step(step: DataPipe) -> str | None:
    """Why ``step`` cannot run between ``on_disk_cache`` and ``end_caching``, if it cannot."""
    if isinstance(step, RandomOp):
        return "draws random numbers"
    if isinstance(step, ShardingPoint):
        return "splits items between workers (shard before on_disk_cache)"
    if isinstance(step, IterDataPipe) and not step._iterates_itself() and not step.per_item:
        return "keeps items between items (it may only treat each item on its own)"
    return None


def _caching_steps(end: IterDataPipe) -> tuple[OnDiskCacheHolder, list[DataPipe]]:
    """The ``on_disk_cache`` that ``end`` reads from, and the steps between them (from
    ``end`` back); :class:`GraphError` when the steps cannot run one item at a time."""
    holders: list[OnDiskCacheHolder] = []
    steps: list[Any] = []
    seen: set[int] = set()
    waiting: list[Any] = [end]
    while waiting:
        step = waiting.pop()
        if id(step) in seen:
            continue
        seen.add(id(step))
        if isinstance(step, OnDiskCacheHolder):
            holders.append(step)
        else:
            steps.append(step)
            waiting.extend(reversed(step.inputs()) if isinstance(step, DataPipe) else ())
    if len(holders) != 1:
        found = "no on_disk_cache" if not holders else f"{len(holders)} on_disk_cache pipes"
        raise GraphError(f"end_caching: the pipe it ends must read from one on_disk_cache(...), found {found}")
    for step in steps:
        if not isinstance(step, DataPipe):
            raise GraphError(f"end_caching: the steps before it must be conveyor pipes, got {type(step).__name__}")
        if isinstance(step, IterDataPipe) and not step.inputs():  # a map-style pipe is read by index: fine
            raise GraphError(
                f"end_caching: {step!r} is a source; the steps between on_disk_cache and end_caching may read "
                "only the items of on_disk_cache"
            )
        why = _unfit_step(step)
        if why is not None:
            raise GraphError(f"end_caching: {step!r} cannot run between on_disk_cache and end_caching: it {why}")
    return holders[0], steps
