"""conveyor against the loaders people use on real data formats: JPEG shards in WebDataset
tars, a Parquet table, and objects on an S3-protocol server that answers slowly.

Workloads (each in one run of this script, ``num_workers=2`` wherever workers apply):

- ``images`` (a): WebDataset shards (written with the webdataset package's ``ShardWriter``)
  of 16,384 256x256 RGB JPEGs (quality 90, ~40 KB each; ``__key__``, ``jpg``, ``cls``), read into
  batches of 32 ``(image, label, index)`` samples: each image decoded with Pillow into a
  numpy RGB array and cropped to 224x224 at a corner drawn from its index (the same
  function, :func:`crop_item`, in every loader). Every loader gives each worker every
  other shard and delivers each batch as three torch tensors: images ``(b, 224, 224, 3)``
  uint8, labels and indices int64.

  - conveyor: ``IterableWrapper(shards).sharding_filter().open_files(mode="b")
    .load_from_tar().webdataset().map(...).batch(32).collate(to_tensor=True)`` through
    ``DataLoader2`` with ``MultiProcessingReadingService(num_workers=2)``;
  - webdataset: ``WebDataset(shards, shardshuffle=False).map(...).batched(32)`` (its
    collation stacks numpy arrays) in ``WebLoader(..., batch_size=None, num_workers=2)``
    (torch's ``DataLoader``, whose ``default_convert`` turns them into tensors);
  - torch: ``DataLoader(..., batch_size=32, num_workers=2)`` over an ``IterableDataset``
    that reads its worker's shards with ``tarfile`` (``default_collate``);
  - the bound, no loader: 2 forked processes, each doing a torch worker's work on its
    shards (the same ``tarfile`` read, :func:`crop_item`, batches of 32 by
    ``default_collate``) and checking its own batches; only each process's tally (the
    indices it saw, what was wrong) comes back, no batch. What 2 cores give at most.

- ``parquet`` (b): a Parquet file of ~1.57 M rows (``id`` int64, ``x = id / 2`` float64,
  ``label = id % 10`` int64, ``name = f"row{id}"`` string) in 12 row groups, read as
  batches of 1,024 rows, each a dict of column -> int64/float64 tensor (``name``: a list
  of str), the same types from both loaders.

  - conveyor: ``IterableWrapper([path]).load_parquet(batch_rows=1024)`` (split between the
    workers by row group) and a ``map`` of numeric columns to tensors (``torch.from_numpy``)
    and of ``name`` to a list, through ``DataLoader2`` with 2 workers;
  - Hugging Face datasets: ``Dataset.from_parquet(path, cache_dir=...)`` (its Arrow cache is
    built before the runs, untimed; a run loads it) ``.to_iterable_dataset(num_shards=12)``
    in torch's ``DataLoader(batch_size=1024, num_workers=2)``: ``default_collate`` of the
    rows. ``HF_DATASETS_OFFLINE=1`` and every cache in the benchmark's temporary directory.

- ``s3`` (c): 400 objects of 16 KiB on moto's S3 server (``python -m moto.server`` on
  127.0.0.1, started for the benchmark and stopped at its end), each read with s3fs
  (``cat_file``) after a 50 ms ``time.sleep``: the latency is injected in the read
  function, in the thread that reads, where a slow network would keep it waiting; the
  work of s3fs and of moto for each read comes on top. conveyor's
  ``threadpool_map(read, max_workers=16)`` against its ``map(read)``, both in
  ``DataLoader2`` in the calling process; the bound, no loader: the same reads through
  ``concurrent.futures.ThreadPoolExecutor(max_workers=16).map``. The CPU column counts
  the loader's process; the server's CPU over each run is printed below the table.

Every run is a fresh Python process: it reads a small warm-up epoch with a loader of its
own (first calls, imports), then the timed epoch, from the loader's creation to its last
batch *and its shutdown* with its workers joined (conveyor: ``shutdown()``; torch's
``DataLoader``: its iterator ends its workers with the epoch). CPU is user + system of the
process and its joined children (the workers) over that span. Runs alternate between a
workload's loaders; the table gives medians over ``--repeats`` runs. ``--scale``
multiplies every workload's size (a quick run).

Every run (the warm-ups too) is checked: every item delivered exactly once (a count per
index), every batch of the agreed types and shapes, full except at most one per worker,
and its content: (a) each label is its index's, and each crop's fingerprint (the sum of
every 16th row and column) equals the one computed when the shard was written; (b)
``x``, ``label`` and the batch's first and last ``name`` match its ids; (c) each object's
bytes. A wrong run fails in its child; its row says so and the exit code is 1.

    python benchmarks/bench_real_data.py [--repeats R] [--scale S] [--workloads images,parquet,s3]

The targets (conveyor at least 1.5x the items/s and at most 0.7x the CPU per item of
both webdataset and torch on (a); at least 2x Hugging Face's items/s on (b);
threadpool_map at least 10x map's items/s on (c)) are reported with whether each held in
this run; nothing asserts them. The loader rows give their share of the bound's items/s and
CPU per item, and lines below the table what each target asks of the bound.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import gc
import io
import json
import math
import multiprocessing
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from importlib.metadata import version
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, NamedTuple

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import webdataset as wds
from PIL import Image
from torch.utils.data import DataLoader, IterableDataset, default_collate, get_worker_info

from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.pipes import IterableWrapper
from conveyor.tools.bench.errors import CheckFailed
from conveyor.tools.bench.measure import cpu_seconds, end_new_processes

WORKERS = 2
#: (a) at --scale 1: 64 shards of 256 images; SIDE x SIDE images, CROP x CROP crops.
SHARDS, PER_SHARD = 64, 256
SIDE, CROP = 256, 224
IMAGE_BATCH = 32
CLASSES = 1000
JPEG_QUALITY = 90
#: A crop's fingerprint sums every FINGERPRINT_STEP-th row and column of it.
FINGERPRINT_STEP = 16
#: (b) at --scale 1: ROW_GROUPS row groups of GROUP_BATCHES batches of ROW_BATCH rows.
ROW_GROUPS, GROUP_BATCHES, ROW_BATCH = 12, 128, 1024
#: (c) at --scale 1: OBJECTS objects of OBJECT_BYTES; every read waits LATENCY_S first.
OBJECTS, OBJECT_BYTES = 400, 16 * 1024
LATENCY_S = 0.05
THREADS = 16
BUCKET = "bench"
#: Seconds one run may take before it counts as failed, and moto's server to answer at its start.
RUN_TIMEOUT_S = 300.0
SERVER_START_S = 60.0


# --- the work every loader does -------------------------------------------------------


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
    """One sample of (a) as every loader makes it: ``(cropped image, label, index)``."""
    index = index_of(key)
    return crop(decode_jpeg(jpeg), index), int(cls), index


def fingerprints(images: np.ndarray) -> np.ndarray:
    """Each crop's fingerprint, for a ``(b, CROP, CROP, 3)`` batch: int64 sums of a grid."""
    grid = images[:, ::FINGERPRINT_STEP, ::FINGERPRINT_STEP]
    return grid.reshape(len(images), -1).sum(axis=1, dtype=np.int64)


