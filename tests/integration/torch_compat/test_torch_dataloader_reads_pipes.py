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
        "from conveyor.core.torch_support import require_torch\n"
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


# --- torch's graph tools on conveyor graphs -----------------------------------------------


def test_torchs_traverse_walks_a_conveyor_graph_fork_included() -> None:
    from torch.utils.data import IterDataPipe as TorchIterDataPipe
    from torch.utils.data import MapDataPipe as TorchMapDataPipe
    from torch.utils.data.graph import traverse_dps
    from torch.utils.data.graph_settings import get_all_graph_pipes

    from conveyor.pipes import SequenceWrapper

    source = IterableWrapper(range(6))
    left, right = source.fork(2)
    end = left.map(plus_one).zip(right)
    assert isinstance(end, TorchIterDataPipe) and isinstance(SequenceWrapper([1]), TorchMapDataPipe)
    found = get_all_graph_pipes(traverse_dps(end))
    assert {id(node) for node in found} == {
        id(end),
        id(end.sources[0]),
        id(left),
        id(right),
        id(left.main_datapipe),
        id(source),
    }
    assert list(end) == [(x + 1, x) for x in range(6)]  # traversal pickled nothing it kept


def test_torchs_apply_sharding_reaches_conveyors_sharding_filter() -> None:
    from torch.utils.data.datapipes.iter.sharding import SHARDING_PRIORITIES
    from torch.utils.data.graph_settings import apply_sharding

    pipe = IterableWrapper(range(20)).sharding_filter().map(plus_one)
    apply_sharding(pipe, 4, 1, SHARDING_PRIORITIES.MULTIPROCESSING)
    assert list(pipe) == [2, 6, 10, 14, 18]
    shares = []
    for index in range(4):
        share = IterableWrapper(range(20)).sharding_filter()
        apply_sharding(share, 4, index)
        shares.append(list(share))
    assert sorted(x for share in shares for x in share) == list(range(20))


def test_torchs_apply_random_seed_seeds_conveyors_random_ops() -> None:
    from torch.utils.data.graph_settings import apply_random_seed

    def seeded(seed: int) -> list[int]:
        pipe = IterableWrapper(range(30)).shuffle()
        apply_random_seed(pipe, torch.Generator().manual_seed(seed))
        return list(pipe)

    assert seeded(1) == seeded(1) != seeded(2)


def _ranks_read_torchs_dataloader(rank: int, world_size: int) -> list[int]:
    torch.manual_seed(rank)  # the seed torch shares comes from rank 0, whatever the others draw
    return [int(x) for x in DataLoader(graph(23), batch_size=None, num_workers=0)]


@pytest.mark.timeout(180)
def test_torchs_dataloader_in_a_distributed_job_splits_by_rank_without_workers() -> None:
    from distributed_helpers import run_ranks

    shares = run_ranks(2, _ranks_read_torchs_dataloader)
    assert all(isinstance(share, list) for share in shares), shares
    assert sorted(shares[0] + shares[1]) == list(range(1, 24))
    assert len(shares[0]) == 12 and len(shares[1]) == 11
