"""``conveyor demo``: train a tiny model from a ``DataLoader2``, checkpoint mid-run, prove the resume.

The run reads a few epochs through worker processes, checking that every image arrives
exactly once per epoch. Halfway through the middle epoch it saves the loader's state
(JSON) and the model's weights, then trains on to the end, noting a digest of every later
batch. Finally a *new* loader and model load that checkpoint and train to the end again:
the batches must be identical, in the same order, and so must the final weights.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from conveyor.core.graph import list_dps
from conveyor.loader.dataloader2 import DataLoader2
from conveyor.pipes import IterableWrapper
from conveyor.reading_service.multiprocessing import MultiProcessingReadingService
from conveyor.tools.demo.dataset import DemoError, prepare_dataset
from conveyor.tools.demo.model import make_classifier
from conveyor.tools.demo.pipeline import build_pipeline

LOADER_STATE = "loader_state.json"


@dataclass(frozen=True)
class DemoConfig:
    """What ``conveyor demo`` generates, how it reads it, and how it trains."""

    data_dir: Path
    shards: int = 16
    items_per_shard: int = 256
    batch_size: int = 64
    epochs: int = 3
    seed: int = 0
    shuffle_buffer: int = 1024
    workers: int = 2
    progress: bool = True
    backend: str = "auto"  # the model's: "auto" (torch if installed), "torch" or "numpy"
    checkpoint_dir: Path | None = None  # default: beside the data, "<data_dir>-checkpoint"

    @property
    def items(self) -> int:
        return self.shards * self.items_per_shard

    @property
    def checkpoint_path(self) -> Path:
        if self.checkpoint_dir is not None:
            return Path(self.checkpoint_dir)
        data = Path(self.data_dir).resolve()
        if not data.name:
            raise DemoError(f"{data} has no folder beside it for the checkpoint; pass --checkpoint-dir")
        return data.with_name(data.name + "-checkpoint")

    @property
    def checkpoint_epoch(self) -> int:
        """The (0-based) epoch in whose middle the checkpoint is saved."""
        return (self.epochs - 1) // 2


@dataclass(frozen=True)
class EpochStats:
    """What one epoch delivered, for the report."""

    epoch: int
    items: int
    distinct: int
    batches: int
    seconds: float
    loss: float = float("nan")
    accuracy: float = float("nan")

    @property
    def items_per_second(self) -> float:
        return self.items / self.seconds if self.seconds > 0 else float("inf")


@dataclass
class TrainingRun:
    """Everything the report needs from a training run."""

    epochs: list[EpochStats] = field(default_factory=list)
    saved_after: tuple[int, int, int] | None = None  # (epoch, batches, items) at the checkpoint
    later_batches: list[str] = field(default_factory=list)  # digests of the batches after it
    final_weights: np.ndarray | None = None
    stage_report: str = ""
    model_name: str = ""


def make_loader(config: DemoConfig) -> DataLoader2:
    pipe = build_pipeline(config.data_dir, config.batch_size, config.shuffle_buffer)
    return DataLoader2(pipe, reading_service=MultiProcessingReadingService(num_workers=config.workers))


def batch_digest(batch: Any) -> str:
    """A digest of a batch's pixels, labels and item ids: equal digests, equal batches."""
    digest = hashlib.blake2b(digest_size=16)
    for part in batch:
        digest.update(np.ascontiguousarray(part).tobytes())
    return digest.hexdigest()


def _epochs(config: DemoConfig) -> Iterator[Iterator[Any]]:
    """One batch iterator per epoch, from a single seeded ``DataLoader2``."""
    with make_loader(config) as loader:
        loader.seed(config.seed)
        for _ in range(config.epochs):
            yield iter(loader)


def epoch_label_orders(config: DemoConfig) -> list[list[int]]:
    """The label sequence each epoch delivers (the dataset must exist): what the tests
    compare to show that epochs differ and runs with the same seed do not."""
    return [[int(label) for _, labels, _ in batches for label in labels] for batches in _epochs(config)]


# --- progress ----------------------------------------------------------------------------


class _TextProgress:
    """Stand-in for tqdm when it is not installed: one line when the epoch ends."""

    def __init__(self, total: int, desc: str, stream: IO[str]):
        self.total, self.desc, self.stream, self.n = total, desc, stream, 0

    def update(self, n: int) -> None:
        self.n += n

    def set_postfix_str(self, text: str) -> None:
        self.postfix = text

    def close(self) -> None:
        print(f"{self.desc}: {self.n}/{self.total} items", file=self.stream, flush=True)


class _NoProgress:
    def update(self, n: int) -> None:
        return None

    def set_postfix_str(self, text: str) -> None:
        return None

    def close(self) -> None:
        return None


def _progress(total: int, desc: str, stream: IO[str], enabled: bool) -> Any:
    if not enabled:
        return _NoProgress()
    try:
        from tqdm import tqdm
    except ImportError:
        return _TextProgress(total, desc, stream)
    return tqdm(total=total, desc=desc, unit="img", file=stream, leave=True, dynamic_ncols=True)


# --- training ------------------------------------------------------------------------------


