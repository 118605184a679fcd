"""torch datapipes inside a conveyor graph (an adaptor written for torchdata, torch's own
``sharding_filter`` or ``shuffle``): the graph tools see them, loaders run, shard, seed and
resume them like conveyor's pipes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from torch.utils.data import IterDataPipe as TorchIterDataPipe
from torch.utils.data.datapipes.iter import Shuffler as TorchShuffler
from torch.utils.data.datapipes.iter.sharding import ShardingFilterIterDataPipe as TorchShardingFilter

from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.graph import find_dps, list_dps, replace_dp, traverse_dps
from conveyor.pipes import IterableWrapper, Mapper
from resume_checks import check_resume_at_every_cut


class Adaptor(TorchIterDataPipe):
    """A torch datapipe of the kind torchdata's users wrote around their pipes."""

    def __init__(self, datapipe: Any) -> None:
        self.datapipe = datapipe
        self.started = False

    def __iter__(self) -> Iterator[Any]:
        yield from self.datapipe


def triple(x: int) -> int:
    return 3 * x


def adapted() -> Any:
    mapped = IterableWrapper(range(12)).shuffle(buffer_size=5).map(triple)
    end = IterableWrapper(range(12)).zip(mapped)
    replace_dp(traverse_dps(end), mapped, Adaptor(mapped))
    return end


def test_graph_tools_walk_through_a_torch_node() -> None:
    end = adapted()
    names = [type(node).__name__ for node in list_dps(end)]
    assert names == ["Zipper", "IterableWrapper", "Adaptor", "Mapper", "Shuffler", "IterableWrapper"]
    ((_, inputs),) = traverse_dps(end).values()
    assert len(inputs) == 2
    (mapper,) = find_dps(end, Mapper)
    assert isinstance(end.sources[1], Adaptor) and end.sources[1].datapipe is mapper


def test_a_loader_reads_a_graph_with_a_torch_node_and_resumes_at_every_cut() -> None:
    loader = DataLoader2(adapted())
    loader.seed(3)
    items = list(loader)
    assert [a for a, _ in items] == list(range(12))
    assert sorted(b for _, b in items) == [3 * x for x in range(12)]
    loader.shutdown()
    check_resume_at_every_cut(adapted, 3, cut_epochs=(0, 1))


def torch_sharded() -> Any:
    return IterableWrapper(range(30)).concat(Adaptor(TorchShardingFilter(IterableWrapper(range(100, 120)))))


@pytest.mark.timeout(120)
def test_a_torch_sharding_filter_inside_is_split_between_workers() -> None:
    service = MultiProcessingReadingService(2)
    with DataLoader2(torch_sharded(), reading_service=service) as loader:
        items = list(loader)
    # The first branch has no sharding point: each worker reads it; the torch filter splits.
    assert sorted(x for x in items if x >= 100) == list(range(100, 120))
    assert sorted(x for x in items if x < 100) == sorted(list(range(30)) * 2)


def torch_shuffled() -> Any:
    return IterableWrapper(range(40)).map(triple).concat(TorchShuffler(IterableWrapper(range(100, 140))))


def test_a_torch_shuffle_inside_is_seeded_by_the_loader() -> None:
    def epochs(seed: int) -> list[list[int]]:
        with DataLoader2(torch_shuffled()) as loader:
            loader.seed(seed)
            return [list(loader)[40:] for _ in range(2)]

    first = epochs(5)
    assert sorted(first[0]) == list(range(100, 140))
    assert first == epochs(5)
    assert first[0] != first[1]  # each epoch draws anew
    assert epochs(6) != first


def test_a_torch_shuffle_inside_resumes_exactly_at_every_cut() -> None:
    """It may hold items between its inputs' items, so it is replayed from where its pass
    began: resuming from its input's state alone would yield other items."""
    check_resume_at_every_cut(torch_shuffled, 2, cut_epochs=(0, 1))
