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


def as_batch(indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of items, as torch's ``DataLoader`` collates them."""
    x = torch.tensor([[float(index)] for index in indices])
    return x, 2 * x + 1


def numbers_pipe_loader(distributed: bool, seed: int | None = None) -> DataLoader2:
    """A ``DataLoader2`` over the same items as a pipe graph, through worker processes;
    sharded by rank first when ``distributed``. Seeded with ``seed``, else each epoch draws
    its seed from torch's global RNG.

    The keys are shuffled and batched before the sharding point, and each worker makes the
    batches it is given (as torch's ``DataLoader`` does with a batch sampler): every op
    after the sharding point treats one batch at a time, so a checkpoint of a job resumes
    on any number of ranks (``DistributedReadingService.merge_rank_states``)."""
    pipe = IterableWrapper(range(ITEMS)).shuffle().batch(BATCH).sharding_filter().map(as_batch)
    service: MultiProcessingReadingService | SequentialReadingService = MultiProcessingReadingService(WORKERS)
    if distributed:
        service = SequentialReadingService(DistributedReadingService(timeout=60), service)
    loader = DataLoader2(pipe, reading_service=service)
    if seed is not None:
        loader.seed(seed)
    return loader