def row_name(row_id: int) -> str:
    return f"row{row_id}"


def object_bytes(index: int) -> bytes:
    """Object ``index``'s content: its number, eight digits, repeated."""
    return f"{index:08d}".encode() * (OBJECT_BYTES // 8)


@functools.cache
def s3_filesystem(endpoint: str) -> Any:
    """One s3fs filesystem per process for moto's server (its credentials are moto's
    defaults; 32 pooled connections, so that 16 threads never wait for one)."""
    return fsspec.filesystem(
        "s3",
        key="testing",
        secret="testing",
        client_kwargs={"endpoint_url": endpoint, "region_name": "us-west-2"},
        config_kwargs={"max_pool_connections": 32},
    )


def read_object(endpoint: str, url: str) -> bytes:
    """(c): one object, after the injected latency."""
    time.sleep(LATENCY_S)
    return s3_filesystem(endpoint).cat_file(url)


# --- the data -------------------------------------------------------------------------


@dataclass(frozen=True)
class Part:
    """One epoch's data: what the loaders read, and its items (indices ``0 .. items-1``)."""

    sources: list[str]  # (a) shard paths; (b) one Parquet file; (c) object URLs
    items: int
    groups: int = 1  # (b): the file's row groups (Hugging Face's shard count)


@dataclass(frozen=True)
class Manifest:
    """What the parent wrote, for the children: each workload's warm-up and timed parts."""

    parts: dict[str, dict[str, Part]] = field(default_factory=dict)  # workload -> "warm"/"timed" -> part
    fingerprints: str = ""  # (a): a .npy of every image's crop fingerprint
    hf_cache: str = ""  # (b): Hugging Face's cache directory
    endpoint: str = ""  # (c): the S3 server ...
    server_pid: int = 0  # ... and its process, whose CPU each run reports besides its own

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def load(cls, path: str) -> Manifest:
        raw = json.loads(Path(path).read_text())
        parts = {key: {name: Part(**part) for name, part in pair.items()} for key, pair in raw.pop("parts").items()}
        return cls(parts=parts, **raw)


@dataclass(frozen=True)
class Sizes:
    """The workloads' sizes at a ``--scale``."""

    shards: int
    per_shard: int
    group_rows: int
    objects: int

    @classmethod
    def at(cls, scale: float) -> Sizes:
        shards = max(2 * WORKERS, round(SHARDS * scale))
        return cls(
            shards=shards,
            per_shard=max(8, min(PER_SHARD, round(SHARDS * PER_SHARD * scale / shards))),
            group_rows=ROW_BATCH * max(1, round(GROUP_BATCHES * scale)),
            objects=max(2 * THREADS, round(OBJECTS * scale)),
        )


#: Each pixel's row and column, the images' canvas (uint8: the sums below wrap at 256).
ROWS_COLUMNS = np.mgrid[0:SIDE, 0:SIDE].astype(np.uint8)


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
    """A forked helper's SIGTERM back to ending it: the parent's handler (see
    :func:`stop_on_sigterm`) would make the pool's ``terminate()`` raise inside the helper,
    which could then hang on its way out, and the pool's ``join()`` with it."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def write_shards(root: Path, sizes: Sizes) -> tuple[dict[str, Part], str]:
    """(a)'s shards and fingerprints; the warm-up reads the first shard of each worker."""
    count = sizes.shards * sizes.per_shard
    prints = np.zeros(count, dtype=np.int64)
    with (
        multiprocessing.Pool(WORKERS, initializer=default_sigterm) as pool,
        wds.ShardWriter(str(root / "shard-%06d.tar"), maxcount=sizes.per_shard, verbose=0) as sink,
    ):
        for index, (jpeg, fingerprint) in enumerate(pool.imap(encode_image, range(count), chunksize=32)):
            sink.write({"__key__": key_of(index), "jpg": jpeg, "cls": index % CLASSES})
            prints[index] = fingerprint
    shards = sorted(str(path) for path in root.glob("shard-*.tar"))
    np.save(root / "fingerprints.npy", prints)
    parts = {
        "warm": Part(shards[:WORKERS], WORKERS * sizes.per_shard),
        "timed": Part(shards, count),
    }
    return parts, str(root / "fingerprints.npy")


def write_table(path: Path, groups: int, group_rows: int) -> Part:
    """A Parquet file of ``groups`` row groups of ``group_rows`` rows (see the module)."""
    ids = np.arange(groups * group_rows, dtype=np.int64)
    table = pa.table({"id": ids, "x": ids * 0.5, "label": ids % 10, "name": [row_name(i) for i in range(len(ids))]})
    pq.write_table(table, path, row_group_size=group_rows)
    return Part([str(path)], len(ids), groups)


def write_tables(root: Path, sizes: Sizes, hf_cache: str) -> dict[str, Part]:
    """(b)'s file and a small one for the warm-ups, with Hugging Face's Arrow caches built
    (untimed: a run loads them, as a user's second run would)."""
    import datasets

    parts = {
        "warm": write_table(root / "warm.parquet", WORKERS, 2 * ROW_BATCH),
        "timed": write_table(root / "rows.parquet", ROW_GROUPS, sizes.group_rows),
    }
    datasets.disable_progress_bars()
    for part in parts.values():
        datasets.Dataset.from_parquet(part.sources[0], cache_dir=hf_cache)
    return parts


def put_objects(endpoint: str, sizes: Sizes) -> dict[str, Part]:
    """(c)'s objects on the server; the warm-up reads the first ``THREADS`` of them."""
    fs = s3_filesystem(endpoint)
    fs.mkdir(BUCKET)
    urls = [f"s3://{BUCKET}/objects/{index:06d}" for index in range(sizes.objects)]
    fs.pipe({url: object_bytes(index) for index, url in enumerate(urls)})
    return {"warm": Part(urls[:THREADS], THREADS), "timed": Part(urls, len(urls))}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_until_up(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"moto's server exited with code {process.returncode} before it answered")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.1)
    raise RuntimeError(f"moto's server did not answer at {url} within {SERVER_START_S:.0f} s")


