"""Datasets that keep a state of their own (torchdata's protocol: ``state_dict()`` and
``load_state_dict()``, holding torch's RNG state), and the resume check they are read with,
for the tests of ``conveyor.DataLoader``'s checkpoints."""

from __future__ import annotations

import json
from typing import Any

import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info


def rest_after_reseeded_resume(make: Any, cut: int) -> tuple[list[Any], list[Any]]:
    """Read ``cut`` batches of ``make()``, save (through JSON), read the rest; reseed torch's
    global RNG (the checkpoint must not depend on it) and resume a new ``make()`` from the
    state: ``(the rest as read, the rest as resumed)``."""
    loader = make()
    it = iter(loader)
    for _ in range(cut):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    expected = list(it)
    loader.shutdown()
    torch.manual_seed(12345)
    again = make()
    try:
        again.load_state_dict(state)
        return expected, list(again)
    finally:
        again.shutdown()


class Drawing:
    """An iterator that keeps its position, drawing from torch's global RNG as it goes
    (torchdata's protocol: its state holds the RNG's state, a tensor)."""

    def __init__(self, keys: list[int]) -> None:
        self.keys, self.i = keys, 0

    def __iter__(self) -> Drawing:
        return self

    def __next__(self) -> tuple[int, int]:
        if self.i >= len(self.keys):
            raise StopIteration
        self.i += 1
        return self.keys[self.i - 1], int(torch.randint(1000, (1,)))

    def state_dict(self) -> dict[str, Any]:
        return {"nest": {"i": self.i, "rng": torch.get_rng_state()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.i = state["nest"]["i"]
        torch.set_rng_state(state["nest"]["rng"])


class DrawingStream(IterableDataset):
    """Each worker iterates its own slice through a :class:`Drawing` iterator."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes

    def __iter__(self) -> Drawing:
        info = get_worker_info()
        worker = info.id if info is not None else 0
        sizes = self.sizes if info is not None else [sum(self.sizes)]
        start = sum(sizes[:worker])
        return Drawing(list(range(start, start + sizes[worker])))


def identity(batch: Any) -> Any:
    return batch


class Noisy(Dataset):
    """A map-style dataset whose items draw from torch's global RNG, and whose state is
    that RNG's (torchdata's protocol)."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> tuple[int, int]:
        return i, int(torch.randint(1000, (1,)))

    def state_dict(self) -> dict[str, Any]:
        return {"rng": torch.get_rng_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        torch.set_rng_state(state["rng"])
