"""``conveyor.DataLoader`` against ``torch.utils.data.DataLoader``: the same call, the same
map-style datasets, ``num_workers=2`` and the default start method, otherwise each
loader's defaults unless a workload says otherwise.

    python benchmarks/bench_torch_dataloader.py [--workloads ints,tensors,dicts,tensors-unbatched]
        [--repeats 3] [--quick] [--save | --out PATH]

Workloads (map-style ``torch.utils.data.Dataset``s, read with the default sequential
sampler and ``default_collate``):

- ``ints``: 200,000 items, ``__getitem__(i)`` returns ``i``; ``batch_size=1`` (the
  default), so every batch is a 1-element int64 tensor. The per-item cost of the loader.
- ``tensors``: 2,000 items, ``__getitem__(i)`` returns a new 1 MiB tensor
  (``torch.full((262144,), i, dtype=torch.float32)``); ``batch_size=1`` (the default: what
  a torch user who leaves it alone gets), so every batch is a ``(1, 262144)`` tensor.
- ``dicts``: 200,000 items, ``__getitem__(i)`` returns ``{"id": i, "x": i / 2,
  "label": i % 10}``; ``batch_size=64``, so every batch is a dict of three 64-element
  tensors. Collation in the workers.
- ``tensors-unbatched``, only when named in ``--workloads``: the ``tensors`` dataset
  with ``batch_size=None``, which tells the cost of collating it apart from moving it.

The loaders end their workers as a user's code does: conveyor with ``shutdown()``, torch
when its iterator ends the epoch (the iterator and loader are then dropped). Every batch
is checked: each id exactly once, each batch's shape and values against its ids, and
the number of batches. How every run is measured: :mod:`harness`. The targets the project
states (conveyor's items/s at least 10x torch's on ``ints``, 5x on ``tensors``, 1.5x on
``dicts``, and less CPU per item than torch on all three) are reported with whether each
held; nothing asserts them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from conveyor.tools.bench.harness import cli
from conveyor.tools.bench.harness.declare import Context, Loader, Opened, Suite, Workload
from conveyor.tools.bench.harness.results import Result
from conveyor.tools.bench.harness.tally import Tally

WORKERS = 2
TENSOR_ELEMENTS = (1 << 20) // 4  # float32 elements in 1 MiB
#: conveyor's items/s over torch's, at least, per workload.
TARGETS = {"ints": 10.0, "tensors": 5.0, "dicts": 1.5}


class Ints(Dataset):
    """``i`` for ``i`` in ``range(n)``."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return i


class Tensors(Ints):
    """A new 1 MiB float32 tensor filled with ``i``, for ``i`` in ``range(n)``."""

    def __getitem__(self, i: int) -> torch.Tensor:  # type: ignore[override]
        return torch.full((TENSOR_ELEMENTS,), super().__getitem__(i), dtype=torch.float32)


class Dicts(Ints):
    """A small dict per ``i`` in ``range(n)``."""

    def __getitem__(self, i: int) -> dict[str, Any]:  # type: ignore[override]
        i = super().__getitem__(i)
        return {"id": i, "x": i / 2, "label": i % 10}


DATASETS = {"ints": Ints, "tensors": Tensors, "dicts": Dicts, "tensors-unbatched": Tensors}