class Server(NamedTuple):
    url: str
    pid: int


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux's ``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def s3_server() -> Iterator[Server]:
    """moto's S3 server on a free local port, for as long as the block runs."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until_up(url, process)
        yield Server(url, process.pid)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@contextmanager
def no_server() -> Iterator[Server]:
    """In place of :func:`s3_server` when no workload reads from it."""
    yield Server("", 0)


# --- the checks -----------------------------------------------------------------------


class WrongBatch(Exception):
    """A batch not of the agreed form: its items cannot be counted."""


class Tally(NamedTuple):
    """What one of a bound's processes sends back instead of its batches: its checker's
    counts and findings (see :meth:`Checker.tally`)."""

    indices: np.ndarray  # the index of every item it delivered
    problems: list[str]
    batches: int
    partial: int
    first_at: float  # ``time.perf_counter()`` at its first batch (the clock is the machine's)


def tensor_of(value: Any, dtype: torch.dtype, what: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor) or value.dtype != dtype:
        raise WrongBatch(f"{what}: {type(value).__name__} {getattr(value, 'dtype', '')}, not a {dtype} tensor")
    return value


class Checker:
    """One epoch of ``n`` items (indices ``0 .. n-1``) as a loader delivers it: a count per
    index, the batch sizes, and what else is wrong; :meth:`finish` raises
    :class:`CheckFailed` unless every item came exactly once, in full batches (at most one
    partial batch per worker) of the right content."""

    batch_size: int | None = None  # items per full batch; None: items come one by one

    def __init__(self, n: int):
        self.n = n
        self.seen: list[np.ndarray] = []
        self.problems: list[str] = []
        self.batches = self.partial = 0

    @classmethod
    def for_part(cls, part: Part, manifest: Manifest) -> Checker:
        """The checker of an epoch over ``part``."""
        return cls(part.items)

    def inspect(self, batch: Any) -> np.ndarray:
        """The indices of a batch's items, after checking its content (see the subclasses)."""
        raise NotImplementedError

    def wrong(self, what: str) -> None:
        self.problems.append(f"batch {self.batches}: {what}")

    def see(self, batch: Any) -> None:
        """Check a batch (or an item) as it arrives."""
        self.batches += 1
        try:
            indices = self.inspect(batch)
        except WrongBatch as error:
            self.wrong(str(error))
            return
        if self.batch_size is not None:
            if not 0 < len(indices) <= self.batch_size:
                self.wrong(f"{len(indices)} items, not 1 to {self.batch_size}")
            self.partial += len(indices) < self.batch_size
        inside = (indices >= 0) & (indices < self.n)
        if not inside.all():
            self.wrong(f"indices outside 0..{self.n - 1}: {indices[~inside][:3].tolist()}")
        self.seen.append(indices[inside])

    def tally(self, first_at: float) -> Tally:
        """This checker's state, for the parent's checker to :meth:`absorb`."""
        seen = np.concatenate(self.seen) if self.seen else np.zeros(0, dtype=np.int64)
        return Tally(seen, self.problems, self.batches, self.partial, first_at)

    def absorb(self, tally: Tally) -> None:
        """Count a process's :meth:`tally` as if its batches had been seen here."""
        self.seen.append(tally.indices)
        self.problems += tally.problems
        self.batches += tally.batches
        self.partial += tally.partial

    def finish(self) -> None:
        problems = list(self.problems)
        delivered = np.concatenate(self.seen) if self.seen else np.zeros(0, dtype=np.int64)
        counts = np.bincount(delivered, minlength=self.n)
        missing, repeated = int((counts == 0).sum()), int((counts > 1).sum())
        if missing or repeated:
            problems.append(f"{missing} item(s) never delivered, {repeated} delivered more than once (of {self.n})")
        if self.batch_size is not None and self.partial > WORKERS:
            problems.append(f"{self.partial} batches of fewer than {self.batch_size} items, more than one per worker")
        if problems:
            raise CheckFailed("; ".join(problems[:5]))


