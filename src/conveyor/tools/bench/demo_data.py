"""The ``demo`` workload's datasets: ``conveyor demo``'s shard files, one dataset per size,
generated before the runs (never in a timed epoch) and reused by later benchmarks.

The size of a dataset is a whole number of equal shards, so a workload of ``n`` images
reads :func:`demo_size` ``(n)`` of them: ``conveyor bench`` asks for that many.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

import numpy as np

from conveyor.tools.bench.errors import BenchError

#: The demo's item shape: a float32 image after augmentation.
DEMO_IMAGE_BYTES = 3 * 32 * 32 * 4
DEMO_BATCH_SIZE = 64
DEMO_SHUFFLE_BUFFER = 1024


def default_demo_root() -> Path:
    """Beside ``conveyor demo``'s own cache, not in it: a dataset of another size there
    would make each command regenerate the other's files."""
    from conveyor.tools.demo import default_data_dir

    return default_data_dir().with_name("bench-demo")


def demo_layout(n: int) -> tuple[int, int]:
    """``(shards, items_per_shard)`` for about ``n`` images: 256 per shard, at least 4
    shards (so that workers share them) and at most 16 (then bigger shards)."""
    shards = max(min(4, n), min(16, n // 256))
    return shards, max(1, n // shards)


def demo_size(n: int) -> int:
    """The images of the dataset made for about ``n``."""
    shards, per_shard = demo_layout(n)
    return shards * per_shard


def demo_warmup(n: int) -> int:
    """A warm-up epoch's images (a dataset of its own): enough for first calls, not more."""
    return demo_size(min(n, max(8, n // 50)))


def demo_dir(root: str | Path, n: int) -> Path:
    """Where the dataset of about ``n`` images is, under ``root``."""
    shards, per_shard = demo_layout(n)
    return Path(root) / f"{shards}x{per_shard}"


def prepare_demo(root: Path, n: int) -> str:
    """Generate (or reuse) the dataset of about ``n`` images under ``root``; a line saying
    what was done, for the report."""
    from conveyor.tools.demo import DemoError, prepare_dataset

    shards, per_shard = demo_layout(n)
    data_dir = demo_dir(root, n)
    start = time.perf_counter()
    try:
        made = prepare_dataset(data_dir, shards, per_shard)
    except (DemoError, OSError) as err:
        raise BenchError(f"demo dataset in {str(data_dir)!r}: {err}") from err
    took = time.perf_counter() - start
    return f"{data_dir} ({shards} x {per_shard} images, {'generated' if made else 'reused'} in {took:.2f} s)"


@functools.cache
def demo_labels(data_dir: Path) -> np.ndarray:
    """The label of each image of the dataset in ``data_dir``, by its index."""
    files = sorted(data_dir.glob("*.npz"))
    if not files:
        raise BenchError(f"no demo dataset in {str(data_dir)!r}")
    parts = []
    for path in files:
        with np.load(path) as data:
            parts.append((data["index"], data["labels"]))
    labels = np.zeros(sum(len(index) for index, _ in parts), dtype=np.int64)
    for index, part in parts:
        labels[index] = part
    return labels
