"""Text formats: ``parse_csv``, ``parse_csv_as_dict``, ``parse_json_files``,
``parse_jsonl_files`` and ``lines_to_paragraphs``, with torchdata's arguments.

The parsers read ``(path, stream)`` items (text or bytes streams, as ``FileOpener``
yields them); each file is closed once read. CSV and JSON-lines files resume inside the
file: the file is opened again and the rows already yielded are passed over.
``lines_to_paragraphs`` reads ``(path, line)`` items: a paragraph is known to be whole at
its first empty line (or the file's end), so its state is its input's state from before
the paragraph's first line.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any, ClassVar

from conveyor.core.base import IterDataPipe
from conveyor.core.passes import Pass, PassContext, Position, State, ThroughPass
from conveyor.core.validation import check_int
from conveyor.pipes.flatmap import Expander

_END: Any = object()  # the end of an input: compared by identity only


def _text(stream: IO[Any], decode: bool, encoding: str, errors: str) -> IO[str]:
    """The stream as text lines (a bytes stream decoded when ``decode``)."""
    if isinstance(stream, io.TextIOBase) or not decode:
        return stream
    return io.TextIOWrapper(stream, encoding=encoding, errors=errors, newline="")


class _CsvParser(Expander):
    _params: ClassVar[tuple[str, ...]] = ("skip_lines", "decode", "encoding", "errors", "return_path", "fmtparams")
    _reader: Callable[..., Iterator[Any]]

    def __init__(
        self,
        source: IterDataPipe,
        *,
        skip_lines: int = 0,
        decode: bool = True,
        encoding: str = "utf-8",
        errors: str = "ignore",
        return_path: bool = False,
        **fmtparams: Any,
    ):
        check_int("skip_lines", skip_lines, 0)
        super().__init__(source)
        self.skip_lines = skip_lines
        self.decode = decode
        self.encoding = encoding
        self.errors = errors
        self.return_path = return_path
        self.fmtparams = fmtparams

    def expand(self, item: Any) -> Iterable[Any]:
        return self._rows(*item)

    def _rows(self, path: str, stream: IO[Any]) -> Iterator[Any]:
        with stream:
            lines = _text(stream, self.decode, self.encoding, self.errors)
            for _ in range(self.skip_lines):
                if next(lines, None) is None:
                    return
            for row in type(self)._reader(lines, **self.fmtparams):
                row = self._shape(row)
                yield (path, row) if self.return_path else row

    def _shape(self, row: Any) -> Any:
        return row


class CSVParser(_CsvParser):
    """The rows of each CSV file as lists (tuples with ``as_tuple``); ``fmtparams`` go to
    ``csv.reader``; ``(path, row)`` with ``return_path``."""

    _params = (*_CsvParser._params, "as_tuple")
    _reader = csv.reader

    def __init__(self, source: IterDataPipe, *, as_tuple: bool = False, **kwargs: Any):
        super().__init__(source, **kwargs)
        self.as_tuple = as_tuple

    def _shape(self, row: Any) -> Any:
        return tuple(row) if self.as_tuple else row


@IterDataPipe.register_functional("parse_csv", builds=CSVParser)
def parse_csv(
    self: IterDataPipe[tuple[str, IO[Any]]],
    *,
    skip_lines: int = 0,
    decode: bool = True,
    encoding: str = "utf-8",
    errors: str = "ignore",
    return_path: bool = False,
    as_tuple: bool = False,
    **fmtparams: Any,
) -> IterDataPipe[Any]:
    """Yields the rows of each ``(path, stream)`` CSV file, as lists.

    Args:
        skip_lines: Lines to leave out at the top of each file.
        decode: Decode a binary stream as text.
        encoding: The text encoding of a binary stream.
        errors: What to do with bytes that do not decode (as ``bytes.decode``).
        return_path: Yield ``(path, row)``.
        as_tuple: Yield rows as tuples.
        **fmtparams: Given to ``csv.reader`` (``delimiter=";"``, ...).

    Returns:
        A pipe of rows, or of ``(path, row)`` pairs.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> import io
        >>> list(IterableWrapper([("a.csv", io.StringIO("1,2\\n3,4\\n"))]).parse_csv())
        [['1', '2'], ['3', '4']]
    """
    return CSVParser(
        self,
        skip_lines=skip_lines,
        decode=decode,
        encoding=encoding,
        errors=errors,
        return_path=return_path,
        as_tuple=as_tuple,
        **fmtparams,
    )


class CSVDictParser(_CsvParser):
    """The rows of each CSV file as dicts keyed by its header row (``csv.DictReader``)."""

    _reader = csv.DictReader


@IterDataPipe.register_functional("parse_csv_as_dict", builds=CSVDictParser)
def parse_csv_as_dict(
    self: IterDataPipe[tuple[str, IO[Any]]],
    *,
    skip_lines: int = 0,
    decode: bool = True,
    encoding: str = "utf-8",
    errors: str = "ignore",
    return_path: bool = False,
    **fmtparams: Any,
) -> IterDataPipe[Any]:
    """Yields the rows of each ``(path, stream)`` CSV file, as dicts keyed by its header row.

    Args:
        skip_lines: Lines to leave out at the top of each file, before the header.
        decode: Decode a binary stream as text.
        encoding: The text encoding of a binary stream.
        errors: What to do with bytes that do not decode (as ``bytes.decode``).
        return_path: Yield ``(path, row)``.
        **fmtparams: Given to ``csv.DictReader``.

    Returns:
        A pipe of dicts, or of ``(path, dict)`` pairs.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> import io
        >>> list(IterableWrapper([("a.csv", io.StringIO("x,y\\n1,2\\n"))]).parse_csv_as_dict())
        [{'x': '1', 'y': '2'}]
    """
    return CSVDictParser(
        self,
        skip_lines=skip_lines,
        decode=decode,
        encoding=encoding,
        errors=errors,
        return_path=return_path,
        **fmtparams,
    )


class JsonLinesParser(Expander):
    """``(path, object)`` for every non-empty line of each JSON-lines file (the object alone
    without ``return_path``); ``kwargs`` go to ``json.loads``. A line that is not JSON is
    a ``ValueError`` naming the file and line."""

    _params = ("return_path", "kwargs")

    def __init__(self, source: IterDataPipe, return_path: bool = True, **kwargs: Any):
        super().__init__(source)
        self.return_path = return_path
        self.kwargs = kwargs

    def expand(self, item: Any) -> Iterable[Any]:
        return self._objects(*item)

    def _objects(self, path: str, stream: IO[Any]) -> Iterator[Any]:
        with stream:
            for number, line in enumerate(stream, start=1):
                if not line.strip():
                    continue
                try:
                    value = json.loads(line, **self.kwargs)
                except json.JSONDecodeError as error:
                    raise ValueError(f"parse_jsonl_files: line {number} of {path!r} is not JSON ({error})") from None
                yield (path, value) if self.return_path else value


@IterDataPipe.register_functional("parse_jsonl_files", builds=JsonLinesParser)
def parse_jsonl_files(
    self: IterDataPipe[tuple[str, IO[Any]]], return_path: bool = True, **kwargs: Any
) -> IterDataPipe[Any]:
    """Yields the object on every non-empty line of each ``(path, stream)`` JSON-lines file.

    A line that is not JSON is a ``ValueError`` naming the file and line.

    Args:
        return_path: Yield ``(path, object)``; False: the object alone.
        **kwargs: Given to ``json.loads``.

    Returns:
        A pipe of objects, or of ``(path, object)`` pairs.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> import io
        >>> list(IterableWrapper([("a.jsonl", io.StringIO('{"x": 1}\\n{"x": 2}\\n'))]).parse_jsonl_files())
        [('a.jsonl', {'x': 1}), ('a.jsonl', {'x': 2})]
    """
    return JsonLinesParser(self, return_path, **kwargs)


class JsonParserPass(ThroughPass):
    def __init__(self, pipe: JsonParser, state: State | None, context: PassContext):
        super().__init__(pipe, state, context)
        self.items = self._parse(pipe)

    def _parse(self, pipe: JsonParser) -> Iterator[tuple[str, Any]]:
        for path, stream in self.source:
            with stream:
                try:
                    value = json.load(stream, **pipe.kwargs)
                except json.JSONDecodeError as error:
                    raise ValueError(f"parse_json_files: {path!r} is not JSON ({error})") from None
            yield path, value


class JsonParser(IterDataPipe):
    """``(path, object)`` for each JSON file; ``kwargs`` go to ``json.load``."""

    per_item = True
    keeps_order = True
    pass_type = JsonParserPass
    state_fields = {"source": dict}
    _params = ("kwargs",)

    def __init__(self, source: IterDataPipe, **kwargs: Any):
        self.source = source
        self.kwargs = kwargs

    def __len__(self) -> int:
        return len(self.source)


@IterDataPipe.register_functional("parse_json_files", builds=JsonParser)
def parse_json_files(self: IterDataPipe[tuple[str, IO[Any]]], **kwargs: Any) -> IterDataPipe[tuple[str, Any]]:
    """Parses each ``(path, stream)`` JSON file, as ``(path, object)``.

    Args:
        **kwargs: Given to ``json.load``.

    Returns:
        A pipe of ``(path, object)`` pairs.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> import io
        >>> list(IterableWrapper([("a.json", io.StringIO('{"x": [1, 2]}'))]).parse_json_files())
        [('a.json', {'x': [1, 2]})]
    """
    return JsonParser(self, **kwargs)


class ParagraphPass(Pass):
    def __init__(self, pipe: ParagraphAggregator, state: State | None, context: PassContext):
        super().__init__(pipe, context)
        self.source = context.open(pipe.source, state["source"] if state is not None else None)
        self._pending = self.source.state()  # before the first line of the paragraph not yet yielded
        self._position: Position | None = None
        self.count = 0
        self.items = self._paragraphs(pipe.joiner)

    def _paragraphs(self, joiner: Callable[[list[str]], str]) -> Iterator[tuple[str, str]]:
        source, lines = self.source, self.source.items
        buffer: list[str] = []
        path = ""  # the file of the paragraph in the buffer
        first: Position | None = None
        while True:
            before = source.state()
            entry = next(lines, _END)
            if entry is _END:
                break
            name, line = entry
            if buffer and name != path:  # a file ended inside a paragraph: it ends there
                yield self._emit(path, joiner(buffer), first, before)
                buffer = []
            if not line:
                if buffer:
                    yield self._emit(path, joiner(buffer), first, source.state())
                    buffer = []
                self._pending = source.state()
                continue
            if not buffer:
                path, first, self._pending = name, source.position(), before
            buffer.append(line)
        if buffer:
            yield self._emit(path, joiner(buffer), first, source.state())
        self._pending = source.state()

    def _emit(self, path: str, text: str, first: Position | None, pending: State) -> tuple[str, str]:
        self._position, self._pending, self.count = first, pending, self.count + 1
        return path, text

    def state(self) -> State:
        return {"source": self._pending}

    def position(self) -> Position | None:
        return self._position

    def yielded(self) -> int:
        return self.count

    def inputs(self) -> list[Pass]:
        return [self.source]


def _join_lines(lines: list[str]) -> str:
    return "\n".join(lines)


class ParagraphAggregator(IterDataPipe):
    """``(path, paragraph)`` from ``(path, line)`` items: consecutive non-empty lines of one
    file joined by ``joiner`` (``"\\n".join`` by default)."""

    keeps_order = True
    replays_input = True
    pass_type = ParagraphPass
    state_fields = {"source": dict}
    _params = ("joiner",)

    def __init__(self, source: IterDataPipe, joiner: Callable[[list[str]], str] = _join_lines):
        if not callable(joiner):
            raise TypeError(f"lines_to_paragraphs() needs a callable joiner, got {type(joiner).__name__}")
        self.source = source
        self.joiner = joiner


@IterDataPipe.register_functional("lines_to_paragraphs", builds=ParagraphAggregator)
def lines_to_paragraphs(
    self: IterDataPipe[tuple[str, str]], joiner: Callable[[list[str]], str] = _join_lines
) -> IterDataPipe[tuple[str, str]]:
    """Joins consecutive non-empty lines of one file into paragraphs.

    Args:
        joiner: Called with a paragraph's lines; returns its text (default:
            ``"\\n".join``).

    Returns:
        A pipe of ``(path, paragraph)`` pairs, from ``(path, line)`` items.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> lines = [("a.txt", "one"), ("a.txt", "two"), ("a.txt", ""), ("a.txt", "three")]
        >>> list(IterableWrapper(lines).lines_to_paragraphs(joiner=" ".join))
        [('a.txt', 'one two'), ('a.txt', 'three')]
    """
    return ParagraphAggregator(self, joiner)
