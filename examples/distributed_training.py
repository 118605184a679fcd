"""Data-parallel training fed by conveyor, one loader per rank. Launch it as PyTorch jobs are:

    torchrun --standalone --nproc-per-node 2 examples/distributed_training.py

Each rank reads its share of the data through two worker processes, trains a small model
with DistributedDataParallel (gloo, CPU), and ends every epoch after the same number of
batches as the other ranks, although the data does not split evenly (103 samples). Midway
through the last epoch each rank saves its loader's state to its own file; a fresh loader
then resumes from that file and must yield exactly the batches the first one went on to
yield. Each rank prints what it did; the last line per rank says whether the resume was exact.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from conveyor import DataLoader2, DistributedReadingService, MultiProcessingReadingService, SequentialReadingService
from conveyor.pipes import IterableWrapper

SAMPLES, FEATURES, BATCH = 97, 8, 4
TRUE_WEIGHTS = np.linspace(-1.0, 1.0, FEATURES, dtype=np.float32)


def say(line: str) -> None:
    """One write per line: the ranks share a terminal, and ``print`` writes the text and
    its newline separately, so two ranks' lines could run into each other."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def make_sample(index: int) -> tuple[np.ndarray, np.float32]:
    """A deterministic sample: features from the index, label from a fixed linear rule."""
    features = np.random.default_rng(index).standard_normal(FEATURES, dtype=np.float32)
    return features, np.float32(features @ TRUE_WEIGHTS)


def pipeline():
    return (
        IterableWrapper(range(SAMPLES))
        .shuffle(buffer_size=32)  # the same order on every rank: rank 0's seed is shared
        .sharding_filter()  # each rank, then each of its workers, keeps its share
        .map(make_sample)
        .batch(BATCH)
        .collate(to_tensor=True)
    )


def loader() -> DataLoader2:
    service = SequentialReadingService(
        DistributedReadingService(timeout=60, epoch_end="drop"), MultiProcessingReadingService(num_workers=2)
    )
    return DataLoader2(pipeline(), reading_service=service)


def fingerprint(batch) -> list[float]:
    return [round(float(v), 6) for v in batch[1]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--checkpoint-dir", type=Path, default=None, help="where each rank saves its loader state")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")  # shows fullsync's epoch summaries
    dist.init_process_group("gloo")  # torchrun provides rank, world size and rendezvous
    rank, world = dist.get_rank(), dist.get_world_size()
    # Without --checkpoint-dir the states live in a folder removed at the end of the run.
    scratch = tempfile.TemporaryDirectory(prefix="conveyor-example-") if args.checkpoint_dir is None else None
    checkpoints = args.checkpoint_dir or Path(scratch.name)  # type: ignore[union-attr]
    checkpoints.mkdir(parents=True, exist_ok=True)
    model = DistributedDataParallel(torch.nn.Linear(FEATURES, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    dl = loader()
    dl.seed(2026)
    saved_at, continued = None, []
    for epoch in range(args.epochs):
        batches, total = 0, 0.0
        for features, labels in dl:
            loss = torch.nn.functional.mse_loss(model(features).squeeze(1), labels)
            optimizer.zero_grad()
            loss.backward()  # an all-reduce across ranks: every rank must take this step
            optimizer.step()
            batches, total = batches + 1, total + loss.item()
            if epoch == args.epochs - 1 and batches == 5:
                state_file = checkpoints / f"loader_rank{rank}.json"
                state_file.write_text(json.dumps(dl.state_dict()))
                saved_at = batches
            elif saved_at is not None:
                continued.append(fingerprint((features, labels)))
        say(f"rank {rank}/{world}: epoch {epoch}: {batches} batches, mean loss {total / max(batches, 1):.4f}")
    dl.shutdown()

    resumed = loader()
    resumed.load_state_dict(json.loads((checkpoints / f"loader_rank{rank}.json").read_text()))
    replayed = [fingerprint(batch) for batch in resumed]
    resumed.shutdown()
    verdict = "exact" if replayed == continued else "DIFFERENT"
    say(f"rank {rank}/{world}: resumed after batch {saved_at}: {len(replayed)} batches, {verdict}")
    dist.destroy_process_group()
    if scratch is not None:
        scratch.cleanup()


if __name__ == "__main__":
    main()
