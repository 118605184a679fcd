"""Decoding images with Pillow (``decode_image``) and WebDataset samples by extension
(``decode_samples``)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import webdataset as wds
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.pipes import FileLister, FileOpener, ImageDecoder, IterableWrapper, SampleDecoder
from conveyor.pipes.io.images import npy_array
from hypothesis_profiles import scaled
from resume_checks import check_resume_at_every_cut

pytestmark = pytest.mark.timeout(120)


def encoded(seed: int, fmt: str = "PNG", size: tuple[int, int] = (6, 4)) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt)
    return out.getvalue()


def pixels_of(data: bytes, mode: str = "RGB") -> np.ndarray:
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert(mode))


def test_decode_image_gives_arrays_from_bytes_streams_and_pairs() -> None:
    png, jpg = encoded(1), encoded(2, "JPEG")
    pipe = IterableWrapper([png, io.BytesIO(jpg), ("a/b.png", io.BytesIO(png))]).decode_image()
    assert isinstance(pipe, ImageDecoder)
    first, second, (path, third) = list(pipe)
    assert first.shape == (4, 6, 3) and first.dtype == np.uint8
    assert np.array_equal(first, pixels_of(png)) and np.array_equal(third, pixels_of(png))
    assert np.array_equal(second, pixels_of(jpg)) and path == "a/b.png"
    (gray,) = list(IterableWrapper([png]).decode_image(mode="L"))
    assert gray.shape == (4, 6)


def test_an_image_that_cannot_be_decoded_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match=r"could not decode 'x\.png' \(9 bytes\)") as raised:
        list(IterableWrapper([("x.png", io.BytesIO(b"not a png"))]).decode_image())
    assert any("ImageDecoder" in note for note in raised.value.__notes__)


def write_image_shards(root: Path, count: int = 10) -> list[dict[str, Any]]:
    samples = [
        {
            "__key__": f"s{i:03d}",
            "jpg": encoded(i, "JPEG", (8, 8)),
            "json": {"i": i},
            "cls": i % 3,
            "txt": f"caption {i}",
            "npy": np.arange(i, i + 3),
        }
        for i in range(count)
    ]
    with wds.ShardWriter(str(root / "img-%03d.tar"), maxcount=4, verbose=0) as sink:
        for sample in samples:
            sink.write(dict(sample))
    return samples


def decoded_samples(root: str, **kwargs: Any) -> Any:
    return FileOpener(FileLister(root, "*.tar"), mode="b").load_from_tar().webdataset().decode_samples(**kwargs)


def test_decode_samples_decodes_webdataset_fields_by_extension(tmp_path: Path) -> None:
    written = write_image_shards(tmp_path)
    pipe = decoded_samples(str(tmp_path))
    assert isinstance(pipe, SampleDecoder)
    read = list(pipe)
    assert len(read) == len(written)
    for got, sample in zip(read, written, strict=True):
        assert got["__key__"].endswith(sample["__key__"])
        assert np.array_equal(got[".jpg"], pixels_of(sample["jpg"]))
        assert got[".json"] == sample["json"] and got[".cls"] == sample["cls"] and got[".txt"] == sample["txt"]
        assert np.array_equal(got[".npy"], sample["npy"])


def test_handlers_add_or_replace_decoders(tmp_path: Path) -> None:
    write_image_shards(tmp_path, count=2)
    (first, _) = list(decoded_samples(str(tmp_path), handlers={"jpg": len, "json": json.loads}))
    assert isinstance(first[".jpg"], int) and first[".json"] == {"i": 0}
    with pytest.raises(TypeError, match="not callable"):
        IterableWrapper([]).decode_samples(handlers={"jpg": 3})


def crop(sample: dict[str, Any]) -> tuple[str, list[int], int]:
    return sample["__key__"][-4:], sample[".jpg"][:2, :2, 0].ravel().tolist(), sample[".cls"]


def test_decoding_resumes_at_every_cut_and_reads_alike_on_any_worker_count(tmp_path: Path) -> None:
    write_image_shards(tmp_path, count=7)
    root = str(tmp_path)
    check_resume_at_every_cut(lambda: decoded_samples(root).map(crop), seed=1, cut_epochs=(0,))

    def read(workers: int) -> list[Any]:
        graph = FileOpener(FileLister(root, "*.tar").sharding_filter(), mode="b")
        graph = graph.load_from_tar().webdataset().decode_samples().map(crop)
        loader = DataLoader2(graph, reading_service=MultiProcessingReadingService(workers) if workers else None)
        try:
            return list(loader)
        finally:
            loader.shutdown()

    assert read(0) == read(2)


@given(
    shape=st.lists(st.integers(0, 5), max_size=3).map(tuple),
    dtype=st.sampled_from(["<f4", ">f4", "<i8", "u1", "<c8", "?", "<U3"]),
    fortran=st.booleans(),
)
@settings(max_examples=scaled(60))
def test_npy_fields_read_as_numpy_loads_them(shape, dtype, fortran):
    """decode_samples' .npy reader (read into memory shared_empty gives) against np.load."""
    array = np.zeros(shape, dtype=dtype, order="F" if fortran else "C")
    if array.size and array.dtype.kind != "U":
        array.flat[:] = np.arange(array.size).astype(array.dtype)
    saved = io.BytesIO()
    np.save(saved, array)
    got, want = npy_array(saved.getvalue()), np.load(io.BytesIO(saved.getvalue()))
    assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)
    assert got.flags.f_contiguous == want.flags.f_contiguous and got.flags.writeable


def test_npy_bytes_numpy_refuses_are_refused_with_numpys_error():
    saved = io.BytesIO()
    np.save(saved, np.arange(10))
    with pytest.raises(ValueError, match="EOF"):
        npy_array(saved.getvalue()[:-8])
    with pytest.raises(ValueError):
        npy_array(b"not an npy file")
    pickled = io.BytesIO()
    np.save(pickled, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="allow_pickle=False"):
        npy_array(pickled.getvalue())
