"""``load_parquet``: the rows (or batches of rows) of Parquet files, through pyarrow.

``load_parquet(columns=None, batch_rows=None)`` reads a pipe of paths (or ``(path,
stream)`` pairs, whose streams it closes: it opens each file by its path). Each file's
row groups are listed from its footer; unless the files were split already (a sharding
point before it), the row groups are where ranks and workers split the work, so each
reads only its own row groups. That split is the source's own: a sharding point the
user puts after the rows (``load_parquet().sharding_filter()``, torchdata's way) wins
and splits the rows instead, each worker reading every row group and keeping its rows
(see :mod:`conveyor.core.sharding_points`). A row group is read whole (its ``columns``), then
handed out as rows, ``{column: value}``, or as batches of up to ``batch_rows`` rows,
``{column: numpy array}``. A resume reads the row group it stopped in again and skips
the rows already yielded.

A URL (``s3://...``, ``memory://...``) is read through fsspec, with ``storage_options``
(``load_parquet(..., **storage_options)``) and the retries of
:class:`~conveyor.pipes.io.fsspec_files.RetryingFile`; pyarrow asks for the byte ranges it
needs (the footer, then the chunks of one row group), and only those are fetched.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack
from typing import Any

from conveyor.core.base import IterDataPipe
from conveyor.core.foreign import inputs_of
from conveyor.core.op_roles import ShardingPoint
from conveyor.core.sharding import own_split
from conveyor.core.validation import check_int
from conveyor.errors import MissingDependencyError
from conveyor.pipes.flatmap import Expander
from conveyor.pipes.io.fsspec_files import RetryingFile, is_url


def _pyarrow_parquet() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise MissingDependencyError("load_parquet needs pyarrow: pip install 'conveyor[parquet]'") from None
    return pq


def _warm_pyarrow() -> None:
    """Import pyarrow now, in the process that builds the graph, and convert one column to
    numpy, which makes pyarrow import pandas (~0.3 s here): a missing pyarrow is said at
    once, and forked workers inherit both imports instead of each paying them before its
    first batch."""
    _pyarrow_parquet()
    import pyarrow

    pyarrow.array([0]).to_numpy()


def _path_of(item: Any) -> str:
    if isinstance(item, tuple) and len(item) == 2:
        path, stream = item
        close = getattr(stream, "close", None)
        if close is not None:
            close()  # opened by the path when its row groups are read
        return str(path)
    return str(item)


def _open_parquet(path: str, storage_options: dict[str, Any], closing: ExitStack) -> Any:
    """A ``pyarrow.parquet.ParquetFile`` over ``path`` (through fsspec for a URL), closed by
    ``closing``."""
    source: Any = closing.enter_context(RetryingFile(path, storage_options)) if is_url(path) else path
    return closing.enter_context(_pyarrow_parquet().ParquetFile(source))


class ParquetRowGroups(Expander):
    """``(path, row group index)`` for every row group of each Parquet file (its footer is
    read, its data is not).

    Args:
        source: The pipe of paths (or ``(path, stream)`` pairs) of Parquet files.
        **storage_options: Given to fsspec for URLs; never shown in a ``repr`` or saved in a state.
    """

    def __init__(self, source: IterDataPipe, **storage_options: Any):
        super().__init__(source)
        self._storage_options = storage_options

    def expand(self, item: Any) -> Iterable[tuple[str, int]]:
        path = _path_of(item)
        with ExitStack() as closing:
            parquet = _open_parquet(path, self._storage_options, closing)
            return [(path, group) for group in range(parquet.num_row_groups)]


class ParquetLoader(Expander):
    """The rows (or batches of ``batch_rows`` rows) of ``(path, row group)`` units: see the
    module. Made by :func:`load_parquet`.

    Args:
        source: The pipe of ``(path, row group index)`` units, as :class:`ParquetRowGroups` yields
            them.
        columns: The columns to read; None: all.
        batch_rows: Yield blocks of this many rows (each column an array) instead of single rows.
        **storage_options: Given to fsspec for URLs; never shown in a ``repr`` or saved in a state.
    """

    _params = ("columns", "batch_rows")

    def __init__(
        self,
        source: IterDataPipe,
        columns: Sequence[str] | None = None,
        batch_rows: int | None = None,
        **storage_options: Any,
    ):
        check_int("batch_rows", batch_rows, 1, allow_none=True)
        if columns is not None and (isinstance(columns, str) or not all(isinstance(c, str) for c in columns)):
            raise TypeError(f"load_parquet: columns must be a list of column names, got {columns!r}")
        _warm_pyarrow()
        super().__init__(source)
        self.columns = list(columns) if columns is not None else None
        self.batch_rows = batch_rows
        self._storage_options = storage_options

    def expand(self, item: Any) -> Iterable[dict[str, Any]]:
        return self.expand_from(item, 0)

    def expand_from(self, item: Any, skip: int) -> Iterator[dict[str, Any]]:
        path, group = item
        with ExitStack() as closing:
            parquet = _open_parquet(path, self._storage_options, closing)
            names = parquet.schema_arrow.names
            missing = [name for name in self.columns or () if name not in names]
            if missing:
                raise KeyError(f"load_parquet: {path!r} has no column {missing[0]!r} (its columns: {names})")
            table = parquet.read_row_group(group, columns=self.columns)
        arrays = {name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names}
        rows = table.num_rows
        if self.batch_rows is None:
            for row in range(skip, rows):
                yield {name: values[row] for name, values in arrays.items()}
            return
        for start in range(skip * self.batch_rows, rows, self.batch_rows):
            end = start + self.batch_rows
            yield {name: values[start:end] for name, values in arrays.items()}


def _split_upstream(source: Any) -> bool:
    """Whether a sharding point is already in ``source``'s graph (the files are split)."""
    seen: set[int] = set()
    stack = [source]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, ShardingPoint):
            return True
        stack.extend(inputs_of(node))
    return False


def load_parquet(
    source: IterDataPipe[str],
    columns: Sequence[str] | None = None,
    batch_rows: int | None = None,
    **storage_options: Any,
) -> IterDataPipe[dict[str, Any]]:
    """Reads the rows of the Parquet files whose paths or URLs ``source`` yields.

    Needs ``conveyor[parquet]``. The rows are split between ranks and workers by row
    group, unless a sharding point before it split the files, or one after it splits the
    rows (the user's point wins); a resume goes on from the row after the last one.

    Args:
        source: The pipe of paths (``pipe.load_parquet(...)`` passes the pipe itself).
        columns: The columns to read; None: all.
        batch_rows: Yield blocks of this many rows (each column an array) instead of
            single rows.
        **storage_options: Given to fsspec for URLs; never shown in a ``repr`` or saved
            in a state.

    Returns:
        A pipe of rows (dicts of column values), or of blocks with ``batch_rows``.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> rows = IterableWrapper(["data/"]).list_files(masks="*.parquet").load_parquet(columns=["text"])
    """
    units: IterDataPipe[Any] = ParquetRowGroups(source, **storage_options)
    if not _split_upstream(source):
        # It yields to a sharding point the user puts after the rows (conveyor.core.sharding_points).
        units = own_split(units, "load_parquet()'s own split of its row groups")
    return ParquetLoader(units, columns=columns, batch_rows=batch_rows, **storage_options)


IterDataPipe.register_functional("load_parquet")(load_parquet)  # a function: it makes three pipes