def train(config: DemoConfig, err: IO[str]) -> TrainingRun:
    """The uninterrupted run: train every epoch, checkpoint once in the middle."""
    run = TrainingRun()
    model = make_classifier(config.backend, config.seed)
    run.model_name = model.name
    checkpoint = config.checkpoint_path
    checkpoint.mkdir(parents=True, exist_ok=True)
    with make_loader(config) as loader:
        loader.seed(config.seed)
        for epoch in range(config.epochs):
            bar = _progress(config.items, f"epoch {epoch + 1}/{config.epochs}", err, config.progress)
            seen: set[int] = set()
            items = batches = correct = 0
            loss_sum = 0.0
            try:
                start = time.perf_counter()
                for batch in loader:
                    images, labels, index = batch
                    if run.saved_after is not None:
                        run.later_batches.append(batch_digest(batch))
                    loss, hits = model.step(images, labels)
                    items, batches = items + len(index), batches + 1
                    loss_sum, correct = loss_sum + loss * len(index), correct + hits
                    seen.update(index.tolist())
                    bar.update(len(index))
                    bar.set_postfix_str(f"loss {loss:.3f}")
                    if run.saved_after is None and epoch == config.checkpoint_epoch and 2 * items >= config.items:
                        (checkpoint / LOADER_STATE).write_text(json.dumps(loader.state_dict()))
                        model.save(checkpoint)
                        run.saved_after = (epoch, batches, items)
                seconds = time.perf_counter() - start
            finally:
                bar.close()
            run.epochs.append(
                EpochStats(epoch, items, len(seen), batches, seconds, loss_sum / max(items, 1), correct / max(items, 1))
            )
        run.stage_report = loader.stats().table()
    run.final_weights = model.weights()
    return run


def resume(config: DemoConfig) -> tuple[list[str], np.ndarray]:
    """A new loader and model from the checkpoint, trained to the end: the batches they
    saw (digests) and the final weights."""
    checkpoint = config.checkpoint_path
    model = make_classifier(config.backend, config.seed + 1)  # other initial weights: the load must matter
    model.load(checkpoint)
    state = json.loads((checkpoint / LOADER_STATE).read_text())
    digests = []
    with make_loader(config) as loader:
        loader.load_state_dict(state)
        for _ in range(state["epoch"], config.epochs):
            for batch in loader:
                digests.append(batch_digest(batch))
                model.step(batch[0], batch[1])
    return digests, model.weights()


# --- the command -----------------------------------------------------------------------------


def run_demo(config: DemoConfig, out: IO[str] | None = None, err: IO[str] | None = None) -> int:
    """Generate (or reuse) the dataset, train, prove the resume, print the report.
    Returns 1 if an epoch lost or repeated items or the resume differed."""
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr

    def say(text: str) -> None:
        print(text, file=out, flush=True)

    checkpoint_dir = config.checkpoint_path  # refused (bad --data-dir) before anything is written
    start = time.perf_counter()
    generated = prepare_dataset(config.data_dir, config.shards, config.items_per_shard)
    say(
        f"dataset: {config.data_dir} ({config.shards} shards x {config.items_per_shard} items, "
        f"{'generated' if generated else 'reused'} in {time.perf_counter() - start:.2f} s)"
    )
    graph = build_pipeline(config.data_dir, config.batch_size, config.shuffle_buffer)
    nodes = [repr(node) for node in reversed(list_dps(graph)) if not isinstance(node, IterableWrapper)]
    say(f"pipeline (seed={config.seed}, workers={config.workers}):\n    " + "\n -> ".join(nodes))
    run = train(config, err)
    say(f"model: {run.model_name}")
    for s in run.epochs:
        say(
            f"epoch {s.epoch + 1}/{config.epochs}: items={s.items} distinct={s.distinct} batches={s.batches} "
            f"seconds={s.seconds:.3f} items/s={s.items_per_second:,.0f} loss={s.loss:.4f} accuracy={s.accuracy:.3f}"
        )
    items = sum(s.items for s in run.epochs)
    seconds = sum(s.seconds for s in run.epochs)
    say(
        f"total: epochs={len(run.epochs)} items={items} batches={sum(s.batches for s in run.epochs)} "
        f"seconds={seconds:.3f} items/s={items / seconds if seconds > 0 else float('inf'):,.0f}"
    )
    say(f"per-stage report, epoch {config.epochs}/{config.epochs}:\n{run.stage_report}")
    status = 0
    bad = [s.epoch + 1 for s in run.epochs if s.items != config.items or s.distinct != config.items]
    if bad:
        print(
            f"conveyor demo: error: epochs {bad} did not deliver each of the {config.items} items exactly once",
            file=err,
        )
        status = 1
    if run.saved_after is None:
        print("conveyor demo: error: no checkpoint was saved (empty epoch?)", file=err)
        return 1
    epoch, batches, saved_items = run.saved_after
    say(
        f"checkpoint: saved after batch {batches} of epoch {epoch + 1} ({saved_items} of {config.items} items) "
        f"in {checkpoint_dir}"
    )
    replayed, weights = resume(config)
    same_batches = replayed == run.later_batches
    assert run.final_weights is not None
    difference = float(np.max(np.abs(weights - run.final_weights))) if len(weights) else 0.0
    say(
        f"resume: a new loader and model loaded the checkpoint and trained on: {len(replayed)} batches "
        f"(the uninterrupted run had {len(run.later_batches)} after the checkpoint), "
        f"{'identical batches' if same_batches else 'DIFFERENT batches'}, "
        f"final weights {'identical' if difference == 0 else f'differ by up to {difference:.3g}'}"
    )
    if not same_batches or difference != 0:
        print("conveyor demo: error: the resumed run did not continue exactly", file=err)
        status = 1
    return status
