"""``conveyor demo``: a small image-classification job, end to end, on generated local files.

It generates a synthetic dataset of ``.npz`` shards once (cached, reused while its
parameters match), reads it for a few epochs through a realistic graph (shard shuffle,
sharding point, decode, item shuffle, per-item random augmentation, batching, collation)
in worker processes, trains a tiny model on it, checkpoints mid-run and proves that a
resumed run continues exactly. Modules: ``dataset`` (files), ``pipeline`` (the graph),
``model`` (the classifier), ``training`` (the run and its report). Internal: the command
is the interface, not these modules.
"""

from conveyor.tools.demo.dataset import (
    MANIFEST,
    NUM_CLASSES,
    DemoError,
    default_data_dir,
    prepare_dataset,
    shard_name,
)
from conveyor.tools.demo.pipeline import Item, augment, build_pipeline, load_shard
from conveyor.tools.demo.training import DemoConfig, EpochStats, epoch_label_orders, make_loader, run_demo

__all__ = [
    "MANIFEST",
    "NUM_CLASSES",
    "DemoConfig",
    "DemoError",
    "EpochStats",
    "Item",
    "augment",
    "build_pipeline",
    "default_data_dir",
    "epoch_label_orders",
    "load_shard",
    "make_loader",
    "prepare_dataset",
    "run_demo",
    "shard_name",
]
