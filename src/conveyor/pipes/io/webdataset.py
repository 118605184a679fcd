"""WebDataset: ``webdataset()`` groups a tar's members into samples, ``shard_expand()``
turns ``"shard-{000000..000099}.tar"`` into shard names (torchdata's ops and output).

A member ``<prefix>.<suffix>`` belongs to the sample ``<prefix>``: the suffix starts at
the first dot of the file's own name, so dots in directory names stay in the prefix
(``a.tar/dir.v2/img001.seg.png`` is sample ``a.tar/dir.v2/img001``, field
``.seg.png``), as the webdataset package names them. Consecutive members with one prefix
make one sample, ``{"__key__": prefix, suffix: data, ...}``; members without a suffix
are skipped.

A sample is known to be whole when the next one's first member arrives, so the op's state
is its input's state from before that member (the first member of the sample not yet
yielded); a resume reads it again. ``shard_expand`` is per item.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

from conveyor.core.base import IterDataPipe
from conveyor.core.passes import Pass, PassContext, Position, State
from conveyor.pipes.flatmap import Expander

_SUFFIX = re.compile(r"^(.*?)(\.[^/]*)$")


_END: Any = object()  # the end of an input: compared by identity only


def split_member_path(path: str) -> tuple[str, str]:
    """``(sample prefix, field suffix)`` of a member's path (backslashes read as slashes)."""
    path = path.replace("\\", "/")
    match = _SUFFIX.match(path)
    return (match.group(1), match.group(2)) if match else (path, "")


class WebDatasetPass(Pass):
    def __init__(self, pipe: WebDataset, state: State | None, context: PassContext):
        super().__init__(pipe, context)
        self.source = context.open(pipe.source, state["source"] if state is not None else None)
        self._pending = self.source.state()  # before the first member of the sample not yet yielded
        self._position: Position | None = None
        self.count = 0
        self.items = self._group()

    def _group(self) -> Iterator[dict[str, Any]]:
        source, members = self.source, self.source.items
        sample: dict[str, Any] = {}
        first: Position | None = None
        while True:
            before = source.state()
            member = next(members, _END)
            if member is _END:
                break
            path, data = member
            if not isinstance(path, str):
                raise TypeError(f"webdataset() takes (path, data) members, got a path of type {type(path).__name__}")
            prefix, suffix = split_member_path(path)
            if not suffix:
                continue  # no field name: metadata, not data
            if sample and prefix != sample["__key__"]:
                self._position, self.count = first, self.count + 1
                done, sample = sample, {}
                self._pending = before
                yield done
            if not sample:
                sample["__key__"], first = prefix, source.position()
                self._pending = before
            sample[suffix] = data
        if sample:
            self._position, self.count = first, self.count + 1
            self._pending = source.state()
            yield sample
        self._pending = source.state()

    def state(self) -> State:
        return {"source": self._pending}

    def position(self) -> Position | None:
        return self._position

    def yielded(self) -> int:
        return self.count

    def inputs(self) -> list[Pass]:
        return [self.source]


class WebDataset(IterDataPipe):
    """Samples ``{"__key__": prefix, ".ext": data, ...}`` from ``(path, data)`` members in
    tar order, as ``load_from_tar`` yields them (see the module).

    Args:
        source: The pipe of ``(path, data)`` tar members, in tar order.
    """

    keeps_order = True
    replays_input = True
    pass_type = WebDatasetPass
    state_fields = {"source": dict}

    def __init__(self, source: IterDataPipe):
        self.source = source


@IterDataPipe.register_functional("webdataset", builds=WebDataset)
def webdataset(self: IterDataPipe[tuple[str, Any]]) -> IterDataPipe[dict[str, Any]]:
    """Groups tar members into WebDataset samples by their name's prefix.

    Reads ``(path, data)`` members in tar order, as ``load_from_tar`` yields them.

    Returns:
        A pipe of samples ``{"__key__": prefix, ".ext": data, ...}``.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> members = [("s/0.jpg", b"..."), ("s/0.cls", b"3"), ("s/1.jpg", b"...")]
        >>> [sorted(sample) for sample in IterableWrapper(members).webdataset()]
        [['.cls', '.jpg', '__key__'], ['.jpg', '__key__']]
    """
    return WebDataset(self)


_RANGE = re.compile(r"\{(\d+)\.\.(\d+)\}")


def expand_shards(spec: str) -> list[str]:
    """Every name ``spec`` stands for: each ``{low..high}`` is the numbers from low to high
    (both included), zero-padded to ``high``'s width when ``low`` is written that wide."""
    match = _RANGE.search(spec)
    if match is None:
        return [spec]
    low_text, high_text = match.groups()
    low, high = int(low_text), int(high_text)
    if low > high:
        raise ValueError(f"shard_expand: the range {match.group(0)} in {spec!r} goes down")
    if len(low_text) > len(high_text):
        raise ValueError(f"shard_expand: in {spec!r}, {low_text!r} is written wider than {high_text!r}")
    padded = len(low_text) == len(high_text) and low_text.startswith("0")
    head, rests = spec[: match.start()], expand_shards(spec[match.end() :])
    width = len(high_text) if padded else 0
    return [f"{head}{number:0{width}d}{rest}" for number in range(low, high + 1) for rest in rests]


class ShardExpander(Expander):
    """Each shard name a pattern stands for (``"s-{00..03}.tar"`` gives ``s-00.tar`` ...
    ``s-03.tar``; several ranges multiply).

    Args:
        source: The pipe of shard name patterns (``"s-{00..03}.tar"``).
    """

    def expand(self, item: Any) -> Iterable[str]:
        if not isinstance(item, str):
            raise TypeError(f"shard_expand() takes str patterns, got {type(item).__name__}")
        return expand_shards(item)


@IterDataPipe.register_functional("shard_expand", builds=ShardExpander)
def shard_expand(self: IterDataPipe[str]) -> IterDataPipe[str]:
    """Expands each brace pattern into the shard names it stands for.

    Several ranges in one name multiply.

    Returns:
        A pipe of shard names.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> list(IterableWrapper(["s-{00..02}.tar"]).shard_expand())
        ['s-00.tar', 's-01.tar', 's-02.tar']
    """
    return ShardExpander(self)
