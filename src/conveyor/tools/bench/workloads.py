"""The five workloads of ``conveyor bench``, each runnable by every loader with the same work.

A comparison between loaders means something only when each one does the same work and
delivers the same items. So a workload is defined once, here, for all of them: for ``n``
items it builds the conveyor graph, the ``torch.utils.data.IterableDataset`` and the
torchdata graph, and the check of what a loader yielded (count, types, values, and a
fingerprint of the checked items that must be the same for every loader).

- ``small``: ``range(n)``, identity: the per-item cost of moving an item between processes.
- ``numpy`` / ``tensor``: 1 MiB uint8 arrays / tensors: moving bulk data.
- ``cpu``: a deterministic ~1 ms of numpy FFTs per item: workers doing real work.
- ``demo``: the ``conveyor demo`` pipeline (shard files, shard shuffle, decode, item
  shuffle buffer, per-item random augmentation, batches of 64, collation) on generated
  files; the torch side does the same per worker in an ``IterableDataset``.

Every function a graph calls lives at module level (:mod:`conveyor.tools.bench.per_item`), so
the graphs pickle under every start method. Nothing here imports torch or torchdata at import time.
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from conveyor.tools.bench.checks import MIB, DemoCheck, ItemCheck, RangeCheck, sample_positions
from conveyor.tools.bench.errors import BenchError
from conveyor.tools.bench.per_item import (
    CPU_FFT_SIZE,
    CPU_ROUNDS,
    DEMO_SEED,
    augment_keyed,
    cpu_heavy,
    identity,
    numpy_mib,
    tensor_mib,
)

CONVEYOR, TORCH, TORCHDATA = "conveyor", "torch", "torchdata"
#: The loaders every workload knows how to feed, in the order runs alternate between them.
LOADER_KEYS = (CONVEYOR, TORCH, TORCHDATA)

# --- workloads ---------------------------------------------------------------------------------


class Prepared(ABC):
    """One workload sized for one run: what each loader reads, and how it is checked.
    Building these is cheap; whatever is slow (generating files) happened in
    :meth:`Workload.prepare`, outside the timed region."""

    items: int

    @abstractmethod
    def conveyor_pipe(self) -> Any:
        """The conveyor ``IterDataPipe`` graph."""

    @abstractmethod
    def torch_dataset(self) -> Any:
        """The ``torch.utils.data.IterableDataset`` doing the same work per torch worker."""

    @abstractmethod
    def torchdata_pipe(self) -> Any:
        """The same graph built from torchdata 0.7.1's datapipes."""

    @abstractmethod
    def checker(self, loader: str) -> ItemCheck:
        """A fresh check of one run by ``loader`` (one of :data:`LOADER_KEYS`)."""


class Workload(ABC):
    """What ``conveyor bench`` measures, at a size chosen per run."""

    name: str
    #: Items per run by default, and with ``--quick``.
    items: int
    quick_items: int
    #: Bytes each item delivers (0: not bulk data, no MiB/s column).
    bytes_per_item: int
    #: True when the workload itself (not only the torch loader) needs torch.
    needs_torch: bool
    #: False when a run's size is fixed by files (the demo): no warm-up on fewer items, no capping.
    resizable: bool

    @abstractmethod
    def describe(self, n: int) -> str:
        """A short description of ``n`` items of this workload for the report."""

    @abstractmethod
    def prepare(self, n: int) -> Prepared:
        """Everything a run of ``n`` items needs, made before the clock starts."""

    def output_note(self, loader: str) -> str:
        """What ``loader`` yields when it differs from the other loaders ('' when it does not)."""
        return ""


@dataclass
class RangeWorkload(Workload):
    """``fn(i)`` for ``i`` in ``range(n)``, sharded across the workers and computed there."""

    name: str
    fn: Callable[[int], Any]
    kind: str  # of the items fn returns: "int", "float", "ndarray" or "tensor"
    items: int
    quick_items: int
    what: str
    bytes_per_item: int = 0
    needs_torch: bool = False
    resizable: bool = True

    def describe(self, n: int) -> str:
        return f"{n:,} {self.what}"

    def prepare(self, n: int) -> Prepared:
        return RangeRun(self, n)

    def loader_kind(self, loader: str) -> str:
        """torch's ``DataLoader`` hands numpy arrays over as tensors (``default_convert``
        applies even with ``batch_size=None``)."""
        return "tensor" if loader == TORCH and self.kind == "ndarray" else self.kind

    def output_note(self, loader: str) -> str:
        if self.loader_kind(loader) != self.kind:
            return f"yields torch tensors here (its default_convert), the others {self.kind}s"
        return ""

    def expected(self, position: int) -> Any:
        """The item at ``position``, as far as the check needs it."""
        if self.kind == "int":
            return position
        if self.kind == "float":
            return self.fn(position)
        return position % 251


@dataclass
class RangeRun(Prepared):
    """A :class:`RangeWorkload` of ``items`` items."""

    workload: RangeWorkload
    items: int

    def conveyor_pipe(self) -> Any:
        from conveyor.pipes import IterableWrapper

        return IterableWrapper(range(self.items)).sharding_filter().map(self.workload.fn)

    def torch_dataset(self) -> Any:
        from conveyor.tools.bench.torch_datasets import ShardedRange

        return ShardedRange(self.items, self.workload.fn)

    def torchdata_pipe(self) -> Any:
        from torchdata.datapipes.iter import IterableWrapper

        return IterableWrapper(range(self.items)).sharding_filter().map(self.workload.fn)

    def checker(self, loader: str) -> ItemCheck:
        positions = sample_positions(self.items)
        # Computed now, outside the timed region (the cpu workload's values cost 1 ms each).
        expected = {p: self.workload.expected(p) for p in positions}
        return RangeCheck(self.workload.loader_kind(loader), self.items, expected)


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


