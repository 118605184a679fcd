"""The ``Shuffle`` adapter as torchdata's: ``True`` turns shuffles on (appending one, with
a warning, to a graph that has none), ``False`` turns them off, ``None`` changes nothing."""

from __future__ import annotations

import warnings

import pytest

from conveyor import DataLoader2, Shuffle
from conveyor.pipes import IterableWrapper, SequenceWrapper

SIZE = 200


def test_shuffle_true_on_a_graph_without_a_shuffle_warns_and_appends_one() -> None:
    source = IterableWrapper(range(SIZE))
    with pytest.warns(UserWarning, match="has no shuffle: appending one"):
        loader = DataLoader2(source, datapipe_adapter_fn=Shuffle(True))
    loader.seed(1)
    items = list(loader)
    assert items != list(range(SIZE)) and sorted(items) == list(range(SIZE))
    assert list(DataLoader2(source)) == list(range(SIZE))  # the user's graph is unchanged


def test_shuffle_none_leaves_the_graph_as_it_is() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plain = DataLoader2(IterableWrapper(range(SIZE)), datapipe_adapter_fn=[Shuffle(None)])
        shuffled = DataLoader2(IterableWrapper(range(SIZE)).shuffle(), datapipe_adapter_fn=[Shuffle(None)])
    assert list(plain) == list(range(SIZE))
    shuffled.seed(2)
    assert list(shuffled) != list(range(SIZE))


def test_shuffle_false_turns_every_shuffle_off_and_true_turns_them_back_on() -> None:
    graph = IterableWrapper(range(SIZE)).shuffle().map(int).shuffle(buffer_size=10)
    assert list(DataLoader2(graph, datapipe_adapter_fn=Shuffle(False))) == list(range(SIZE))
    on = DataLoader2(graph, datapipe_adapter_fn=[Shuffle(False), Shuffle(True)])
    on.seed(3)
    assert list(on) != list(range(SIZE))
    mapped = SequenceWrapper(list(range(SIZE))).shuffle()
    assert list(DataLoader2(mapped, datapipe_adapter_fn=Shuffle(False))) == list(range(SIZE))
    assert repr(Shuffle(None)) == "Shuffle(enable=None)"
