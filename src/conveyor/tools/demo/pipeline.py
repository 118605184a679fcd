"""The demo's pipeline: shard files in, augmented and collated batches out.

Every function the graph calls lives at module level, so the graph also runs in worker
processes under any start method (they receive it pickled).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np

from conveyor.pipes import FileLister, IterDataPipe

CROP_PADDING = 4
# Per-channel statistics used to normalize: the generated pixels have mean ~128, std ~52.
MEAN = np.full((3, 1, 1), 128 / 255, dtype=np.float32)
STD = np.full((3, 1, 1), 52 / 255, dtype=np.float32)

#: One item as it flows through the graph: ``(image, label, index)``. ``index`` is the
#: item's global id in the dataset; the demo uses it to check nothing is lost or repeated.
Item = tuple[np.ndarray, np.int64, np.int64]


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
