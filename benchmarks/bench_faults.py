"""Faults in a run: what error budgets and self-healing workers cost, and what they save.

Three measurements, each run a fresh process (so a killed worker or a failed epoch
leaves nothing behind for the next), alternating between the loaders compared; medians
of ``--repeats``:

- ``budget``: ``on_error="skip"`` against ``"raise"`` on clean data (what having a
  budget costs when nothing fails): 200,000 small ints through 2 workers, and a trivial
  in-process ``map``.
- ``corrupt``: 4,000 JPEGs (64x64), 1% of them truncated, decoded with Pillow in 2 workers:
  conveyor skips them (``on_error="skip", max_skipped=0.02``); torch's ``DataLoader``
  (2 workers) ends the epoch at the first one. The row says how many images each
  delivered and at what rate.
- ``restart``: 3,000 items of ~0.5 ms of numpy work in 2 workers, one worker killed
  (``SIGKILL``) at item 1,500: conveyor with ``max_worker_restarts=1`` finishes the
  epoch with the same items as a run without the kill; the row gives its wall time
  against that run's. torch's ``DataLoader`` (2 workers) loses the epoch.
- ``shutdown``: how long ``shutdown()`` takes after an epoch of 2 workers, for each start
  method, and with a stage stuck forever (a worker inside ``time.sleep(3600)``); torch's
  ``DataLoader`` iterator is deleted at the same points for comparison (its workers are
  joined, up to its own timeouts; after a whole epoch torch has ended them already). The
  "wall s" column is the shutdown's.

Every run checks what it delivered (count, and for conveyor the items themselves against
an uninterrupted run). Timings are never asserted anywhere.

    python benchmarks/bench_faults.py [--repeats R] [--rows budget,corrupt,restart,shutdown]
        [--quick] [--start-methods fork,spawn,forkserver]   # the shutdown row's; all three by default
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROWS = ("budget", "corrupt", "restart", "shutdown")


# --- what the workers run ----------------------------------------------------------------


def identity(x: int) -> int:
    return x


def make_jpegs(count: int, corrupt_every: int) -> list[bytes]:
    """``count`` 64x64 JPEGs; every ``corrupt_every``-th is cut to a third of its bytes."""
    from PIL import Image

    rng = np.random.default_rng(0)
    blobs = []
    for index in range(count):
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(buffer, format="JPEG", quality=90)
        data = buffer.getvalue()
        blobs.append(data[: len(data) // 3] if index % corrupt_every == corrupt_every - 1 else data)
    return blobs


def decode(blob: bytes) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(blob)) as image:
        image.load()
        return np.asarray(image)


def stuck_at_50(x: int) -> int:
    if x == 50:
        time.sleep(3600)
    return x


class StuckItems:
    """200 items for torch's ``DataLoader`` (map-style), item 50 stuck forever."""

    def __len__(self) -> int:
        return 200

    def __getitem__(self, index: int) -> int:
        return stuck_at_50(index)


class Work:
    """~0.5 ms of numpy per item; the worker dies (SIGKILL) the first time it meets
    ``kill_at`` (a file in ``marks`` remembers it across processes)."""

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


# --- one run (in its own process) --------------------------------------------------------


