"""The JPEG workload of ``bench_real_data.py`` and ``bench_autotune.py``: WebDataset shards
of 256x256 RGB JPEGs, each sample decoded with Pillow, cropped to 224x224 at a corner drawn
from its index, and batched by 32 into ``(images, labels, indices)`` tensors; and the
check of every batch.

Every loader calls the same function on each sample (:func:`crop_item`), so that the
loaders compare on the same work. The content can be checked: each label is its index's,
and each crop's fingerprint (the sum of every 16th row and column) must equal the one
computed when the shard was written.
"""

from __future__ import annotations

import io
import multiprocessing
import signal
import tarfile
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import default_collate

from conveyor.tools.bench.harness.tally import Tally

SIDE, CROP = 256, 224
IMAGE_BATCH = 32
CLASSES = 1000
JPEG_QUALITY = 90
#: A crop's fingerprint sums every FINGERPRINT_STEP-th row and column of it.
FINGERPRINT_STEP = 16
#: Each pixel's row and column, the images' canvas (uint8: the sums below wrap at 256).
ROWS_COLUMNS = np.mgrid[0:SIDE, 0:SIDE].astype(np.uint8)


def index_of(key: str) -> int:
    """The sample index in a WebDataset key (``.../sample0000042`` is 42)."""
    return int(key.rsplit("/", 1)[-1].removeprefix("sample"))


def key_of(index: int) -> str:
    return f"sample{index:07d}"


def decode_jpeg(data: bytes) -> np.ndarray:
    """The image as a ``H x W x 3`` uint8 array, through Pillow."""
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image if image.mode == "RGB" else image.convert("RGB"))


def crop_corner(index: int) -> tuple[int, int]:
    """The top-left corner of ``index``'s crop: pseudo-random, the same in every loader
    (a multiplicative hash of the index, so that the content can be checked)."""
    mixed = (index * 2654435761) % 2**32
    room = SIDE - CROP + 1
    return mixed % room, (mixed >> 16) % room


def crop(image: np.ndarray, index: int) -> np.ndarray:
    top, left = crop_corner(index)
    return image[top : top + CROP, left : left + CROP]


def crop_item(key: str, jpeg: bytes, cls: bytes) -> tuple[np.ndarray, int, int]:
    """One sample as every loader makes it: ``(cropped image, label, index)``."""
    index = index_of(key)
    return crop(decode_jpeg(jpeg), index), int(cls), index


def fingerprints(images: np.ndarray) -> np.ndarray:
    """Each crop's fingerprint, for a ``(b, CROP, CROP, 3)`` batch: int64 sums of a grid."""
    grid = images[:, ::FINGERPRINT_STEP, ::FINGERPRINT_STEP]
    return grid.reshape(len(images), -1).sum(axis=1, dtype=np.int64)


def make_image(index: int) -> np.ndarray:
    """A ``SIDE x SIDE`` RGB image of ``index``'s own: stripes at its angle, plus noise (which
    keeps its JPEG near 40 KB)."""
    rng = np.random.default_rng(index)
    a, b = rng.integers(1, 8, size=2, dtype=np.uint8)
    shade = np.uint8(index % 256)
    y, x = ROWS_COLUMNS
    image = np.stack([a * x + b * y, b * x - a * y + shade, (x ^ y) + shade], axis=-1)
    image += rng.integers(0, 24, size=image.shape, dtype=np.uint8)
    return image


def encode_image(index: int) -> tuple[bytes, int]:
    """``index``'s JPEG and the fingerprint of its crop as the loaders will decode it."""
    out = io.BytesIO()
    Image.fromarray(make_image(index)).save(out, format="JPEG", quality=JPEG_QUALITY)
    jpeg = out.getvalue()
    return jpeg, int(fingerprints(crop(decode_jpeg(jpeg), index)[None])[0])


