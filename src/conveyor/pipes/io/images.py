"""Decoding: ``decode_image(mode="RGB")`` turns encoded images into numpy arrays through
Pillow; ``decode_samples()`` decodes a WebDataset sample's fields by their extension.

Both are per item: they resume exactly and give the same output for any number of
workers. An image that cannot be decoded is an error naming it.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal

import numpy as np

from conveyor.core.base import IterDataPipe
from conveyor.core.passes import PassContext, State, ThroughPass
from conveyor.core.shared_arrays import shared_empty
from conveyor.core.skips import drop_or_raise
from conveyor.errors import MissingDependencyError

IMAGE_EXTENSIONS = frozenset({"jpg", "jpeg", "png", "ppm", "pgm", "pbm", "bmp", "gif", "tif", "tiff", "webp"})


def _pillow() -> Any:
    try:
        from PIL import Image
    except ImportError:
        raise MissingDependencyError("decode_image needs Pillow: pip install 'conveyor[images]'") from None
    return Image


def _bytes_of(data: Any) -> bytes:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    read = getattr(data, "read", None)
    if read is None:
        raise TypeError(f"expected bytes or a binary stream, got {type(data).__name__}")
    try:
        return read()
    finally:
        close = getattr(data, "close", None)
        if close is not None:
            close()


def image_array(data: Any, mode: str | None = "RGB", name: str = "an image") -> np.ndarray:
    """The image in ``data`` (bytes or a binary stream) as an array, ``H x W x C`` (``H x W``
    for one-band modes), in Pillow ``mode`` (None: as stored)."""
    image_module = _pillow()
    encoded = _bytes_of(data)
    try:
        with image_module.open(io.BytesIO(encoded)) as image:
            image = image.convert(mode) if mode is not None and image.mode != mode else image
            return np.asarray(image)
    except (OSError, ValueError, SyntaxError) as error:  # Pillow's errors for data it cannot read
        raise ValueError(f"could not decode {name} ({len(encoded)} bytes): {error}") from error


class _DecodePass(ThroughPass):
    def __init__(self, pipe: _Decoder, state: State | None, context: PassContext):
        super().__init__(pipe, state, context)
        self.items = self._decode(pipe)

    def _decode(self, pipe: _Decoder) -> Iterator[Any]:
        source, skips = self.source, self.context.skips
        for item in skips.unseen(pipe, source) if skips else source:
            try:
                result = pipe.decode(item)
            except Exception as err:
                drop_or_raise(err, pipe, skips, source)
                self.skipped += 1
                continue
            yield result
            del result, item  # not held while the next item is made (see mapper.MapperPass)


class _Decoder(IterDataPipe):
    per_item = True
    keeps_order = True
    pass_type = _DecodePass
    state_fields = {"source": dict}
    source: IterDataPipe  # each decoder's input

    def decode(self, item: Any) -> Any:
        raise NotImplementedError  # each decoder defines it

    def __len__(self) -> int:
        return len(self.source)


class ImageDecoder(_Decoder):
    """Each image (bytes or a binary stream; or ``(path, stream)``, giving ``(path,
    array)``) as a numpy array in Pillow ``mode`` (``"RGB"``, ``"L"``, ... or None: as
    stored)."""

    _params = ("mode",)

    def __init__(self, source: IterDataPipe, mode: str | None = "RGB"):
        self.source = source
        self.mode = mode

    def decode(self, item: Any) -> Any:
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
            path, data = item
            return path, image_array(data, self.mode, repr(path))
        return image_array(item, self.mode)


@IterDataPipe.register_functional("decode_image", builds=ImageDecoder)
def decode_image(self: IterDataPipe[Any], mode: str | None = "RGB") -> IterDataPipe[Any]:
    """Decodes each image (bytes or a binary stream) into a numpy array, with Pillow.

    Needs ``conveyor[images]``. An item ``(path, data)`` becomes ``(path, array)``.

    Args:
        mode: Pillow's mode to convert to (``"RGB"``, ``"L"``, ...); None: as stored.

    Returns:
        A pipe of arrays (height, width[, channels]), or of ``(path, array)`` pairs.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> images = IterableWrapper(["photos/"]).list_files(masks="*.jpg").open_files(mode="b").decode_image()
    """
    return ImageDecoder(self, mode)


def _decode_field(extension: str, data: bytes, image_mode: str | None, where: str) -> Any:
    if extension in IMAGE_EXTENSIONS:
        return image_array(data, image_mode, where)
    if extension == "json":
        return json.loads(data)
    if extension in ("txt", "text"):
        return data.decode("utf-8")
    if extension in ("cls", "cls2", "index", "inx", "id"):
        return int(data)
    if extension == "npy":
        return npy_array(data)
    return data


def npy_array(data: bytes) -> np.ndarray:
    """The array in ``.npy`` bytes (no pickles), read straight into memory
    :func:`conveyor.shared_empty` gives: in a worker, the array is then sent from where it
    was read, with no second copy. Headers this does not read (format 3.0) and object
    arrays go through ``numpy.load``, as do bytes too short for their header's shape (for
    numpy's error)."""
    header = _npy_header(data)
    if header is None:
        return np.load(io.BytesIO(data), allow_pickle=False)  # numpy's own array, or its own error
    shape, fortran, dtype, offset = header
    count = math.prod(shape)
    order: Literal["C", "F"] = "F" if fortran else "C"
    out = shared_empty(shape, dtype, order=order)
    out[...] = np.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(shape, order=order)
    return out


