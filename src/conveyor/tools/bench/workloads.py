"""The five workloads of ``conveyor bench``, each run by every loader with the same work.

A comparison between loaders means something only when each one does the same work and
delivers the same items. So a workload is defined once, here, for all of them: for a run
of ``n`` items it builds the conveyor graph, the ``torch.utils.data.IterableDataset`` and
the torchdata graph, and its harness ``Workload`` says how a run counts what a loader
delivered (:mod:`conveyor.tools.bench.tallies`) and what that count must come to.

- ``small``: ``range(n)``, identity: the per-item cost of moving an item between processes.
- ``numpy`` / ``tensor``: 1 MiB uint8 arrays / tensors: moving bulk data.
- ``cpu``: a deterministic ~1 ms of numpy FFTs per item: workers doing real work.
- ``demo``: the ``conveyor demo`` pipeline (shard files, shard shuffle, decode, item
  shuffle buffer, per-item random augmentation, batches of 64, collation) on generated
  files (:mod:`conveyor.tools.bench.demo_data`); the torch side does the same per worker
  in an ``IterableDataset``.

Every function a graph calls lives at module level (:mod:`conveyor.tools.bench.per_item`),
so the graphs pickle under every start method. Nothing here imports torch or torchdata at
import time.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from conveyor.tools.bench.demo_data import (
    DEMO_BATCH_SIZE,
    DEMO_IMAGE_BYTES,
    DEMO_SHUFFLE_BUFFER,
    demo_dir,
    demo_warmup,
)
from conveyor.tools.bench.harness.declare import Context, Workload
from conveyor.tools.bench.per_item import (
    CPU_FFT_SIZE,
    CPU_ROUNDS,
    DEMO_SEED,
    MIB,
    augment_keyed,
    cpu_heavy,
    cpu_value,
    identity,
    numpy_mib,
    tensor_mib,
)
from conveyor.tools.bench.tallies import array_tally, demo_tally, pair_tally, small_tally

#: The function each range-based workload applies to ``range(n)``.
ITEM_FUNCTIONS = {"small": identity, "numpy": numpy_mib, "tensor": tensor_mib, "cpu": cpu_heavy}


def cpu_checksum(context: Context) -> float:
    """The sum of the ``cpu`` items' floats (each item computed here: ~1 ms each)."""
    return math.fsum(cpu_value(i) for i in range(context.items))


WORKLOADS = (
    Workload("small", 200_000, 30_000, "ints, fn = identity", tally=small_tally),
    Workload(
        "numpy",
        2_000,
        500,
        "numpy uint8 arrays of 1 MiB, fn = np.full (the id in the first 8 bytes)",
        tally=array_tally,
        item_bytes=MIB,
    ),
    Workload(
        "tensor",
        2_000,
        500,
        "torch uint8 tensors of 1 MiB, fn = torch.full (the id in the first 8 bytes)",
        tally=array_tally,
        item_bytes=MIB,
    ),
    Workload(
        "cpu",
        4_000,
        1_000,
        f"(id, float) pairs, the float from {CPU_ROUNDS} rounds of numpy FFT filtering of {CPU_FFT_SIZE} "
        "samples (~1 ms)",
        tally=pair_tally,
        expected=cpu_checksum,
    ),
    Workload(
        "demo",
        8192,
        4096,
        f"images 3x32x32 in 4 to 16 .npz shards, the demo pipeline (shard shuffle, sharding, decode, shuffle "
        f"buffer {DEMO_SHUFFLE_BUFFER}, random flip+crop+normalize, batches of {DEMO_BATCH_SIZE}, collate)",
        tally=demo_tally,
        item_bytes=DEMO_IMAGE_BYTES,
        unit="images",
        warmup=demo_warmup,
        cappable=False,  # its files are made for the count asked
    ),
)


def output_note(workload: str, loader: str) -> str:
    """What ``loader`` yields on ``workload`` when it differs from conveyor ('' when not)."""
    if loader == "torch" and workload == "numpy":
        return "yields torch tensors here (its default_convert), the others numpy arrays"
    if loader != "conveyor" and workload == "demo":
        return "yields torch tensors here (torch's default_collate), conveyor numpy arrays"
    return ""


# --- what each loader reads (in a run's process) -------------------------------------------


def conveyor_pipe(context: Context) -> Any:
    """The conveyor ``IterDataPipe`` graph of the run's workload."""
    if context.workload.key == "demo":
        from conveyor.tools.demo import build_pipeline

        return build_pipeline(_data_dir(context), DEMO_BATCH_SIZE, DEMO_SHUFFLE_BUFFER)
    from conveyor.pipes import IterableWrapper

    return IterableWrapper(range(context.items)).sharding_filter().map(ITEM_FUNCTIONS[context.workload.key])


def torch_dataset(context: Context) -> Any:
    """The ``torch.utils.data.IterableDataset`` doing the same work per torch worker."""
    from conveyor.tools.bench.torch_datasets import DemoShards, ShardedRange

    if context.workload.key == "demo":
        files = sorted(str(path) for path in _data_dir(context).glob("*.npz"))
        return DemoShards(files, DEMO_BATCH_SIZE, DEMO_SHUFFLE_BUFFER, DEMO_SEED)
    return ShardedRange(context.items, ITEM_FUNCTIONS[context.workload.key])


def torchdata_pipe(context: Context) -> Any:
    """The same graph built from torchdata 0.7.1's datapipes."""
    if context.workload.key != "demo":
        from torchdata.datapipes.iter import IterableWrapper

        return IterableWrapper(range(context.items)).sharding_filter().map(ITEM_FUNCTIONS[context.workload.key])
    from torchdata.datapipes.iter import FileLister

    from conveyor.tools.demo import load_shard

    pipe = FileLister(os.fspath(_data_dir(context)), masks="*.npz").shuffle().sharding_filter().flatmap(load_shard)
    return pipe.shuffle(buffer_size=DEMO_SHUFFLE_BUFFER).map(augment_keyed).batch(DEMO_BATCH_SIZE).collate()


def _data_dir(context: Context) -> Path:
    return demo_dir(context.settings["demo_root"], context.items)