def run_one(row: str, variant: str, scale: float) -> dict[str, Any]:
    from conveyor import DataLoader2, MultiProcessingReadingService
    from conveyor.pipes import IterableWrapper

    start = time.perf_counter()
    if row == "budget":
        small = variant.startswith("small")
        count = int((200_000 if small else 1_000_000) * scale)
        pipe = IterableWrapper(range(count)).sharding_filter().map(identity)
        service = MultiProcessingReadingService(2 if small else 0)
        policy = {"on_error": "skip", "max_skipped": 10} if variant.endswith("skip") else {}
        start = time.perf_counter()
        dl = DataLoader2(pipe, reading_service=service, **policy)
        delivered = sum(1 for _ in dl)
        dl.shutdown()
        return {"items": delivered, "seconds": time.perf_counter() - start, "ok": delivered == count}
    if row == "corrupt":
        blobs = make_jpegs(int(4000 * scale), 100)
        good = sum(1 for index in range(len(blobs)) if index % 100 != 99)
        start = time.perf_counter()
        if variant == "conveyor":
            pipe = IterableWrapper(blobs).sharding_filter().map(decode)
            dl = DataLoader2(pipe, reading_service=MultiProcessingReadingService(2), on_error="skip", max_skipped=0.02)
            delivered = sum(1 for _ in dl)
            skipped = len(dl.stats().skipped)
            dl.shutdown()
            outcome = f"{skipped} skipped"
        else:
            import torch.utils.data as tud

            class Images(tud.Dataset):  # type: ignore[type-arg]
                def __len__(self) -> int:
                    return len(blobs)

                def __getitem__(self, index: int) -> np.ndarray:
                    return decode(blobs[index])

            delivered, outcome = 0, "finished"
            try:
                for _ in tud.DataLoader(Images(), batch_size=None, num_workers=2):
                    delivered += 1
            except Exception as error:  # the epoch's end, as a torch user sees it
                outcome = f"failed: {type(error).__name__}"
        return {
            "items": delivered,
            "seconds": time.perf_counter() - start,
            "ok": delivered == good or variant != "conveyor",
            "outcome": outcome,
        }
    if row == "shutdown":
        return shutdown_run(variant)
    count = int(3000 * scale)
    kill_at = count // 2 if variant.endswith("killed") else None
    with tempfile.TemporaryDirectory() as marks:
        work = Work(kill_at, marks)
        start = time.perf_counter()
        if variant.startswith("conveyor"):
            pipe = IterableWrapper(range(count)).sharding_filter().map(work)
            dl = DataLoader2(pipe, reading_service=MultiProcessingReadingService(2, max_worker_restarts=1))
            items = list(dl)
            restarts = len(dl.stats().worker_restarts)
            dl.shutdown()
            expected = [Work(None, marks)(x) for x in range(count)]
            return {
                "items": len(items),
                "seconds": time.perf_counter() - start,
                "ok": items == expected,
                "outcome": f"{restarts} restart(s)",
            }
        import torch.utils.data as tud

        class Items(tud.Dataset):  # type: ignore[type-arg]
            def __len__(self) -> int:
                return count

            def __getitem__(self, index: int) -> int:
                return work(index)

        delivered, outcome = 0, "finished"
        try:
            for _ in tud.DataLoader(Items(), batch_size=None, num_workers=2):
                delivered += 1
        except Exception as error:
            outcome = f"failed: {type(error).__name__}"
        return {"items": delivered, "seconds": time.perf_counter() - start, "ok": True, "outcome": outcome}


def shutdown_run(variant: str) -> dict[str, Any]:
    """``<loader>-<start method>-<normal|stuck>``: seconds ``shutdown()`` took."""
    from conveyor import DataLoader2, MultiProcessingReadingService
    from conveyor.pipes import IterableWrapper

    loader, context, how = variant.split("-")
    stuck = how == "stuck"
    if loader == "conveyor":
        pipe = IterableWrapper(range(200)).sharding_filter().map(stuck_at_50 if stuck else identity)
        dl = DataLoader2(pipe, reading_service=MultiProcessingReadingService(2, multiprocessing_context=context))
        items = iter(dl)
        delivered = sum(1 for _ in zip(range(20), items, strict=False)) if stuck else sum(1 for _ in items)
        start = time.perf_counter()
        dl.shutdown()
    else:
        import torch.utils.data as tud

        dataset = StuckItems() if stuck else list(range(200))
        loader_ = tud.DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context=context)
        items_ = iter(loader_)
        delivered = sum(1 for _ in zip(range(20), items_, strict=False)) if stuck else sum(1 for _ in items_)
        start = time.perf_counter()
        items_._shutdown_workers()  # what deleting the iterator runs  # type: ignore[attr-defined]
    seconds = time.perf_counter() - start
    return {"items": delivered, "seconds": seconds, "ok": delivered == (20 if stuck else 200), "outcome": how}