class ImageCheck(Checker):
    """(a): ``(images, labels, indices)`` tensors; labels and crop fingerprints by index."""

    batch_size = IMAGE_BATCH

    def __init__(self, n: int, expected: np.ndarray):
        super().__init__(n)
        self.expected = expected

    @classmethod
    def for_part(cls, part: Part, manifest: Manifest) -> Checker:
        return cls(part.items, np.load(manifest.fingerprints))

    def inspect(self, batch: Any) -> np.ndarray:
        if not isinstance(batch, Sequence) or len(batch) != 3:
            raise WrongBatch(f"{type(batch).__name__}, not (images, labels, indices)")
        images = tensor_of(batch[0], torch.uint8, "images").numpy()
        labels = tensor_of(batch[1], torch.int64, "labels").numpy()
        indices = tensor_of(batch[2], torch.int64, "indices").numpy()
        if images.shape != (len(indices), CROP, CROP, 3) or labels.shape != indices.shape:
            raise WrongBatch(f"shapes {images.shape}, {labels.shape}, {indices.shape}")
        if not np.array_equal(labels, indices % CLASSES):
            self.wrong("labels do not match the keys")
        inside = (indices >= 0) & (indices < self.n)
        if not np.array_equal(fingerprints(images[inside]), self.expected[indices[inside]]):
            self.wrong("image content differs from the written images' crops")
        return indices


class RowCheck(Checker):
    """(b): ``{"id", "x", "label": tensor, "name": list}``; values by id."""

    batch_size = ROW_BATCH

    def inspect(self, batch: Any) -> np.ndarray:
        if not isinstance(batch, Mapping) or set(batch) != {"id", "x", "label", "name"}:
            raise WrongBatch(f"{type(batch).__name__} {sorted(batch) if isinstance(batch, Mapping) else ''}")
        ids = tensor_of(batch["id"], torch.int64, "id").numpy()
        x = tensor_of(batch["x"], torch.float64, "x").numpy()
        labels = tensor_of(batch["label"], torch.int64, "label").numpy()
        names = batch["name"]
        if not isinstance(names, list) or not len(names) == len(x) == len(labels) == len(ids):
            raise WrongBatch(f"name: {type(names).__name__}, or columns of different lengths")
        if not (np.array_equal(x, ids * 0.5) and np.array_equal(labels, ids % 10)):
            self.wrong("x or label do not match the ids")
        if len(ids) and (names[0] != row_name(ids[0]) or names[-1] != row_name(ids[-1])):
            self.wrong("name does not match the ids")
        return ids


class ObjectCheck(Checker):
    """(c): each item an object's bytes, its index in its first eight."""

    def inspect(self, batch: Any) -> np.ndarray:
        if not isinstance(batch, bytes):
            raise WrongBatch(f"{type(batch).__name__}, not bytes")
        if len(batch) != OBJECT_BYTES or not batch[:8].isdigit():
            raise WrongBatch(f"{len(batch)} bytes starting {batch[:8]!r}, not an object")
        index = int(batch[:8])
        if batch != object_bytes(index):
            self.wrong(f"object {index}'s bytes differ")
        return np.array([index], dtype=np.int64)


# --- the loaders ----------------------------------------------------------------------


class Session(NamedTuple):
    """A loader for one epoch: its batches, and how to shut it down (workers joined)."""

    batches: Iterable[Any]
    close: Callable[[], None]


def conveyor_session(pipe: Any, workers: int) -> Session:
    service = MultiProcessingReadingService(num_workers=workers) if workers else None
    loader = DataLoader2(pipe, reading_service=service)
    return Session(loader, loader.shutdown)


def conveyor_sample(sample: dict[str, Any]) -> tuple[np.ndarray, int, int]:
    """A sample of conveyor's ``webdataset()``: fields are in-memory streams."""
    return crop_item(sample["__key__"], sample[".jpg"].getvalue(), sample[".cls"].getvalue())


def wds_sample(sample: dict[str, Any]) -> tuple[np.ndarray, int, int]:
    """A sample of the webdataset package: fields are bytes."""
    return crop_item(sample["__key__"], sample["jpg"], sample["cls"])


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


class TarShardImages(IterableDataset):
    """(a) for torch's ``DataLoader``: each worker reads every ``num_workers``-th shard,
    from its worker id on."""

    def __init__(self, shards: Sequence[str]):
        self.shards = list(shards)

    def __iter__(self) -> Iterator[tuple[np.ndarray, int, int]]:
        info = get_worker_info()
        return shard_items(self.shards if info is None else self.shards[info.id :: info.num_workers])