def _npy_header(data: bytes) -> tuple[tuple[int, ...], bool, np.dtype[Any], int] | None:
    """``(shape, fortran, dtype, data offset)`` of ``.npy`` bytes that can be read as they
    are; None for what ``numpy.load`` must read (format 3.0, object arrays) or refuse
    (no ``.npy`` header, data shorter than the header's shape)."""
    stream = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream)
        else:
            return None
    except ValueError:
        return None
    offset = stream.tell()
    if dtype.hasobject or len(data) - offset < math.prod(shape) * dtype.itemsize:
        return None
    return shape, fortran, dtype, offset


class SampleDecoder(_Decoder):
    """Each WebDataset sample (``{"__key__": ..., ".ext": data}``, as ``webdataset()``
    makes them) with its fields decoded by their last extension: images to arrays in
    ``image_mode``, ``json`` parsed, ``txt`` to str, ``cls``/``index`` to int, ``npy``
    loaded (no pickles); others as bytes. ``handlers`` (``{extension: fn(bytes)}``) add or
    replace decoders."""

    _params = ("image_mode", "handlers")

    def __init__(
        self,
        source: IterDataPipe,
        image_mode: str | None = "RGB",
        handlers: Mapping[str, Callable[[bytes], Any]] | None = None,
    ):
        self.source = source
        self.image_mode = image_mode
        self.handlers = dict(handlers or {})
        for extension, handler in self.handlers.items():
            if not callable(handler):
                raise TypeError(f"decode_samples: the handler for {extension!r} is not callable")

    def decode(self, item: Any) -> Any:
        if not isinstance(item, Mapping):
            raise TypeError(f"decode_samples() takes dict samples, got {type(item).__name__}")
        decoded = {}
        for field, value in item.items():
            if field.startswith("__"):
                decoded[field] = value
                continue
            extension = field.rsplit(".", 1)[-1].lower()
            data = _bytes_of(value)
            where = f"field {field!r} of sample {item.get('__key__')!r}"
            handler = self.handlers.get(extension)
            decoded[field] = (
                handler(data) if handler is not None else _decode_field(extension, data, self.image_mode, where)
            )
        return decoded


@IterDataPipe.register_functional("decode_samples", builds=SampleDecoder)
def decode_samples(
    self: IterDataPipe[Mapping[str, Any]],
    image_mode: str | None = "RGB",
    handlers: Mapping[str, Callable[[bytes], Any]] | None = None,
) -> IterDataPipe[dict[str, Any]]:
    """Decodes the fields of each WebDataset sample by their last extension.

    Images become arrays (with ``conveyor[images]``), ``json`` is parsed, ``txt`` is
    text, ``cls`` and ``index`` are ints, ``npy`` is loaded (no pickles); others stay
    bytes.

    Args:
        image_mode: Pillow's mode for images; None: as stored.
        handlers: Extension -> a function of the field's bytes, added to the decoders
            (or replacing one).

    Returns:
        A pipe of samples with decoded fields.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> sample = {"__key__": "s0", ".json": b'{"label": 3}', ".txt": b"a cat"}
        >>> list(IterableWrapper([sample]).decode_samples())
        [{'__key__': 's0', '.json': {'label': 3}, '.txt': 'a cat'}]
    """
    return SampleDecoder(self, image_mode, handlers)
