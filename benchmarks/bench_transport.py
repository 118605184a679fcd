"""Large-buffer transport: conveyor's ``DataLoader2`` + ``MultiProcessingReadingService(2)``
against ``torch.utils.data.DataLoader(num_workers=2)`` on the same items.

    python benchmarks/bench_transport.py [--workloads 1MiB,60MB,300MB,1MiB-small-shm]
        [--repeats 3] [--quick] [--save | --out PATH]

Workloads (each ``range(N)`` sharded across 2 workers, each item made there: a uint8
array of the workload's size holding its id in its first 8 bytes and ``id % 251``
everywhere else):

- ``1MiB``: 1,000 arrays of 1 MiB: conveyor's page ring.
- ``60MB``: 60 arrays of 60 MB, and ``300MB``: 24 arrays of 300 MB: larger than a ring, so
  conveyor sends each in a shared file of its own. Runs of a few GB, because a fresh
  process's first items cost far more than the next ones on both sides (fresh pages for
  the arrays, and for conveyor the first shared files, before dropped ones are reused).
- ``1MiB-small-shm``: the ``1MiB`` workload with ``/dev/shm`` a 16 MB tmpfs (Docker's
  default is 64 MB), in a private mount namespace (``unshare -m``; needs root, otherwise
  its rows say why they did not run). conveyor's rings are ``memfd_create`` memory, which
  ``/dev/shm``'s size does not bound; torch's shared tensors are ``/dev/shm`` files.

torch's side is an ``IterableDataset`` doing the same per worker, read with
``batch_size=None`` (its defaults otherwise); it hands the arrays over as tensors
(``default_convert``). Every item is checked: its id, its last byte, and for every
16th item every byte. The tables give MB/s (10^6 bytes) and the CPU seconds per GB the
run cost all its processes together (steadier than wall time on a shared machine). How
every run is measured: :mod:`harness`.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from conveyor.tools.bench.harness import cli
from conveyor.tools.bench.harness.declare import Context, Loader, Opened, Suite, Workload
from conveyor.tools.bench.harness.tally import Tally

MB = 1_000_000
WORKERS = 2
SMALL_SHM = "16m"
#: Every this-many-th item is compared byte for byte (the others at their ends).
FULL_CHECK_EVERY = 16


class Fill:
    """An array of ``size`` bytes: the id in the first 8, ``id % 251`` in the others
    (picklable: it crosses to the workers)."""

    def __init__(self, size: int):
        self.size = size

    def __call__(self, i: int) -> np.ndarray:
        array = np.full(self.size, i % 251, dtype=np.uint8)
        array[:8] = np.frombuffer(np.int64(i).tobytes(), dtype=np.uint8)
        return array


class FillTally(Tally):
    def __init__(self, n: int, size: int) -> None:
        super().__init__(n)
        self.size = size

    def see(self, item: Any) -> None:
        self.count += 1
        array = item if isinstance(item, np.ndarray) else item.numpy()
        if array.shape != (self.size,) or array.dtype != np.uint8:
            return self.wrong(f"{array.dtype} {array.shape}", f"uint8 ({self.size},)")
        i = int(array[:8].view(np.int64)[0])
        value = i % 251
        if array[-1] != value or (i % FULL_CHECK_EVERY == 0 and not (array[8:].min() == value == array[8:].max())):
            self.wrong(f"item {i}", f"{value} in every byte after the id")
        self.id(i)
        return None


def size_of(context: Context) -> int:
    return context.workload.settings["bytes"]


def open_conveyor(context: Context) -> Opened:
    from conveyor import DataLoader2, MultiProcessingReadingService
    from conveyor.pipes import IterableWrapper

    pipe = IterableWrapper(range(context.items)).sharding_filter().map(Fill(size_of(context)))
    loader = DataLoader2(pipe, reading_service=MultiProcessingReadingService(WORKERS))
    return Opened(loader, loader.shutdown)


def open_torch(context: Context) -> Opened:
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info

    class ShardedFill(IterableDataset):
        """``Fill(size)(i)`` for this worker's share of ``range(n)``."""

        def __init__(self, n: int, fill: Fill):
            self.n, self.fill = n, fill

        def __iter__(self) -> Iterator[np.ndarray]:
            info = get_worker_info()
            first, step = (info.id, info.num_workers) if info is not None else (0, 1)
            return map(self.fill, range(first, self.n, step))

    iterator = iter(
        DataLoader(ShardedFill(context.items, Fill(size_of(context))), batch_size=None, num_workers=WORKERS)
    )
    return Opened(iterator, iterator._shutdown_workers)  # what deleting the iterator runs


def tally(context: Context) -> Tally:
    return FillTally(context.items, size_of(context))


def small_shm_problem() -> str:
    """Why a private 16 MB /dev/shm cannot be had here ('' when it can)."""
    if not sys.platform.startswith("linux"):
        return "needs Linux mount namespaces"
    if os.geteuid() != 0:
        return "needs root to mount a private /dev/shm (unshare -m + mount -t tmpfs)"
    if shutil.which("unshare") is None:
        return "needs unshare(1)"
    return ""


def command(workload: Workload, command: list[str]) -> list[str] | str:
    """The small-shm workload's runs in a private mount namespace with a 16 MB /dev/shm."""
    if not workload.settings["small_shm"]:
        return command
    problem = small_shm_problem()
    if problem:
        return f"not run: {problem}"
    script = f'mount -t tmpfs -o size={SMALL_SHM} tmpfs /dev/shm && exec "$@"'
    unshare, sh = shutil.which("unshare"), shutil.which("sh")
    assert unshare is not None and sh is not None  # small_shm_problem() found unshare; sh is POSIX
    return [unshare, "-m", "--propagation", "private", sh, "-c", script, "sh", *command]


def warmup(items: int) -> int:
    """One item per worker: the large items' warm-up is their first touch, which the timed
    epoch's long runs are there to spread."""
    return min(items, WORKERS)


def workload(key: str, size: int, items: int, quick: int, small_shm: bool = False) -> Workload:
    describe = f"arrays of {key.split('-')[0]}" + (", /dev/shm a 16 MB tmpfs" if small_shm else "")
    settings = {"bytes": size, "small_shm": small_shm}
    return Workload(key, items, quick, describe, tally, item_bytes=size, warmup=warmup, settings=settings)


WORKLOADS = (
    workload("1MiB", 1 << 20, 1000, 300),
    workload("60MB", 60 * MB, 60, 10),
    workload("300MB", 300 * MB, 24, 4),
    workload("1MiB-small-shm", 1 << 20, 1000, 300, small_shm=True),
)
LOADERS = (
    Loader("conveyor", "conveyor DataLoader2", open_conveyor, packages=("conveyor",)),
    Loader("torch", "torch DataLoader", open_torch, packages=("torch",), needs=("torch",)),
)
SUITE = Suite(
    name="transport",
    title="Large buffers through 2 worker processes, and a small /dev/shm",
    path=str(Path(__file__).resolve()),
    workloads=WORKLOADS,
    loaders=LOADERS,
    columns=("mb_per_s", "cpu_s_per_gb", "first_item_ms", "peak_pss_mib"),
    spread=("mb_per_s",),
    ratio="mb_per_s",
    command=command,
)


def main(argv: list[str] | None = None) -> int:
    return cli.main(SUITE, argv, " ".join((__doc__ or "").split("\n\n", 1)[0].split()))


if __name__ == "__main__":
    sys.exit(main())
