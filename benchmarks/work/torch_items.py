"""The map-style torch dataset of ``bench_peers.py``'s ``DataLoader`` rows: what a torch
user writes. It imports torch, so only the runs of those rows import it (the suite's
file is imported by every run, Grain's too, whose venv has no torch)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.utils.data

from work.compute import image


class ItemsDataset(torch.utils.data.Dataset):
    """A map-style dataset: item ``i`` is ``fn(i)``."""

    def __init__(self, fn: Callable[[int], Any], n: int) -> None:
        self.fn, self.n = fn, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if not 0 <= i < self.n:
            raise IndexError(f"index {i} out of range({self.n})")
        return self.fn(i)


def image_tensor(i: int) -> torch.Tensor:
    """``images``' item as a tensor, over the new array (no copy)."""
    return torch.from_numpy(image(i))