# --- the report ---------------------------------------------------------------------------

START_METHODS = ("fork", "spawn", "forkserver")


def variants(row: str, start_methods: Sequence[str] = START_METHODS) -> list[str]:
    """The loaders a row compares, in the order they alternate."""
    if row == "shutdown":
        return [
            f"{loader}-{context}-{how}"
            for how in ("normal", "stuck")
            for context in start_methods
            for loader in ("conveyor", "torch")
        ]
    return {
        "budget": ["small-raise", "small-skip", "trivial-raise", "trivial-skip"],
        "corrupt": ["conveyor", "torch"],
        "restart": ["conveyor", "conveyor-killed", "torch-killed"],
    }[row]


def run_in_child(row: str, variant: str, scale: float) -> dict[str, Any]:
    command = [sys.executable, __file__, "--one", row, variant, "--scale", str(scale)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        return {
            "items": 0,
            "seconds": float("nan"),
            "ok": False,
            "outcome": f"exit {done.returncode}: {done.stderr[-300:]}",
        }
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies every item count")
    parser.add_argument("--quick", action="store_true", help="--scale 0.1 --repeats 1")
    parser.add_argument(
        "--start-methods", default=",".join(START_METHODS), help="the shutdown row's (each costs 4 runs)"
    )
    parser.add_argument("--one", nargs=2, metavar=("ROW", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(*args.one, args.scale)))
        return
    if args.quick:
        args.scale, args.repeats = 0.1, 1
    rows = [row for row in args.rows.split(",") if row]
    for row in rows:
        if row not in ROWS:
            parser.error(f"unknown row {row!r}; choose from {', '.join(ROWS)}")
    start_methods = [method for method in args.start_methods.split(",") if method]
    if not start_methods or any(method not in START_METHODS for method in start_methods):
        parser.error(f"--start-methods takes some of {','.join(START_METHODS)}, got {args.start_methods!r}")
    print(f"# bench_faults: {time.strftime('%Y-%m-%d %H:%M')}, load {os.getloadavg()[0]:.2f}, repeats {args.repeats}")
    print("| row | loader | items | items/s (median) | wall s (median) | outcome | checked |")
    print("|---|---|---|---|---|---|---|")
    medians: dict[tuple[str, str], float] = {}
    for row in rows:
        runs: dict[str, list[dict[str, Any]]] = {variant: [] for variant in variants(row, start_methods)}
        for _ in range(args.repeats):  # alternating: each repeat runs every variant once
            for variant in runs:
                runs[variant].append(run_in_child(row, variant, args.scale))
        for variant, results in runs.items():
            seconds = statistics.median(r["seconds"] for r in results)
            items = statistics.median(r["items"] for r in results)
            medians[(row, variant)] = seconds
            outcome = results[-1].get("outcome", "")
            checked = f"{sum(r['ok'] for r in results)}/{len(results)}"
            rate = f"{items / seconds:,.0f}" if seconds > 0 and row != "shutdown" else "-"
            print(f"| {row} | {variant} | {items:,.0f} | {rate} | {seconds:.3f} | {outcome} | {checked} |")
    if "budget" in rows:
        for kind in ("small", "trivial"):
            ratio = medians[("budget", f"{kind}-skip")] / medians[("budget", f"{kind}-raise")]
            print(f"on_error='skip' on clean data, {kind}: {ratio:.3f}x the wall time of 'raise'")
    if "restart" in rows:
        ratio = medians[("restart", "conveyor-killed")] / medians[("restart", "conveyor")]
        print(f"one worker killed and replaced: {ratio:.3f}x the wall time of the run without the kill")
    if "shutdown" in rows:
        for how in ("normal", "stuck"):
            worst = max(medians[("shutdown", f"conveyor-{c}-{how}")] for c in start_methods)
            print(f"conveyor's shutdown(), {how}: at most {worst * 1000:.1f} ms (median) over the start methods")


if __name__ == "__main__":
    main()
