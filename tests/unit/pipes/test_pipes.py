"""Each iterable op: behaviour, length, errors, functional names."""

from __future__ import annotations

import copy
import threading
from typing import Any

import numpy as np
import pytest

from conveyor.pipes import (
    Batcher,
    Collator,
    IterableWrapper,
    IterDataPipe,
    Mapper,
    Prefetcher,
    SequenceWrapper,
    default_collate,
)


def test_functional_names_build_the_op_classes():
    source = IterableWrapper([1, 2, 3])
    assert isinstance(source.map(str), Mapper)
    assert isinstance(source.batch(2), Batcher)
    assert isinstance(source.batch(2).collate(), Collator)
    assert isinstance(source.prefetch(2), Prefetcher)
    assert source.map(str).source is source


def test_pipes_are_lazy_and_reiterable():
    calls = []

    def record(x):
        calls.append(x)
        return x * 10

    pipe = IterableWrapper(range(3)).map(record)
    assert calls == []
    assert list(pipe) == [0, 10, 20]
    assert list(pipe) == [0, 10, 20]
    assert calls == [0, 1, 2, 0, 1, 2]


def test_iterable_wrapper_deepcopy_isolates_passes():
    data = [[1], [2]]
    pipe = IterableWrapper(data).map(lambda lst: lst.append(9) or lst)
    assert list(pipe) == [[1, 9], [2, 9]]
    assert list(pipe) == [[1, 9], [2, 9]]
    assert data == [[1], [2]]
    shared = IterableWrapper(data, deepcopy=False).map(lambda lst: lst.append(9) or lst)
    list(shared)
    assert data == [[1, 9], [2, 9]]


def test_map_columns_tuple_dict_and_append():
    pairs = IterableWrapper([(1, 2), (3, 4)])
    assert list(pairs.map(lambda x: x * 10, input_col=1)) == [(1, 20), (3, 40)]
    assert list(pairs.map(lambda a, b: a + b, input_col=[0, 1], output_col=-1)) == [(1, 2, 3), (3, 4, 7)]
    dicts = IterableWrapper([{"a": 1}])
    original = {"a": 1}
    out = list(IterableWrapper([original], deepcopy=False).map(lambda v: v + 1, input_col="a", output_col="b"))
    assert out == [{"a": 1, "b": 2}]
    assert original == {"a": 1}, "the user's item must not be changed in place"
    assert list(dicts.map(lambda v: -v, input_col="a")) == [{"a": -1}]
    with pytest.raises(ValueError, match="output_col must be None"):
        pairs.map(abs, output_col=1)
    with pytest.raises(ValueError, match="output_col"):
        pairs.map(max, input_col=[0, 1])
    with pytest.raises(TypeError, match="callable"):
        pairs.map(3)


def test_map_error_names_the_pipe():
    def explode(x):
        raise ZeroDivisionError("boom")

    with pytest.raises(ZeroDivisionError, match="boom") as info:
        list(IterableWrapper([1]).map(explode).map(str))
    notes = getattr(info.value, "__notes__", [])
    assert len(notes) == 1 and "explode" in notes[0]


def test_filter_and_its_columns():
    assert list(IterableWrapper(range(6)).filter(lambda x: x % 2 == 0)) == [0, 2, 4]
    pairs = IterableWrapper([(1, "a"), (2, "b")])
    assert list(pairs.filter(lambda n: n > 1, input_col=0)) == [(2, "b")]
    with pytest.raises(TypeError, match="has no length"):
        len(IterableWrapper(range(3)).filter(bool))


def test_flatmap_and_default_flatten():
    assert list(IterableWrapper([1, 2]).flatmap(lambda x: [x] * x)) == [1, 2, 2]
    assert list(IterableWrapper([[1, 2], [], [3]]).flatmap()) == [1, 2, 3]


def test_batch_unbatch_round_trip_and_lengths():
    pipe = IterableWrapper(range(7))
    assert list(pipe.batch(3)) == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(pipe.batch(3, drop_last=True)) == [[0, 1, 2], [3, 4, 5]]
    assert len(pipe.batch(3)) == 3 and len(pipe.batch(3, drop_last=True)) == 2
    assert list(pipe.batch(3).unbatch()) == list(range(7))
    nested = IterableWrapper([[[1, 2], [3]], [[4]]])
    assert list(nested.unbatch(unbatch_level=2)) == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="batch_size"):
        pipe.batch(0)
    with pytest.raises(ValueError, match="batch_size"):
        pipe.batch(True)
    with pytest.raises(TypeError, match="list or tuple"):
        list(IterableWrapper([1]).unbatch())


def test_default_collate_is_numpy_aware():
    images = [np.full((2, 2), i, dtype=np.uint8) for i in range(3)]
    batch = default_collate([(img, i, "name") for i, img in enumerate(images)])
    stacked, labels, names = batch
    assert stacked.shape == (3, 2, 2) and stacked.dtype == np.uint8
    assert labels.tolist() == [0, 1, 2]
    assert names == ["name"] * 3
    as_dicts = default_collate([{"x": 1.5, "y": np.zeros(2)}, {"x": 2.5, "y": np.ones(2)}])
    assert as_dicts["x"].tolist() == [1.5, 2.5] and as_dicts["y"].shape == (2, 2)
    assert default_collate([]) == []
    with pytest.raises(ValueError, match="different lengths"):
        default_collate([(1, 2), (1,)])


def test_collate_op_with_custom_fn_and_tensors():
    pipe = IterableWrapper(range(4)).batch(2)
    assert list(pipe.collate(sum)) == [1, 5]
    arrays = [a.tolist() for a in pipe.collate()]
    assert arrays == [[0, 1], [2, 3]]
    torch = pytest.importorskip("torch")
    tensors = list(IterableWrapper([np.arange(3)] * 2).batch(2).collate(to_tensor=True))
    assert isinstance(tensors[0], torch.Tensor) and tensors[0].shape == (2, 3)


