"""``conveyor demo``: a small image-classification input pipeline, end to end, on local files.

It generates a tiny synthetic dataset of ``.npz`` shards once (cached, reused while its
parameters match), then reads it for a few epochs through a realistic graph (shard
shuffle, sharding point, decode, item shuffle, per-item random augmentation, batching,
collation) and reports throughput and that every item was seen exactly once per epoch.

Everything used inside the graph is a module-level function, so the same graph also runs
under multiprocess reading services (they pickle it).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from conveyor.dataloader2 import DataLoader2
from conveyor.errors import ConveyorError
from conveyor.graph import list_dps
from conveyor.pipes import FileLister, IterableWrapper, IterDataPipe
from conveyor.reading_service.multiprocessing import MultiProcessingReadingService

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "conveyor-demo-dataset"
MANIFEST_VERSION = 1
#: Seed of the dataset's content (not of the loader): the same parameters give the same bytes.
DATA_SEED = 20240601
IMAGE_SHAPE = (3, 32, 32)
NUM_CLASSES = 10
CROP_PADDING = 4
# Per-channel statistics used to normalize; uniform uint8 noise has mean 127.5, std ~73.9.
MEAN = np.full((3, 1, 1), 127.5 / 255, dtype=np.float32)
STD = np.full((3, 1, 1), 73.9 / 255, dtype=np.float32)

_SHARD_NAME = re.compile(r"shard-\d{5}\.npz")

#: One item as it flows through the graph: ``(image, label, index)``. ``index`` is the
#: item's global id in the dataset; the demo uses it to check nothing is lost or repeated.
Item = tuple[np.ndarray, np.int64, np.int64]


class DemoError(ConveyorError):
    """A problem with the demo's inputs (e.g. an unusable data directory), not a bug."""


@dataclass(frozen=True)
class DemoConfig:
    """What ``conveyor demo`` generates and how it reads it."""

    data_dir: Path
    shards: int = 8
    items_per_shard: int = 256
    batch_size: int = 64
    epochs: int = 2
    seed: int = 0
    shuffle_buffer: int = 1024
    workers: int = 2
    progress: bool = True

    @property
    def items(self) -> int:
        return self.shards * self.items_per_shard


@dataclass(frozen=True)
class EpochStats:
    """What one epoch delivered, for the report."""

    epoch: int
    items: int
    distinct: int
    batches: int
    seconds: float

    @property
    def items_per_second(self) -> float:
        return self.items / self.seconds if self.seconds > 0 else float("inf")


# --- dataset ---------------------------------------------------------------------------


