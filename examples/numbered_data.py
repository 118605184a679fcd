"""The data the resume examples train on, shared by them: 64 numbered items, each saying
which item it is, so that a run's log of batches shows exactly what every step read."""

from __future__ import annotations

import torch

from conveyor import DataLoader2, DistributedReadingService, MultiProcessingReadingService, SequentialReadingService
from conveyor.pipes import IterableWrapper

ITEMS, BATCH, WORKERS = 64, 4, 2


class Numbers(torch.utils.data.Dataset):
    """Item ``i`` is ``(i, 2i + 1)``: the batch says which items a step trained on."""

    def __len__(self) -> int:
        return ITEMS

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.tensor([float(index)])
        return x, 2 * x + 1


def as_pair(index: int) -> tuple[torch.Tensor, torch.Tensor]:
    return Numbers()[index]


def numbers_pipe_loader(distributed: bool, seed: int | None = None) -> DataLoader2:
    """A ``DataLoader2`` over the same items as a pipe graph, through worker processes;
    sharded by rank first when ``distributed``. Seeded with ``seed``, else each epoch draws
    its seed from torch's global RNG."""
    pipe = IterableWrapper(range(ITEMS)).shuffle().sharding_filter().map(as_pair).batch(BATCH).collate()
    service: MultiProcessingReadingService | SequentialReadingService = MultiProcessingReadingService(WORKERS)
    if distributed:
        service = SequentialReadingService(DistributedReadingService(timeout=60), service)
    loader = DataLoader2(pipe, reading_service=service)
    if seed is not None:
        loader.seed(seed)
    return loader