def test_header_never_reads_past_its_limit():
    seen = []
    pipe = IterableWrapper(range(100)).map(lambda x: seen.append(x) or x).header(3)
    assert list(pipe) == [0, 1, 2]
    assert seen == [0, 1, 2]
    assert len(pipe) == 3
    assert len(IterableWrapper(range(2)).header(5)) == 2


def test_cycle_counts_and_empty_input():
    assert list(IterableWrapper([1, 2]).cycle(3)) == [1, 2, 1, 2, 1, 2]
    assert len(IterableWrapper([1, 2]).cycle(3)) == 6
    assert list(IterableWrapper([]).cycle()) == []
    forever = iter(IterableWrapper([7]).cycle())
    assert [next(forever) for _ in range(5)] == [7] * 5
    with pytest.raises(TypeError, match="never ends"):
        len(IterableWrapper([1]).cycle())


def test_concat_zip_mux_enumerate():
    a, b = IterableWrapper([1, 2, 3]), IterableWrapper("xy")
    assert list(a.concat(b)) == [1, 2, 3, "x", "y"]
    assert len(IterableWrapper([1, 2, 3]).concat(IterableWrapper("xy"))) == 5
    assert list(IterableWrapper([1, 2, 3]).zip(IterableWrapper("xy"))) == [(1, "x"), (2, "y")]
    assert len(IterableWrapper([1, 2, 3]).zip(IterableWrapper("xy"))) == 2
    # torchdata's mux: whole rounds until the first input ends; mux_longest goes on
    assert list(IterableWrapper([1, 2, 3]).mux(IterableWrapper("xy"))) == [1, "x", 2, "y"]
    assert list(IterableWrapper([1, 2]).mux(IterableWrapper("xyz"))) == [1, "x", 2, "y"]
    assert len(IterableWrapper([1, 2, 3]).mux(IterableWrapper("xy"), IterableWrapper("pqrs"))) == 6
    assert list(IterableWrapper([1, 2, 3]).mux_longest(IterableWrapper("xy"))) == [1, "x", 2, "y", 3]
    assert len(IterableWrapper([1, 2, 3]).mux_longest(IterableWrapper("xy"))) == 5
    assert list(IterableWrapper("ab").enumerate(starting_index=5)) == [(5, "a"), (6, "b")]
    with pytest.raises(TypeError, match="IterDataPipes"):
        IterableWrapper([1]).zip([1, 2])


def test_set_length():
    pipe = IterableWrapper(iter(range(3)), deepcopy=False).set_length(3)
    assert len(pipe) == 3
    with pytest.raises(ValueError, match="length"):
        IterableWrapper([]).set_length(-1)


def test_len_errors_name_the_pipe():
    with pytest.raises(TypeError, match=r"IterableWrapper.*has no length"):
        len(IterableWrapper(x for x in range(3)))


def test_shuffle_is_a_permutation_and_can_be_disabled():
    pipe = IterableWrapper(range(50)).shuffle(buffer_size=8)
    out = list(pipe)
    assert sorted(out) == list(range(50)) and out != list(range(50))
    assert len(pipe) == 50
    assert list(copy.deepcopy(pipe).set_shuffle(False)) == list(range(50))


def test_prefetch_yields_everything_in_order_and_stops_its_thread():
    before = threading.active_count()
    pipe = IterableWrapper(range(1000)).prefetch(4)
    assert list(pipe) == list(range(1000))
    iterator = iter(pipe)
    assert [next(iterator) for _ in range(3)] == [0, 1, 2]
    iterator.close()  # breaking off mid-pass stops the producer
    assert threading.active_count() == before


def test_prefetch_reraises_upstream_errors():
    def fail_at_five(x):
        if x == 5:
            raise KeyError("five")
        return x

    with pytest.raises(KeyError, match="five"):
        list(IterableWrapper(range(10)).map(fail_at_five).prefetch(2))


def test_custom_pipe_registers_functional_name():
    @IterDataPipe.register_functional("double_it_for_test")
    class Doubler(IterDataPipe):
        def __init__(self, source):
            self.source = source

        def __iter__(self):
            for x in self.source:
                yield 2 * x

    assert list(IterableWrapper([1, 2]).double_it_for_test()) == [2, 4]
    with pytest.raises(ValueError, match="already taken"):
        IterDataPipe.register_functional("map")(Doubler)


@pytest.mark.parametrize(
    ("call", "own", "expected"),
    [
        ("batch", "batch_size", [[0, 1], [2, 3], [4]]),
        ("header", "limit", [0, 1]),
        ("cycle", "count", [0, 1, 2, 3, 4, 0, 1, 2, 3, 4]),
        ("prefetch", "buffer_size", [0, 1, 2, 3, 4]),
    ],
)
def test_count_arguments_take_n_or_torchdatas_name(call: str, own: str, expected: list[Any]) -> None:
    source = IterableWrapper(range(5))
    assert list(getattr(source, call)(n=2)) == expected
    assert list(getattr(source, call)(**{own: 2})) == expected
    with pytest.raises(TypeError, match="both n= and"):
        getattr(source, call)(n=2, **{own: 2})


def test_set_length_and_map_batch_take_n() -> None:
    assert len(IterableWrapper(range(5)).set_length(n=3)) == 3
    assert list(SequenceWrapper(range(5)).batch(n=2)) == [[0, 1], [2, 3], [4]]


def test_collate_takes_torchdatas_collate_fn_keyword():
    batches = IterableWrapper([[1, 2], [3]])
    assert list(batches.collate(collate_fn=sum)) == list(batches.collate(sum)) == [3, 3]