def default_data_dir() -> Path:
    """The per-user cache folder (``$XDG_CACHE_HOME/conveyor/demo``, else ``~/.cache/...``),
    so repeated runs reuse one generated dataset."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "conveyor" / "demo"


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.npz"


def _expected_manifest(shards: int, items_per_shard: int) -> dict[str, Any]:
    return {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "data_seed": DATA_SEED,
        "shards": shards,
        "items_per_shard": items_per_shard,
        "image_shape": list(IMAGE_SHAPE),
        "num_classes": NUM_CLASSES,
        "files": [shard_name(i) for i in range(shards)],
    }


def _read_manifest(data_dir: Path) -> dict[str, Any] | None:
    try:
        with open(data_dir / MANIFEST, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def _is_reusable(data_dir: Path, expected: dict[str, Any]) -> bool:
    manifest = _read_manifest(data_dir)
    if manifest is None or manifest.get("sizes") is None:
        return False
    if {k: v for k, v in manifest.items() if k != "sizes"} != expected:
        return False
    sizes = manifest["sizes"]
    if not isinstance(sizes, dict):
        return False
    for name in expected["files"]:
        path = data_dir / name
        if not path.is_file() or path.stat().st_size != sizes.get(name):
            return False
    return {p.name for p in data_dir.glob("*.npz")} == set(expected["files"])  # the graph reads every *.npz


def _write_atomically(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Write through a temporary file in the same folder, then rename it over ``path``:
    readers (and an interrupted run) never see a half-written file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "xb") as f:  # unlike mkstemp, honours the umask
            write(f)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _generate_shard(index: int, items_per_shard: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([DATA_SEED, index])
    return {
        "images": rng.integers(0, 256, size=(items_per_shard, *IMAGE_SHAPE), dtype=np.uint8),
        "labels": rng.integers(0, NUM_CLASSES, size=items_per_shard, dtype=np.int64),
        "index": np.arange(index * items_per_shard, (index + 1) * items_per_shard, dtype=np.int64),
    }


def prepare_dataset(data_dir: Path, shards: int, items_per_shard: int) -> bool:
    """Make sure ``data_dir`` holds the dataset for these parameters; return whether it
    had to be (re)generated. Reuse is decided by the manifest, written last, so an
    interrupted generation is redone rather than trusted.
    """
    if shards < 1 or items_per_shard < 1:
        raise DemoError("shards and items_per_shard must be >= 1")
    data_dir = Path(data_dir)
    expected = _expected_manifest(shards, items_per_shard)
    if _is_reusable(data_dir, expected):
        return False
    if data_dir.exists() and not data_dir.is_dir():
        raise DemoError(f"data dir {str(data_dir)!r} exists and is not a directory")
    data_dir.mkdir(parents=True, exist_ok=True)
    # The graph reads every *.npz in the folder: refuse foreign ones, remove stale shards.
    foreign = sorted(p.name for p in data_dir.glob("*.npz") if not _SHARD_NAME.fullmatch(p.name))
    if foreign:
        raise DemoError(
            f"data dir {str(data_dir)!r} holds .npz files the demo did not write ({', '.join(foreign[:3])}"
            f"{', ...' if len(foreign) > 3 else ''}); use an empty or dedicated --data-dir"
        )
    (data_dir / MANIFEST).unlink(missing_ok=True)
    wanted = set(expected["files"])
    for stale in data_dir.glob("shard-*.npz"):
        if stale.name not in wanted:
            stale.unlink()
    sizes: dict[str, int] = {}
    for index, name in enumerate(expected["files"]):
        arrays = _generate_shard(index, items_per_shard)
        _write_atomically(data_dir / name, lambda f, arrays=arrays: np.savez(f, **arrays))
        sizes[name] = (data_dir / name).stat().st_size
    manifest = json.dumps({**expected, "sizes": sizes}, indent=2, sort_keys=True).encode()
    _write_atomically(data_dir / MANIFEST, lambda f: f.write(manifest))
    return True


# --- the graph's functions (module-level: picklable) -------------------------------------


def load_shard(path: str) -> Iterator[Item]:
    """Decode one shard into ``(image, label, index)`` items. The file is read whole and
    closed before the first item, so an epoch abandoned mid-shard leaks no handle."""
    with np.load(path) as data:
        images, labels, index = data["images"], data["labels"], data["index"]
    for i in range(len(labels)):
        yield images[i], labels[i], index[i]


def augment(item: Item, rng: np.random.Generator) -> Item:
    """Random horizontal flip and random crop after zero padding (the usual CIFAR recipe),
    then float32 normalization. ``rng`` comes from ``random_map``: keyed by the item's
    position, so the result is the same however many workers share the epoch."""
    image, label, index = item
    if rng.random() < 0.5:
        image = image[:, :, ::-1]
    _, height, width = image.shape
    padded = np.pad(image, ((0, 0), (CROP_PADDING, CROP_PADDING), (CROP_PADDING, CROP_PADDING)))
    top, left = rng.integers(0, 2 * CROP_PADDING + 1, size=2)
    crop = padded[:, top : top + height, left : left + width]
    normalized = (crop.astype(np.float32) * np.float32(1 / 255) - MEAN) / STD
    return normalized, label, index


def build_pipeline(data_dir: str | os.PathLike[str], batch_size: int = 64, shuffle_buffer: int = 1024) -> IterDataPipe:
    """The demo graph. Shards are shuffled before the sharding point (so every worker or
    rank agrees on the order and takes its share of files), items are shuffled within a
    buffer after decoding (a batch mixes shards), and augmentation is per item."""
    pipe: IterDataPipe = FileLister(os.fspath(data_dir), masks="*.npz")
    pipe = pipe.shuffle()
    pipe = pipe.sharding_filter()
    pipe = pipe.flatmap(load_shard)
    if shuffle_buffer > 1:
        pipe = pipe.shuffle(buffer_size=shuffle_buffer)
    pipe = pipe.random_map(augment)
    pipe = pipe.batch(batch_size)
    return pipe.collate()


def _epochs(config: DemoConfig) -> Iterator[Iterator[Any]]:
    """One batch iterator per epoch, from a single seeded ``DataLoader2``."""
    pipe = build_pipeline(config.data_dir, config.batch_size, config.shuffle_buffer)
    service = MultiProcessingReadingService(num_workers=config.workers)
    with DataLoader2(pipe, reading_service=service) as loader:
        loader.seed(config.seed)
        for _ in range(config.epochs):
            yield iter(loader)


def epoch_label_orders(config: DemoConfig) -> list[list[int]]:
    """The label sequence each epoch delivers (the dataset must exist): what the tests
    compare to show that epochs differ and runs with the same seed do not."""
    return [[int(label) for _, labels, _ in batches for label in labels] for batches in _epochs(config)]


# --- reporting ---------------------------------------------------------------------------


class _TextProgress:
    """Stand-in for tqdm when it is not installed: one line when the epoch ends."""

    def __init__(self, total: int, desc: str, stream: IO[str]):
        self.total, self.desc, self.stream, self.n = total, desc, stream, 0

    def update(self, n: int) -> None:
        self.n += n

    def close(self) -> None:
        print(f"{self.desc}: {self.n}/{self.total} items", file=self.stream, flush=True)


class _NoProgress:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(total: int, desc: str, stream: IO[str], enabled: bool) -> Any:
    if not enabled:
        return _NoProgress()
    try:
        from tqdm import tqdm
    except ImportError:
        return _TextProgress(total, desc, stream)
    return tqdm(total=total, desc=desc, unit="img", file=stream, leave=True, dynamic_ncols=True)


def run_epochs(config: DemoConfig, err: IO[str] | None = None) -> list[EpochStats]:
    """Read ``config.epochs`` epochs, timing each from its ``iter()`` to its last batch."""
    err = err if err is not None else sys.stderr
    stats = []
    epochs = _epochs(config)
    try:
        for epoch in range(config.epochs):
            bar = _progress(config.items, f"epoch {epoch + 1}/{config.epochs}", err, config.progress)
            seen: set[int] = set()
            items = batches = 0
            try:
                start = time.perf_counter()
                for _images, _labels, index in next(epochs):
                    items += len(index)
                    batches += 1
                    seen.update(index.tolist())
                    bar.update(len(index))
                seconds = time.perf_counter() - start
            finally:
                bar.close()
            stats.append(EpochStats(epoch, items, len(seen), batches, seconds))
    finally:
        epochs.close()  # shuts the loader down now, not whenever the generator is collected
    return stats


def run_demo(config: DemoConfig, out: IO[str] | None = None, err: IO[str] | None = None) -> int:
    """Generate (or reuse) the dataset, read it, print the report; 1 if items went missing."""
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    start = time.perf_counter()
    generated = prepare_dataset(config.data_dir, config.shards, config.items_per_shard)
    print(
        f"dataset: {config.data_dir} ({config.shards} shards x {config.items_per_shard} items, "
        f"{'generated' if generated else 'reused'} in {time.perf_counter() - start:.2f} s)",
        file=out,
        flush=True,
    )
    graph = build_pipeline(config.data_dir, config.batch_size, config.shuffle_buffer)
    nodes = [repr(node) for node in reversed(list_dps(graph)) if not isinstance(node, IterableWrapper)]
    print(f"pipeline (seed={config.seed}):\n    " + "\n -> ".join(nodes), file=out, flush=True)
    stats = run_epochs(config, err)
    for s in stats:
        print(
            f"epoch {s.epoch + 1}/{config.epochs}: items={s.items} distinct={s.distinct} batches={s.batches} "
            f"seconds={s.seconds:.3f} items/s={s.items_per_second:,.0f}",
            file=out,
            flush=True,
        )
    items = sum(s.items for s in stats)
    seconds = sum(s.seconds for s in stats)
    print(
        f"total: epochs={len(stats)} items={items} batches={sum(s.batches for s in stats)} "
        f"seconds={seconds:.3f} items/s={items / seconds if seconds > 0 else float('inf'):,.0f}",
        file=out,
        flush=True,
    )
    bad = [s.epoch + 1 for s in stats if s.items != config.items or s.distinct != config.items]
    if bad:
        print(
            f"conveyor demo: error: epochs {bad} did not deliver each of the {config.items} items exactly once",
            file=err,
        )
        return 1
    return 0
