"""Faults in a run: what error budgets and self-healing workers cost, what they save, and
how long a shutdown takes.

    python benchmarks/bench_faults.py [--workloads budget-small,budget-trivial,corrupt,restart,
        shutdown,shutdown-stuck] [--loaders ...] [--repeats 3] [--quick] [--save | --out PATH]

Workloads and the loaders each compares:

- ``budget-small``: 200,000 small ints through 2 workers, and ``budget-trivial``:
  1,000,000 through a trivial in-process ``map``: ``on_error="skip"`` (``skip``) against
  ``"raise"`` (``raise``) on clean data: what having a budget costs when nothing fails.
- ``corrupt``: 4,000 JPEGs (64x64), 1% of them truncated, decoded with Pillow in 2
  workers: ``conveyor`` skips them (``on_error="skip", max_skipped=0.02``) and must deliver
  every good image; torch's ``DataLoader`` (``torch``) ends the epoch at the first bad one
  and must deliver the images before it.
- ``restart``: 3,000 items of ~0.5 ms of numpy work in 2 workers: ``conveyor`` without a
  fault, ``conveyor-killed`` with one worker killed (``SIGKILL``) at item 1,500 and
  ``max_worker_restarts=1`` (it must deliver the same items, each once), and
  ``torch-killed``, torch's ``DataLoader`` with the same kill (it loses the epoch).
- ``shutdown``: how long ``shutdown()`` takes after an epoch of 200 items through 2
  workers, and ``shutdown-stuck``: after 20 items, with a stage stuck forever (item 50
  sleeps an hour); for each start method (``conveyor-fork``, ``conveyor-spawn``,
  ``conveyor-forkserver``), and torch's iterator shut down at the same points
  (``torch-fork``, ...).

How every run is measured and checked: :mod:`harness`; each run's outcome (skipped,
restarts, the error a loader ended with) is kept with its figures.
"""

from __future__ import annotations

import io
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from conveyor.tools.bench.harness import cli
from conveyor.tools.bench.harness.declare import Context, Loader, Opened, Suite, Workload
from conveyor.tools.bench.harness.results import Result
from conveyor.tools.bench.harness.tally import Tally

WORKERS = 2
START_METHODS = ("fork", "spawn", "forkserver")
#: corrupt: every CORRUPT_EVERY-th JPEG is cut to a third of its bytes.
CORRUPT_EVERY = 100
#: shutdown-stuck: the item whose stage never returns, the dataset's size, the items read.
STUCK_AT, STUCK_DATASET = 50, 200


def identity(x: int) -> int:
    return x


def stuck_at(x: int) -> int:
    if x == STUCK_AT:
        time.sleep(3600)
    return x