@dataclass
class DemoWorkload(Workload):
    """The ``conveyor demo`` pipeline on generated shard files."""

    root: Path | None = None  # where datasets are generated; None: :func:`default_demo_root`
    name: str = "demo"
    items: int = 8192
    quick_items: int = 4096
    bytes_per_item: int = DEMO_IMAGE_BYTES
    needs_torch: bool = False
    resizable: bool = False
    batch_size: int = DEMO_BATCH_SIZE
    shuffle_buffer: int = DEMO_SHUFFLE_BUFFER
    prepared: dict[int, DemoRun] = field(default_factory=dict)
    generated: list[str] = field(default_factory=list)  # what prepare() did, for the report

    def describe(self, n: int) -> str:
        shards, per_shard = demo_layout(n)
        return (
            f"{shards * per_shard:,} images 3x32x32 in {shards} .npz shards, demo pipeline (shard shuffle, "
            f"sharding, decode, shuffle buffer {self.shuffle_buffer}, random flip+crop+normalize, "
            f"batches of {self.batch_size}, collate)"
        )

    def output_note(self, loader: str) -> str:
        if loader != CONVEYOR:
            return "yields torch tensors here (torch's default_collate), conveyor numpy arrays"
        return ""

    def prepare(self, n: int) -> Prepared:
        if n in self.prepared:
            return self.prepared[n]
        from conveyor.tools.demo import DemoError, prepare_dataset

        shards, per_shard = demo_layout(n)
        data_dir = (self.root if self.root is not None else default_demo_root()) / f"{shards}x{per_shard}"
        start = time.perf_counter()
        try:
            made = prepare_dataset(data_dir, shards, per_shard)
        except (DemoError, OSError) as err:
            raise BenchError(f"demo dataset in {str(data_dir)!r}: {err}") from err
        files = sorted(str(p) for p in data_dir.glob("*.npz"))
        labels = np.zeros(shards * per_shard, dtype=np.int64)
        for path in files:
            with np.load(path) as data:
                labels[data["index"]] = data["labels"]
        self.generated.append(
            f"{data_dir} ({shards} x {per_shard} images, {'generated' if made else 'reused'} in "
            f"{time.perf_counter() - start:.2f} s)"
        )
        run = DemoRun(self, data_dir, files, labels)
        self.prepared[n] = run
        return run


@dataclass
class DemoRun(Prepared):
    """The demo pipeline over one generated dataset."""

    workload: DemoWorkload
    data_dir: Path
    files: list[str]
    labels: np.ndarray

    @property
    def items(self) -> int:  # type: ignore[override]
        return len(self.labels)

    def conveyor_pipe(self) -> Any:
        from conveyor.tools.demo import build_pipeline

        return build_pipeline(self.data_dir, self.workload.batch_size, self.workload.shuffle_buffer)

    def torch_dataset(self) -> Any:
        from conveyor.tools.bench.torch_datasets import DemoShards

        return DemoShards(self.files, self.workload.batch_size, self.workload.shuffle_buffer, DEMO_SEED)

    def torchdata_pipe(self) -> Any:
        from torchdata.datapipes.iter import FileLister

        from conveyor.tools.demo import load_shard

        pipe = FileLister(os.fspath(self.data_dir), masks="*.npz").shuffle().sharding_filter().flatmap(load_shard)
        if self.workload.shuffle_buffer > 1:
            pipe = pipe.shuffle(buffer_size=self.workload.shuffle_buffer)
        return pipe.map(augment_keyed).batch(self.workload.batch_size).collate()

    def checker(self, loader: str) -> ItemCheck:
        return DemoCheck(self.labels, self.workload.batch_size, tensors=loader != CONVEYOR)


WORKLOAD_NAMES = ("small", "numpy", "tensor", "cpu", "demo")


def make_workloads(demo_root: Path | None = None) -> dict[str, Workload]:
    """The five workloads by name, in the order of :data:`WORKLOAD_NAMES`; ``demo_root``
    is where the demo's datasets are generated (default: the per-user cache)."""
    workloads: list[Workload] = [
        RangeWorkload("small", identity, "int", 200_000, 30_000, "ints, fn = identity"),
        RangeWorkload(
            "numpy", numpy_mib, "ndarray", 2_000, 500, "numpy uint8 arrays of 1 MiB, fn = np.full", bytes_per_item=MIB
        ),
        RangeWorkload(
            "tensor",
            tensor_mib,
            "tensor",
            2_000,
            500,
            "torch uint8 tensors of 1 MiB, fn = torch.full",
            bytes_per_item=MIB,
            needs_torch=True,
        ),
        RangeWorkload(
            "cpu",
            cpu_heavy,
            "float",
            4_000,
            1_000,
            f"floats, fn = {CPU_ROUNDS} rounds of numpy FFT filtering of {CPU_FFT_SIZE} samples (~1 ms)",
        ),
        DemoWorkload(demo_root),
    ]
    return {w.name: w for w in workloads}