class BatchTally(Tally):
    """Each batch's shape and values against its ids, and the number of batches."""

    def __init__(self, n: int, key: str, batch_size: int | None) -> None:
        super().__init__(n)
        self.key, self.batch_size = key, batch_size

    def _bad(self, batch: Any) -> None:
        self.wrong(f"{type(batch).__name__} {getattr(batch, 'shape', '')}", f"a batch of {self.key}")

    def see(self, batch: Any) -> None:
        self.count += 1
        if self.key == "ints":
            if not (isinstance(batch, torch.Tensor) and batch.shape == (1,)):
                return self._bad(batch)
            self.id(batch.item())
        elif self.key.startswith("tensors"):
            shape = (TENSOR_ELEMENTS,) if self.batch_size is None else (1, TENSOR_ELEMENTS)
            if not (isinstance(batch, torch.Tensor) and batch.shape == shape):
                return self._bad(batch)
            flat = batch.view(-1)
            first, last = flat[0].item(), flat[-1].item()
            if first != last or first != int(first):
                return self.wrong(f"elements {first} .. {last}", "one id throughout")
            self.id(int(first))
        else:
            if not (isinstance(batch, dict) and set(batch) == {"id", "x", "label"}):
                return self._bad(batch)
            ids = batch["id"]
            if not (torch.equal(batch["label"], ids % 10) and torch.equal(batch["x"], ids / 2)):
                self.wrong(f"batch {self.count}", "x and label matching the ids")
            self.ids(ids.tolist())
        return None

    def summary(self) -> dict[str, Any]:
        expected = -(-self.n // (self.batch_size or 1))
        if self.count != expected:
            self.wrong(f"{self.count} batches", f"{expected} batches")
        return super().summary()


def tally(context: Context) -> Tally:
    return BatchTally(context.items, context.workload.key, context.workload.settings["batch_size"])


def open_loader(conveyor: bool) -> Any:
    def open_(context: Context) -> Opened:
        if conveyor:
            from conveyor import DataLoader
        else:
            from torch.utils.data import DataLoader
        dataset = DATASETS[context.workload.key](context.items)
        loader = DataLoader(dataset, batch_size=context.workload.settings["batch_size"], num_workers=WORKERS)
        # torch's iterator ends its workers with the epoch; dropping it is its shutdown
        return Opened(loader, loader.shutdown if conveyor else lambda: None)

    return open_


def warmup(batch_size: int) -> Any:
    return lambda items: min(items, max(4 * WORKERS * batch_size, items // 50))


def workload(key: str, items: int, quick: int, describe: str, batch_size: int | None) -> Workload:
    size = {"batch_size": batch_size}
    return Workload(key, items, quick, describe, tally, warmup=warmup(batch_size or 1), settings=size)


WORKLOADS = (
    workload("ints", 200_000, 400, "ints, __getitem__(i) = i; batch_size=1", 1),
    workload("tensors", 2_000, 16, "1 MiB float32 tensors (torch.full); batch_size=1", 1),
    workload("dicts", 200_000, 512, 'dicts {"id": i, "x": i / 2, "label": i % 10}; batch_size=64', 64),
    workload("tensors-unbatched", 2_000, 16, "the tensors dataset; batch_size=None", None),
)
LOADERS = (  # the order of the runs within each repeat
    Loader("torch", "torch DataLoader", open_loader(conveyor=False), packages=("torch",)),
    Loader("conveyor", "conveyor.DataLoader", open_loader(conveyor=True), packages=("conveyor", "torch")),
)


def notes(result: Result) -> list[str]:
    """Each target this run measured, and whether it held (never asserted)."""
    lines = []
    for key, goal in TARGETS.items():
        rate = [result.median(key, loader, "items_per_s") for loader in ("conveyor", "torch")]
        cpu = [result.median(key, loader, "cpu_us_per_item") for loader in ("conveyor", "torch")]
        if all(rate) and all(cpu):
            ratio = rate[0] / rate[1]
            held = "held" if ratio >= goal and cpu[0] < cpu[1] else "missed"
            lines.append(
                f"target: {key}: conveyor items/s >= {goal:g}x torch's and less CPU per item: {ratio:.2f}x, "
                f"{cpu[0]:,.1f} vs {cpu[1]:,.1f} µs, {held}"
            )
    return lines


SUITE = Suite(
    name="torch_dataloader",
    title="conveyor.DataLoader against torch's DataLoader, 2 workers each",
    path=str(Path(__file__).resolve()),
    workloads=WORKLOADS,
    loaders=LOADERS,
    default_workloads=("ints", "tensors", "dicts"),
    notes=notes,
)


def main(argv: list[str] | None = None) -> int:
    return cli.main(SUITE, argv, " ".join((__doc__ or "").split("\n\n", 1)[0].split()))


if __name__ == "__main__":
    sys.exit(main())