def image_pipeline(shards: Sequence[str]) -> Any:
    """(a)'s graph for conveyor: the shards shared out, samples cropped, batched as tensors."""
    pipe = IterableWrapper(list(shards)).sharding_filter().open_files(mode="b").load_from_tar().webdataset()
    return pipe.map(conveyor_sample).batch(IMAGE_BATCH).collate(to_tensor=True)


def images_by_conveyor(part: Part, manifest: Manifest) -> Session:
    """(a), conveyor (see the module); so are the other ``*_by_*`` openers."""
    return conveyor_session(image_pipeline(part.sources), WORKERS)


def images_by_webdataset(part: Part, manifest: Manifest) -> Session:
    dataset = wds.WebDataset(part.sources, shardshuffle=False).map(wds_sample).batched(IMAGE_BATCH)
    return Session(wds.WebLoader(dataset, batch_size=None, num_workers=WORKERS), lambda: None)


def images_by_torch(part: Part, manifest: Manifest) -> Session:
    loader = DataLoader(TarShardImages(part.sources), batch_size=IMAGE_BATCH, num_workers=WORKERS)
    return Session(loader, lambda: None)  # its iterator ends its workers with the epoch


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


def send_tally(work: Callable[[int], Tally], worker: int, sender: Connection) -> None:
    """A bound's process: ``work(worker)``, its tally sent to the parent. One torch thread,
    as in the loaders' workers (torch's and conveyor's set it so)."""
    torch.set_num_threads(1)
    sender.send(work(worker))
    sender.close()


def forked_session(work: Callable[[int], Tally]) -> Session:
    """``WORKERS`` forked processes, process ``i`` running ``work(i)``; the batches are
    their tallies (nothing else crosses between the processes), the shutdown joins them."""
    context = multiprocessing.get_context("fork")
    pipes = [context.Pipe(duplex=False) for _ in range(WORKERS)]
    processes = [
        context.Process(target=send_tally, args=(work, worker, sender)) for worker, (_, sender) in enumerate(pipes)
    ]
    for process in processes:
        process.start()
    for _, sender in pipes:
        sender.close()  # the parent's copy: a process that dies makes its recv() raise EOFError

    def tallies() -> Iterator[Tally]:
        for receiver, _ in pipes:
            yield receiver.recv()

    def join() -> None:
        for process in processes:
            process.join()

    return Session(tallies(), join)


def image_tally(part: Part, manifest: Manifest, worker: int) -> Tally:
    """One process of (a)'s bound: a torch worker's shards and work, its batches checked here."""
    check = ImageCheck.for_part(part, manifest)
    first_at = read_epoch(collated(shard_items(part.sources[worker::WORKERS])), check, 0.0)
    return check.tally(first_at)


def images_bound(part: Part, manifest: Manifest) -> Session:
    return forked_session(functools.partial(image_tally, part, manifest))


def as_tensors(batch: dict[str, np.ndarray]) -> dict[str, Any]:
    """A batch of conveyor's ``load_parquet`` as torch's ``default_collate`` gives rows:
    numbers as tensors (copies: pyarrow's arrays are read-only), strings as a list."""
    return {name: torch.from_numpy(v.copy()) if v.dtype.kind in "biuf" else v.tolist() for name, v in batch.items()}


def rows_by_conveyor(part: Part, manifest: Manifest) -> Session:
    pipe = IterableWrapper(part.sources).load_parquet(batch_rows=ROW_BATCH).map(as_tensors)
    return conveyor_session(pipe, WORKERS)


def rows_by_hf(part: Part, manifest: Manifest) -> Session:
    import datasets

    table = datasets.Dataset.from_parquet(part.sources[0], cache_dir=manifest.hf_cache)
    stream = table.to_iterable_dataset(num_shards=part.groups)
    return Session(DataLoader(stream, batch_size=ROW_BATCH, num_workers=WORKERS), lambda: None)


def objects_by_threads(part: Part, manifest: Manifest) -> Session:
    read = functools.partial(read_object, manifest.endpoint)
    return conveyor_session(IterableWrapper(part.sources).threadpool_map(read, max_workers=THREADS), 0)


def objects_by_map(part: Part, manifest: Manifest) -> Session:
    read = functools.partial(read_object, manifest.endpoint)
    return conveyor_session(IterableWrapper(part.sources).map(read), 0)


def objects_by_executor(part: Part, manifest: Manifest) -> Session:
    """(c)'s bound: the reads through a plain thread pool, no loader."""
    executor = ThreadPoolExecutor(max_workers=THREADS)
    return Session(executor.map(functools.partial(read_object, manifest.endpoint), part.sources), executor.shutdown)


class Loader(NamedTuple):
    key: str  # its name on the command line of a run
    label: str  # its name in the table
    open: Callable[[Part, Manifest], Session]


@dataclass(frozen=True)
class Workload:
    key: str
    letter: str
    describe: str
    loaders: tuple[Loader, ...]  # the subject first, then the loaders it is compared with
    check: type[Checker]
    rate_target: float  # the subject's items/s over each other loader's, at least
    cpu_target: float | None = None  # the subject's CPU per item over each other loader's, at most
    reads_server: bool = False  # its runs also report the S3 server's CPU
    bound: Loader | None = None  # the same work without a loader: what the machine gives at most

    @property
    def runs(self) -> tuple[Loader, ...]:
        """Every loader of a run, the bound last."""
        return self.loaders + ((self.bound,) if self.bound else ())

    def loader(self, key: str) -> Loader:
        return next(loader for loader in self.runs if loader.key == key)

    def target(self) -> str:
        cpu = f", CPU/item <= {self.cpu_target:g}x" if self.cpu_target is not None else ""
        return f"items/s >= {self.rate_target:g}x{cpu}"