def make_jpegs(count: int) -> list[bytes]:
    """``count`` 64x64 JPEGs; every ``CORRUPT_EVERY``-th is cut to a third of its bytes."""
    from PIL import Image

    rng = np.random.default_rng(0)
    blobs = []
    for index in range(count):
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(buffer, format="JPEG", quality=90)
        data = buffer.getvalue()
        blobs.append(data[: len(data) // 3] if corrupt(index) else data)
    return blobs


def corrupt(index: int) -> bool:
    return index % CORRUPT_EVERY == CORRUPT_EVERY - 1


def decode(item: tuple[int, bytes]) -> tuple[int, np.ndarray]:
    from PIL import Image

    index, blob = item
    with Image.open(io.BytesIO(blob)) as image:
        image.load()
        return index, np.asarray(image)


class Work:
    """~0.5 ms of numpy per item, its id in its thousands; the worker dies (SIGKILL) the
    first time it meets ``kill_at`` (a file in ``marks`` remembers it across processes)."""

    def __init__(self, kill_at: int | None, marks: str) -> None:
        self.kill_at, self.marks = kill_at, marks

    def __call__(self, x: int) -> int:
        if x == self.kill_at:
            mark = Path(self.marks) / "killed"
            if not mark.exists():
                mark.touch()
                os.kill(os.getpid(), signal.SIGKILL)
        values = np.arange(20_000, dtype=np.float64) + x
        return int(np.sqrt(values).sum()) % 1000 + x * 1000


# --- the loaders ------------------------------------------------------------------------------


def until_error(items: Iterable[Any], outcome: dict[str, Any]) -> Iterator[Any]:
    """``items`` until they end or raise, as a torch user's epoch ends; ``outcome`` says how."""
    try:
        yield from items
        outcome["outcome"] = "finished"
    except Exception as error:  # the epoch's end, as a torch user sees it: recorded, not raised
        outcome["outcome"] = f"failed: {type(error).__name__}"


def conveyor_loader(context: Context, pipe: Any, workers: int, **options: Any) -> Any:
    from conveyor import DataLoader2, MultiProcessingReadingService

    service_options = {
        key: options.pop(key) for key in ("max_worker_restarts", "multiprocessing_context") if key in options
    }
    service = MultiProcessingReadingService(workers, **service_options) if workers else None
    return DataLoader2(pipe, reading_service=service, **options)


def open_budget(skip: bool) -> Callable[[Context], Opened]:
    def open_(context: Context) -> Opened:
        from conveyor.pipes import IterableWrapper

        small = context.workload.key == "budget-small"
        pipe = IterableWrapper(range(context.items))
        pipe = pipe.sharding_filter().map(identity) if small else pipe.map(identity)
        policy = {"on_error": "skip", "max_skipped": 10} if skip else {}
        loader = conveyor_loader(context, pipe, WORKERS if small else 0, **policy)
        return Opened(loader, loader.shutdown)

    return open_


def jpegs(context: Context) -> list[tuple[int, bytes]]:
    return list(enumerate(make_jpegs(context.items)))


def open_corrupt_conveyor(context: Context) -> Opened:
    from conveyor.pipes import IterableWrapper

    pipe = IterableWrapper(jpegs(context)).sharding_filter().map(decode)
    loader = conveyor_loader(context, pipe, WORKERS, on_error="skip", max_skipped=0.02)
    found: dict[str, Any] = {}

    def close() -> None:
        found["skipped"] = len(loader.stats().skipped)  # before the shutdown ends the pool
        loader.shutdown()

    return Opened(loader, close, lambda: found)


def open_conveyor(context: Context) -> Opened:
    """corrupt: the bad images skipped; restart: no fault."""
    if context.workload.key == "corrupt":
        return open_corrupt_conveyor(context)
    return open_restart(kill=False)(context)


def map_dataset(items: int, get: Callable[[int], Any]) -> Any:
    import torch.utils.data as tud

    class Items(tud.Dataset):
        def __len__(self) -> int:
            return items

        def __getitem__(self, index: int) -> Any:
            return get(index)

    return Items()


def open_torch_until_error(context: Context, dataset: Any) -> Opened:
    import torch.utils.data as tud

    outcome: dict[str, Any] = {}
    iterator = iter(tud.DataLoader(dataset, batch_size=None, num_workers=WORKERS))
    return Opened(until_error(iterator, outcome), iterator._shutdown_workers, lambda: outcome)


def open_corrupt_torch(context: Context) -> Opened:
    blobs = jpegs(context)
    return open_torch_until_error(context, map_dataset(len(blobs), lambda index: decode(blobs[index])))


def open_restart(kill: bool, torch: bool = False) -> Callable[[Context], Opened]:
    def open_(context: Context) -> Opened:
        marks = tempfile.TemporaryDirectory()
        work = Work(context.items // 2 if kill else None, marks.name)
        if torch:
            opened = open_torch_until_error(context, map_dataset(context.items, work))
            return Opened(opened.items, lambda: (opened.close(), marks.cleanup()), opened.extra)
        from conveyor.pipes import IterableWrapper

        pipe = IterableWrapper(range(context.items)).sharding_filter().map(work)
        loader = conveyor_loader(context, pipe, WORKERS, max_worker_restarts=1)

        found: dict[str, Any] = {}

        def close() -> None:
            found["restarts"] = len(loader.stats().worker_restarts)  # before the shutdown ends the pool
            loader.shutdown()
            marks.cleanup()

        return Opened(loader, close, lambda: found)

    return open_


def open_shutdown(torch: bool, method: str) -> Callable[[Context], Opened]:
    """A loader whose shutdown is timed: after its whole epoch, or after ``context.items``
    of a stage that gets stuck."""

    def open_(context: Context) -> Opened:
        stuck = context.workload.key == "shutdown-stuck"
        size = STUCK_DATASET if stuck else context.items
        timed: dict[str, Any] = {}
        if torch:
            import torch.utils.data as tud

            dataset = map_dataset(size, stuck_at) if stuck else list(range(size))
            iterator = iter(
                tud.DataLoader(dataset, batch_size=None, num_workers=WORKERS, multiprocessing_context=method)
            )
            shutdown: Callable[[], None] = iterator._shutdown_workers  # what deleting the iterator runs
            items: Iterable[Any] = iterator
        else:
            from conveyor.pipes import IterableWrapper

            pipe = IterableWrapper(range(size)).sharding_filter().map(stuck_at if stuck else identity)
            loader = conveyor_loader(context, pipe, WORKERS, multiprocessing_context=method)
            shutdown, items = loader.shutdown, loader

        def close() -> None:
            started = time.perf_counter()
            shutdown()
            timed["shutdown_ms"] = (time.perf_counter() - started) * 1e3

        first = (item for _, item in zip(range(context.items), items, strict=False))
        return Opened(first, close, lambda: timed)

    return open_


# --- the checks -------------------------------------------------------------------------------


class ExpectedTally(Tally):
    """Ids naming their items (``id_of``), of which only ``deliverable`` must arrive, each
    once, and nothing else: a loader that skips some, or stops at the first bad one."""

    def __init__(self, n: int, deliverable: set[int], id_of: Callable[[Any], int | None]) -> None:
        super().__init__(n)
        self.deliverable, self.id_of = deliverable, id_of

    def see(self, item: Any) -> None:
        self.count += 1
        i = self.id_of(item)
        if i is None:
            return self.wrong(item, "an item of this workload")
        if i not in self.deliverable:
            self.wrong(f"id {i}", "only the ids this loader delivers")
        self.id(i)
        return None

    def summary(self) -> dict[str, Any]:
        found = super().summary()
        found["right"] = sum(1 for i in self.deliverable if self.counts[i] == 1)
        found["missing"] = sum(1 for i in self.deliverable if self.counts[i] == 0)
        found["expected"] = len(self.deliverable)
        return found


def image_id(item: Any) -> int | None:
    ok = isinstance(item, tuple | list) and len(item) == 2 and getattr(item[1], "shape", None) == (64, 64, 3)
    return int(item[0]) if ok else None


def work_id(item: Any) -> int | None:
    return int(item) // 1000 if isinstance(item, int) or getattr(item, "shape", None) == () else None


class WorkTally(ExpectedTally):
    """restart: each item's value is its checksum's share (the orchestrator sums them all)."""

    def see(self, item: Any) -> None:
        super().see(item)
        if work_id(item) is not None:
            self.add(int(item))


def tally(context: Context) -> Tally:
    key, n = context.workload.key, context.items
    loader = context.loader.key if context.loader is not None else ""
    if key == "corrupt":
        good = {i for i in range(n) if not corrupt(i)}
        first_bad = min(i for i in range(n) if corrupt(i)) if n >= CORRUPT_EVERY else n
        return ExpectedTally(n, good if loader == "conveyor" else set(range(first_bad)), image_id)
    if key == "restart":
        # torch loses the epoch at the kill: each item it delivered must be right, and once
        deliverable = set(range(n)) if loader.startswith("conveyor") else set()
        return WorkTally(n, deliverable, work_id) if deliverable else LenientTally(n, work_id)
    return Tally(n)


class LenientTally(ExpectedTally):
    """What a loader that loses its epoch delivered: each id at most once."""

    def __init__(self, n: int, id_of: Callable[[Any], int | None]) -> None:
        super().__init__(n, set(range(n)), id_of)

    def summary(self) -> dict[str, Any]:
        found = super().summary()
        delivered = {i for i, c in enumerate(self.counts) if c}
        found["right"] = sum(1 for i in delivered if self.counts[i] == 1)
        found["missing"] = 0
        found["expected"] = len(delivered)
        found["checksum"] = None  # the epoch is lost: no sum to compare
        return found


def checksum(context: Context) -> int | None:
    """restart's checksum: the sum of every item's value, as a run without faults gives."""
    if context.workload.key != "restart":
        return None
    return sum(Work(None, "")(x) for x in range(context.items))


def notes(result: Result) -> list[str]:
    lines = []
    for kind in ("small", "trivial"):
        skip, fail = (result.median(f"budget-{kind}", key, "wall_s") for key in ("skip", "raise"))
        if skip and fail:
            lines.append(f"on_error='skip' on clean data, {kind}: {skip / fail:.3f}x the wall time of 'raise'")
    killed, clean = (result.median("restart", key, "wall_s") for key in ("conveyor-killed", "conveyor"))
    if killed and clean:
        lines.append(f"one worker killed and replaced: {killed / clean:.3f}x the wall time of the run without the kill")
    for entry in result.entries:
        outcomes = sorted({d["outcome"] for d in entry.details if "outcome" in d})
        if outcomes:
            lines.append(f"{entry.workload}, {entry.loader}: {', '.join(outcomes)}")
    return lines


def shutdown_loaders() -> tuple[Loader, ...]:
    return tuple(
        Loader(
            f"{name}-{method}",
            f"{name}, {method}",
            open_shutdown(name == "torch", method),
            workloads=("shutdown", "shutdown-stuck"),
            packages=("conveyor",) if name == "conveyor" else ("torch",),
        )
        for method in START_METHODS
        for name in ("conveyor", "torch")
    )


def fixed(items: int) -> Any:
    return lambda n: min(n, items)


WORKLOADS = (
    Workload("budget-small", 200_000, 20_000, "small ints through 2 workers, clean", tally, warmup=fixed(2_000)),
    Workload("budget-trivial", 1_000_000, 100_000, "ints through an in-process map, clean", tally, warmup=fixed(2_000)),
    Workload("corrupt", 4_000, 400, "64x64 JPEGs, 1% truncated, decoded in 2 workers", tally, warmup=fixed(200)),
    Workload("restart", 3_000, 300, "items of ~0.5 ms of numpy in 2 workers", tally, checksum, warmup=fixed(100)),
    Workload("shutdown", 200, 200, "ints through 2 workers; then shutdown()", tally, warmup=fixed(200)),
    Workload("shutdown-stuck", 20, 20, "20 ints of a stage stuck at item 50; then shutdown()", tally, warmup=fixed(20)),
)
LOADERS = (
    Loader(
        "raise", "conveyor, on_error='raise'", open_budget(skip=False), workloads=("budget-small", "budget-trivial")
    ),
    Loader("skip", "conveyor, on_error='skip'", open_budget(skip=True), workloads=("budget-small", "budget-trivial")),
    Loader("conveyor", "conveyor", open_conveyor, workloads=("corrupt", "restart")),
    Loader(
        "torch", "torch DataLoader", open_corrupt_torch, workloads=("corrupt",), packages=("torch",), needs=("torch",)
    ),
    Loader("conveyor-killed", "conveyor, a worker killed", open_restart(True), workloads=("restart",)),
    Loader(
        "torch-killed",
        "torch DataLoader, a worker killed",
        open_restart(True, torch=True),
        workloads=("restart",),
        packages=("torch",),
        needs=("torch",),
    ),
    *shutdown_loaders(),
)
SUITE = Suite(
    name="faults",
    title="Error budgets, self-healing workers and shutdown",
    path=str(Path(__file__).resolve()),
    workloads=WORKLOADS,
    loaders=LOADERS,
    columns=("delivered", "items_per_s", "wall_s", "skipped", "restarts", "shutdown_ms"),
    spread=(),
    ratio=None,
    metrics={
        "skipped": ("skipped", "count"),
        "restarts": ("worker restarts", "count"),
        "shutdown_ms": ("shutdown ms", "ms"),
    },
    notes=notes,
)


def main(argv: list[str] | None = None) -> int:
    return cli.main(SUITE, argv, " ".join((__doc__ or "").split("\n\n", 1)[0].split()))


if __name__ == "__main__":
    sys.exit(main())