def default_sigterm() -> None:
    """A forked helper's SIGTERM back to ending it: a parent's handler that raises would
    make the pool's ``terminate()`` raise inside the helper, which could then hang on its
    way out, and the pool's ``join()`` with it."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def write_shards(root: Path, shards: int, per_shard: int, processes: int = 2) -> tuple[list[str], str]:
    """``shards`` shards of ``per_shard`` images under ``root`` (written with the webdataset
    package's ``ShardWriter``; ``__key__``, ``jpg``, ``cls``), and a ``.npy`` of every
    image's crop fingerprint: ``(shard paths, fingerprints path)``."""
    import webdataset as wds

    count = shards * per_shard
    prints = np.zeros(count, dtype=np.int64)
    with (
        multiprocessing.Pool(processes, initializer=default_sigterm) as pool,
        wds.ShardWriter(str(root / "shard-%06d.tar"), maxcount=per_shard, verbose=0) as sink,
    ):
        for index, (jpeg, fingerprint) in enumerate(pool.imap(encode_image, range(count), chunksize=32)):
            sink.write({"__key__": key_of(index), "jpg": jpeg, "cls": index % CLASSES})
            prints[index] = fingerprint
    np.save(root / "fingerprints.npy", prints)
    return sorted(str(path) for path in root.glob("shard-*.tar")), str(root / "fingerprints.npy")


def tar_samples(path: str) -> Iterator[tuple[str, dict[str, bytes]]]:
    """``(key, {suffix: bytes})`` for each run of members of one key in a tar."""
    key, fields = "", {}
    with tarfile.open(path) as archive:
        for member in archive:
            if not member.isfile():
                continue
            prefix, _, suffix = member.name.partition(".")
            if fields and prefix != key:
                yield key, fields
                fields = {}
            key = prefix
            extracted = archive.extractfile(member)
            assert extracted is not None  # a regular file
            fields[suffix] = extracted.read()
    if fields:
        yield key, fields


def shard_items(shards: Iterable[str]) -> Iterator[tuple[np.ndarray, int, int]]:
    """:func:`crop_item` of each sample of ``shards``, read with ``tarfile``."""
    for shard in shards:
        for key, fields in tar_samples(shard):
            yield crop_item(key, fields["jpg"], fields["cls"])


def collated(items: Iterable[tuple[np.ndarray, int, int]]) -> Iterator[Any]:
    """Batches of ``IMAGE_BATCH`` items (the last may be short) by ``default_collate``, as
    torch's ``DataLoader`` makes them."""
    batch: list[tuple[np.ndarray, int, int]] = []
    for item in items:
        batch.append(item)
        if len(batch) == IMAGE_BATCH:
            yield default_collate(batch)
            batch = []
    if batch:
        yield default_collate(batch)


def conveyor_sample(sample: dict[str, Any]) -> tuple[np.ndarray, int, int]:
    """A sample of conveyor's ``webdataset()``: fields are in-memory streams."""
    return crop_item(sample["__key__"], sample[".jpg"].getvalue(), sample[".cls"].getvalue())


def image_pipeline(shards: Sequence[str]) -> Any:
    """conveyor's graph: the shards shared out, samples cropped, batched as tensors."""
    from conveyor.pipes import IterableWrapper

    pipe = IterableWrapper(list(shards)).sharding_filter().open_files(mode="b").load_from_tar().webdataset()
    return pipe.map(conveyor_sample).batch(IMAGE_BATCH).collate(to_tensor=True)


def tensor_of(value: Any, dtype: torch.dtype) -> np.ndarray | None:
    """``value`` as an array when it is a tensor of ``dtype``, else None."""
    if not isinstance(value, torch.Tensor) or value.dtype != dtype:
        return None
    return value.numpy()


class ImageTally(Tally):
    """``(images, labels, indices)`` tensors: each label by its index, each crop's
    fingerprint against the written one, and batches full but for at most ``workers``
    (one per worker)."""

    def __init__(self, n: int, expected: np.ndarray, workers: int, times: int = 1) -> None:
        super().__init__(n, times)
        self.expected, self.workers = expected, workers
        self.batches = self.partial = 0
        self.first_at = float("inf")  # the clock at the first batch (a bound's process reports it)

    def see(self, batch: Any) -> None:
        self.count += 1
        self.batches += 1
        if not isinstance(batch, Sequence) or len(batch) != 3:
            self.wrong(batch, "(images, labels, indices)")
            return
        images, labels, indices = (
            tensor_of(part, kind) for part, kind in zip(batch, (torch.uint8, torch.int64, torch.int64), strict=True)
        )
        if images is None or labels is None or indices is None:
            self.wrong(batch, "uint8 images and int64 labels and indices as tensors")
            return
        if images.shape != (len(indices), CROP, CROP, 3) or labels.shape != indices.shape:
            self.wrong(f"shapes {images.shape}, {labels.shape}, {indices.shape}", "a batch of crops")
            return
        if not 0 < len(indices) <= IMAGE_BATCH:
            self.wrong(f"{len(indices)} items", f"1 to {IMAGE_BATCH}")
        self.partial += len(indices) < IMAGE_BATCH
        inside = (indices >= 0) & (indices < self.n)
        if not np.array_equal(labels, indices % CLASSES):
            self.wrong(f"batch {self.batches}", "labels matching the keys")
        elif not np.array_equal(fingerprints(images[inside]), self.expected[indices[inside]]):
            self.wrong(f"batch {self.batches}", "the written images' crops")
        self.ids(indices.tolist())

    def merge(self, other: Tally) -> None:
        super().merge(other)
        if isinstance(other, ImageTally):
            self.batches += other.batches
            self.partial += other.partial

    def summary(self) -> dict[str, Any]:
        if self.partial > self.workers * self.times:
            self.wrong(f"{self.partial} batches of fewer than {IMAGE_BATCH}", "at most one per worker")
        return super().summary()


def bound_tally(shards: Sequence[str], expected: np.ndarray, n: int, workers: int) -> ImageTally:
    """The work of a torch worker on ``shards``, with no loader: the same ``tarfile`` read,
    :func:`crop_item`, batches of 32 by ``default_collate``; its batches checked here."""
    tally = ImageTally(n, expected, workers)
    for batch in collated(shard_items(shards)):
        tally.first_at = min(tally.first_at, time.perf_counter())
        tally.see(batch)
    return tally


def _merged(shares: Sequence[Sequence[str]], prints_path: str, n: int, run: Any) -> tuple[float, float, ImageTally]:
    """An epoch whose workers (threads or processes) each check their own batches and
    return their tallies: ``(wall s, first batch s, the merged tally)``, the first batch
    being the earliest any worker made."""
    tally = ImageTally(n, np.load(prints_path), len(shares))
    start = time.perf_counter()
    for part in run():
        tally.merge(part)
        tally.first_at = min(tally.first_at, part.first_at)
    return time.perf_counter() - start, tally.first_at - start, tally


def _process_tally(shards: Sequence[str], prints_path: str, n: int, workers: int, sender: Any) -> None:
    torch.set_num_threads(1)  # as in the loaders' workers (torch's and conveyor's set it so)
    sender.send(bound_tally(shards, np.load(prints_path), n, workers))
    sender.close()


def bound_in_processes(shares: Sequence[Sequence[str]], prints_path: str, n: int) -> tuple[float, float, ImageTally]:
    """A torch worker's work on each share of the shards, in forked processes, no loader;
    only each process's tally comes back."""

    def run() -> Iterator[Tally]:
        fork = multiprocessing.get_context("fork")
        pipes = [fork.Pipe(duplex=False) for _ in shares]
        processes = [
            fork.Process(target=_process_tally, args=(share, prints_path, n, len(shares), sender))
            for share, (_, sender) in zip(shares, pipes, strict=True)
        ]
        for process in processes:
            process.start()
        for _, sender in pipes:
            sender.close()  # the parent's copy: a process that dies makes its recv() raise EOFError
        try:
            for receiver, _ in pipes:
                yield receiver.recv()
        finally:
            for process in processes:
                process.join()

    return _merged(shares, prints_path, n, run)


def _thread_tally(shards: Sequence[str], prints_path: str, n: int, workers: int, graph: bool) -> Tally:
    """One thread's share: a torch worker's work, or conveyor's graph (``graph``)."""
    expected = np.load(prints_path)
    if not graph:
        return bound_tally(shards, expected, n, workers)
    tally = ImageTally(n, expected, workers)
    for batch in image_pipeline(shards):
        tally.first_at = min(tally.first_at, time.perf_counter())
        tally.see(batch)
    return tally


def bound_in_threads(
    shares: Sequence[Sequence[str]], prints_path: str, n: int, graph: bool
) -> tuple[float, float, ImageTally]:
    """The work on each share in a plain thread of this process, no loader: a torch
    worker's, or conveyor's graph itself (``graph``)."""
    torch.set_num_threads(1)  # as the bound in processes and the loaders' workers

    def run() -> Iterator[Tally]:
        with ThreadPoolExecutor(max_workers=len(shares)) as executor:
            yield from executor.map(lambda share: _thread_tally(share, prints_path, n, len(shares), graph), shares)

    return _merged(shares, prints_path, n, run)