WORKLOADS = {
    w.key: w
    for w in (
        Workload(
            "images",
            "a",
            f"WebDataset JPEG shards -> batches of {IMAGE_BATCH} decoded {CROP}x{CROP} crops",
            (
                Loader("conveyor", "conveyor", images_by_conveyor),
                Loader("webdataset", f"webdataset {version('webdataset')} WebLoader", images_by_webdataset),
                Loader("torch", f"torch {version('torch')} DataLoader", images_by_torch),
            ),
            ImageCheck,
            1.5,
            0.7,
            bound=Loader("bound", f"no loader: the work alone in {WORKERS} processes (bound)", images_bound),
        ),
        Workload(
            "parquet",
            "b",
            f"Parquet rows -> batches of {ROW_BATCH} as columns",
            (
                Loader("conveyor", "conveyor", rows_by_conveyor),
                Loader("hf", f"datasets {version('datasets')} + torch DataLoader", rows_by_hf),
            ),
            RowCheck,
            2.0,
        ),
        Workload(
            "s3",
            "c",
            f"S3 objects of {OBJECT_BYTES // 1024} KiB, {LATENCY_S * 1000:.0f} ms per read",
            (
                Loader("threadpool_map", f"conveyor threadpool_map, {THREADS} threads", objects_by_threads),
                Loader("map", "conveyor map", objects_by_map),
            ),
            ObjectCheck,
            10.0,
            reads_server=True,
            bound=Loader("bound", f"ThreadPoolExecutor({THREADS}), no loader (bound)", objects_by_executor),
        ),
    )
}


# --- one run (a child process) --------------------------------------------------------


def read_epoch(batches: Iterable[Any], check: Checker, start: float) -> float:
    """Read and check every batch (a bound's process sends a :class:`Tally` of its own
    batches instead); seconds from ``start`` to the first batch (``inf``: none)."""
    first_at = math.inf
    for batch in batches:
        if isinstance(batch, Tally):
            first_at = min(first_at, batch.first_at)
            check.absorb(batch)
        else:
            first_at = min(first_at, time.perf_counter())
            check.see(batch)
    return first_at - start


def epoch(open_loader: Callable[[], Session], check: Checker, server_pid: int) -> dict[str, float]:
    """One checked epoch, timed from the loader's creation to its shutdown (and the CPU
    the server ``server_pid`` used meanwhile, when there is one)."""
    gc.collect()  # the previous epoch's garbage is not this one's work
    before = set(multiprocessing.active_children())
    session: Session | None = None
    server_cpu = process_cpu_seconds(server_pid) if server_pid else 0.0
    cpu, start = cpu_seconds(), time.perf_counter()
    try:
        session = open_loader()
        first_s = read_epoch(session.batches, check, start)
        done, session = session, None
        done.close()
        stray = end_new_processes(before)
        wall_s, cpu_s = time.perf_counter() - start, cpu_seconds() - cpu
        server_cpu_s = process_cpu_seconds(server_pid) - server_cpu if server_pid else 0.0
    finally:
        if session is not None:
            session.close()
        end_new_processes(before)
    if stray:
        check.problems.append(f"{stray} worker process(es) still running after the shutdown")
    check.finish()
    return {"wall_s": wall_s, "first_s": first_s, "cpu_s": cpu_s, "server_cpu_s": server_cpu_s, "items": check.n}


def child(workload_key: str, loader_key: str, manifest_path: str) -> int:
    """A run: the warm-up epoch, then the timed one, printed as one JSON line."""
    manifest, workload = Manifest.load(manifest_path), WORKLOADS[workload_key]
    loader = workload.loader(loader_key)
    server_pid = manifest.server_pid if workload.reads_server else 0
    result: dict[str, float] = {}
    for part in (manifest.parts[workload.key]["warm"], manifest.parts[workload.key]["timed"]):
        check = workload.check.for_part(part, manifest)
        result = epoch(functools.partial(loader.open, part, manifest), check, server_pid)
    print(json.dumps(result), flush=True)
    return 0


# --- the parent: data, runs, table ----------------------------------------------------


