"""With torch, a conveyor pipe is a ``torch.utils.data.IterableDataset``: torch's own
``DataLoader`` reads it, each of its workers keeping its share at ``sharding_filter()``,
and a shuffle before that point orders the items alike in every worker."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from conveyor.pipes import IterableWrapper


def plus_one(x: int) -> int:
    return x + 1


def graph(n: int = 40):  # type: ignore[no-untyped-def]
    return IterableWrapper(range(n)).shuffle().sharding_filter().map(plus_one)


def test_a_pipe_is_an_iterable_dataset() -> None:
    assert isinstance(graph(), IterableDataset)


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")  # 3 workers on 2 cores
@pytest.mark.parametrize("workers", [0, 2, 3])
def test_torchs_dataloader_yields_every_item_once(workers: int) -> None:
    loader = DataLoader(graph(), batch_size=None, num_workers=workers)
    torch.manual_seed(9)
    first = list(loader)
    torch.manual_seed(9)
    again = list(loader)
    assert sorted(first) == list(range(1, 41))
    assert first == again  # torch's seed decides the shuffle, as for its own datasets
    torch.manual_seed(10)
    assert list(loader) != first


@pytest.mark.timeout(120)
def test_batches_collate_as_torchs() -> None:
    loader = DataLoader(IterableWrapper(range(10)).sharding_filter(), batch_size=4, num_workers=2)
    batches = list(loader)
    assert all(isinstance(batch, torch.Tensor) for batch in batches)
    assert sorted(int(x) for batch in batches for x in batch) == list(range(10))


def test_torch_imported_after_conveyor_registers_when_conveyor_imports_it() -> None:
    code = (
        "import conveyor.pipes as pipes, sys\n"
        "assert 'torch' not in sys.modules\n"
        "from conveyor.torch_support import require_torch\n"
        "torch = require_torch('a test')\n"
        "print(isinstance(pipes.IterableWrapper([1]), torch.utils.data.IterableDataset))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"


def test_torch_imported_after_conveyor_by_the_user_registers_at_the_next_pipe() -> None:
    code = (
        "import conveyor.pipes as pipes, sys\n"
        "assert 'torch' not in sys.modules\n"
        "import torch\n"
        "print(isinstance(pipes.IterableWrapper([1]).map(str), torch.utils.data.IterableDataset))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