@dataclass
class Row:
    """One loader on one workload: its runs, or why some failed."""

    workload: Workload
    loader: Loader
    runs: list[dict[str, Any]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def median(self, what: str) -> float:
        return statistics.median(run[what] for run in self.runs)

    @property
    def rate(self) -> float:
        """Items per second: items per run over the median wall time."""
        return self.runs[0]["items"] / self.median("wall_s")

    @property
    def cpu_us(self) -> float:
        """Median CPU of a run (all its processes), in µs per item."""
        return self.median("cpu_s") / self.runs[0]["items"] * 1e6

    @property
    def is_bound(self) -> bool:
        return self.loader is self.workload.bound

    @property
    def server_cpu_us(self) -> float:
        """Median CPU of the S3 server over a run, in µs per item (0: no server)."""
        return self.median("server_cpu_s") / self.runs[0]["items"] * 1e6


def prepare(root: Path, keys: Sequence[str], sizes: Sizes, server: Server) -> Manifest:
    """Write the selected workloads' data under ``root``."""
    parts: dict[str, dict[str, Part]] = {}
    prints = hf_cache = ""
    if "images" in keys:
        parts["images"], prints = write_shards(root, sizes)
    if "parquet" in keys:
        hf_cache = str(root / "hf" / "datasets")
        parts["parquet"] = write_tables(root, sizes, hf_cache)
    if "s3" in keys:
        parts["s3"] = put_objects(server.url, sizes)
    return Manifest(parts, prints, hf_cache, server.url, server.pid)


def measure(workload: Workload, loader: Loader, manifest_path: Path) -> tuple[dict[str, Any] | None, str]:
    """One run in a fresh process: ``(result, '')`` or ``(None, why it failed)``."""
    command = [sys.executable, os.path.abspath(__file__), "--one", workload.key, loader.key, str(manifest_path)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return None, f"no result within {RUN_TIMEOUT_S:.0f} s"
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        sys.stderr.write(done.stderr)
        tail = [line for line in done.stderr.strip().splitlines() if line.strip()][-1:] or [""]
        return None, f"exit code {done.returncode}: {tail[0][:300]}".rstrip(": ")
    return json.loads(lines[-1]), ""


def run(workloads: Sequence[Workload], repeats: int, manifest: Manifest, manifest_path: Path) -> list[Row]:
    """Every loader of every workload, ``repeats`` fresh-process runs each, alternating."""
    rows: list[Row] = []
    for workload in workloads:
        group = [Row(workload, loader) for loader in workload.runs]
        rows.extend(group)
        items = manifest.parts[workload.key]["timed"].items
        print(f"({workload.letter}) {workload.key}: {items:,} items, {repeats} run(s) per loader", file=sys.stderr)
        for repeat in range(repeats):
            for row in group:
                result, why = measure(workload, row.loader, manifest_path)
                if result is None:
                    row.failures.append(f"run {repeat + 1}: {why}")
                else:
                    row.runs.append(result)
                progress = f"{result['wall_s']:.2f} s" if result else "failed"
                print(f"  {row.loader.key} run {repeat + 1}: {progress}", file=sys.stderr, flush=True)
    return rows


def compare(subject: Row, other: Row) -> list[str]:
    """The ratio cells of ``other``'s row: items/s and CPU/item of ``subject`` over it, its
    target and whether it held."""
    w = subject.workload
    if not (subject.runs and other.runs):
        return ["", "", w.target(), "not measured (a loader failed)"]
    rate, cpu = subject.rate / other.rate, subject.cpu_us / other.cpu_us
    rate_ok = rate >= w.rate_target
    # Three decimals here: at two, a ratio just past its target would read as equal to it.
    held = [f"{rate:.3f}x {'>=' if rate_ok else '<'} {w.rate_target:g}x"]
    if w.cpu_target is not None:
        cpu_ok = cpu <= w.cpu_target
        held.append(f"CPU {cpu:.3f}x {'<=' if cpu_ok else '>'} {w.cpu_target:g}x")
        rate_ok = rate_ok and cpu_ok
    return [f"{rate:.2f}x", f"{cpu:.2f}x", w.target(), f"{'yes' if rate_ok else 'no'} ({'; '.join(held)})"]


HEADER = (
    "workload",
    "loader",
    "items/s",
    "CPU µs/item",
    "first batch ms",
    "runs ok",
    "of the bound: items/s, CPU/item",
    "items/s ratio",
    "CPU/item ratio",
    "target (first row vs this)",
    "held in this run",
)


def bound_of(rows: Sequence[Row], workload: Workload) -> Row | None:
    """``workload``'s bound row, if it has one that was measured."""
    return next((row for row in rows if row.workload is workload and row.is_bound and row.runs), None)


def report(rows: Sequence[Row]) -> str:
    """The Markdown table (medians), then the failures in full."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    notes: list[str] = []
    subjects = {row.workload.key: row for row in reversed(rows)}  # each workload's first row
    bounds = {row.workload.key: bound_of(rows, row.workload) for row in rows}
    for row in rows:
        w = row.workload
        cells = [f"({w.letter}) {w.key}", row.loader.label]
        if row.runs:
            cells += [f"{row.rate:,.0f}", f"{row.cpu_us:,.1f}", f"{row.median('first_s') * 1000:,.1f}"]
        else:
            cells += ["failed", "", ""]
        cells.append(f"{len(row.runs)}/{len(row.runs) + len(row.failures)}")
        bound = bounds[w.key]
        share = bool(row.runs) and bound is not None and not row.is_bound
        cells.append(f"{row.rate / bound.rate:.0%}, {row.cpu_us / bound.cpu_us:.0%}" if share else "")
        subject = subjects[w.key]
        cells += ["", "", "", ""] if row is subject or row.is_bound else compare(subject, row)
        lines.append("| " + " | ".join(cells) + " |")
        notes += [f"- {w.key}, {row.loader.key}: {failure}" for failure in dict.fromkeys(row.failures)]
    return "\n".join(lines + (["", "failed runs:", *notes] if notes else []))


def server_cpu(rows: Sequence[Row]) -> list[str]:
    """What the S3 server's process used besides the loaders' CPU, per row that reads it."""
    return [
        f"({row.workload.letter}) {row.loader.label}: the S3 server used {row.server_cpu_us:,.1f} µs of CPU per item "
        "besides (median; not in the table's CPU column)"
        for row in rows
        if row.workload.reads_server and row.runs
    ]


def against_bound(rows: Sequence[Row]) -> list[str]:
    """What each target asks of the bound: the items/s (and CPU per item) the subject would
    need against each other loader, as a share of the bound's."""
    lines = []
    for w in dict.fromkeys(row.workload for row in rows):
        bound = bound_of(rows, w)
        if bound is None:
            continue
        lines.append(f"({w.letter}) bound: {bound.rate:,.0f} items/s, {bound.cpu_us:,.1f} µs CPU/item")
        for other in (row for row in rows if row.workload is w and row.loader in w.loaders[1:] and row.runs):
            rate = w.rate_target * other.rate
            line = (
                f"({w.letter}) {w.rate_target:g}x {other.loader.label}'s rate is {rate:,.0f} items/s "
                f"= {rate / bound.rate:.0%} of the bound"
            )
            if w.cpu_target is not None:
                cpu = w.cpu_target * other.cpu_us
                line += f"; {w.cpu_target:g}x its CPU/item is {cpu:,.1f} µs = {cpu / bound.cpu_us:.0%} of the bound's"
            lines.append(line)
    return lines


def targets(rows: Sequence[Row]) -> list[str]:
    """One line per workload: its target against all the other loaders, and whether it held."""
    lines = []
    for w in dict.fromkeys(row.workload for row in rows):
        group = [row for row in rows if row.workload is w and not row.is_bound]
        subject, others = group[0], group[1:]
        verdicts = [compare(subject, other)[3] for other in others]
        held = "yes" if all(v.startswith("yes") for v in verdicts) else "no"
        against = " and ".join(other.loader.label for other in others)
        details = "; ".join(f"vs {other.loader.label}: {v}" for other, v in zip(others, verdicts, strict=True))
        lines.append(f"({w.letter}) {subject.loader.label}: {w.target()} of {against}: {held} ({details})")
    return lines


def machine_line() -> str:
    packages = ("conveyor", "torch", "numpy", "Pillow", "webdataset", "pyarrow", "datasets", "s3fs", "moto")
    return (
        f"machine: {platform.system()} {platform.release()} {platform.machine()}, {os.cpu_count()} CPUs, "
        f"python {platform.python_version()}, {', '.join(f'{p} {version(p)}' for p in packages)}, "
        f"start method {multiprocessing.get_start_method()}; date {datetime.date.today().isoformat()}"
    )


def stop_on_sigterm() -> None:
    """SIGTERM ends the parent as an exception does, so that its ``finally`` blocks stop
    moto's server and remove the data."""

    def leave(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, leave)


def benchmark(keys: Sequence[str], repeats: int, scale: float) -> tuple[list[Row], Manifest]:
    """Write the data, start the server, run every loader; all of it removed at the end."""
    with tempfile.TemporaryDirectory(prefix="bench_real_data-") as tmp:
        root = Path(tmp)
        # Hugging Face: nothing from the network, nothing in the home directory.
        os.environ.update({"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(root / "hf")})
        with s3_server() if "s3" in keys else no_server() as server:
            started = time.perf_counter()
            manifest = prepare(root, keys, Sizes.at(scale), server)
            print(f"data written in {time.perf_counter() - started:.0f} s", file=sys.stderr)
            manifest.save(root / "manifest.json")
            return run([WORKLOADS[k] for k in keys], repeats, manifest, root / "manifest.json"), manifest


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, run, print the table; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--one"]:  # a child: one run, one JSON line (an exception fails it)
        return child(args[1], args[2], args[3])
    parser = argparse.ArgumentParser(description=" ".join((__doc__ or "").split("\n\n", 1)[0].split()))
    parser.add_argument("--repeats", type=int, default=3, help="fresh-process runs per loader and workload (3)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies every workload's size (1)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, of {','.join(WORKLOADS)}")
    options = parser.parse_args(args)
    keys = [k for k in options.workloads.split(",") if k]
    unknown = [k for k in keys if k not in WORKLOADS]
    if unknown or not keys:
        parser.error(f"unknown workload(s) {','.join(unknown)}; choose from {','.join(WORKLOADS)}")
    if options.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {options.repeats}")
    if not options.scale > 0:
        parser.error(f"--scale must be > 0, got {options.scale}")
    stop_on_sigterm()
    print(machine_line())
    print(
        f"settings: workloads={','.join(keys)} workers={WORKERS} repeats={options.repeats} scale={options.scale:g}; "
        f"load {os.getloadavg()[0]:.2f} at the start"
    )
    started = time.perf_counter()
    rows, manifest = benchmark(keys, options.repeats, options.scale)
    for key in keys:
        w = WORKLOADS[key]
        print(f"({w.letter}) {key}: {manifest.parts[key]['timed'].items:,} items, {w.describe}")
    print(report(rows))
    print(
        "items/s: items per run over the median wall time (loader creation to shutdown, workers joined); "
        "CPU µs/item: median CPU of the run's processes (main and workers) per item; first batch: loader "
        "creation to the first batch (the bound: its processes' first); of the bound: this row's items/s and "
        "CPU/item over the bound's; ratios: the workload's first row over this row. Medians over the runs."
    )
    print("\n".join(server_cpu(rows)))
    print("the targets against the bound (the same work without a loader):")
    print("\n".join(against_bound(rows)))
    print("targets:")
    print("\n".join(targets(rows)))
    print(f"load {os.getloadavg()[0]:.2f} at the end; {time.perf_counter() - started:.0f} s")
    failed = any(row.failures for row in rows)
    print("verification FAILED: see the failed runs above" if failed else "verification passed for every run")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
