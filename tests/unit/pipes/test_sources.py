"""Sources: IterableWrapper, SequenceWrapper and random-access ops, local files."""

from __future__ import annotations

import json

import pytest

from conveyor import DataLoader2
from conveyor.errors import ResumeError, StateError
from conveyor.pipes import FileLister, FileOpener, IterableWrapper, LineReader, SequenceWrapper
from pipeline_helpers import finish_epoch


def test_iterable_wrapper_resumes_lists_by_seeking(monkeypatch):
    pipe = IterableWrapper(list(range(10)))
    pipe.load_state_dict({"index": 7})
    assert list(pipe) == [7, 8, 9]
    pipe.load_state_dict({"index": 3})
    assert pipe.state_dict() == {"index": 3}
    assert list(pipe) == list(range(3, 10))


def test_iterable_wrapper_resumes_custom_iterables_by_replay():
    class Squares:
        def __iter__(self):
            return (i * i for i in range(6))

    pipe = IterableWrapper(Squares())
    pipe.load_state_dict({"index": 4})
    assert list(pipe) == [16, 25]


def test_one_shot_iterators_cannot_resume():
    pipe = IterableWrapper((i for i in range(5)), deepcopy=False)
    pipe.load_state_dict({"index": 2})
    with pytest.raises(ResumeError, match="one-shot"):
        list(pipe)


def test_sequence_wrapper_random_access():
    pipe = SequenceWrapper(["a", "b", "c"])
    assert pipe[0] == "a" and pipe[-1] == "c" and len(pipe) == 3
    with pytest.raises(IndexError):
        pipe[3]
    with pytest.raises(TypeError):
        SequenceWrapper(x for x in "ab")


def test_map_datapipe_ops():
    pipe = SequenceWrapper(list(range(10)))
    assert pipe.map(lambda x: x * 2)[3] == 6
    batched = pipe.batch(4)
    assert len(batched) == 3 and batched[2] == [8, 9]
    assert len(pipe.batch(4, drop_last=True)) == 2
    shuffled = pipe.shuffle()
    assert sorted(shuffled[i] for i in range(10)) == list(range(10))
    assert list(pipe.to_iter_datapipe().map(str)) == [str(i) for i in range(10)]


def test_random_access_ops_have_the_empty_state() -> None:
    base = SequenceWrapper(list(range(4)))
    for pipe in (base, base.map(str), base.shuffle(), base.batch(2)):
        assert pipe.state_dict() == {}
        pipe.load_state_dict({})
        pipe.load_state_dict(json.loads(json.dumps(pipe.state_dict())))
        with pytest.raises(StateError, match="holds no state"):
            pipe.load_state_dict({"index": 1})
        with pytest.raises(StateError, match="must be a dict"):
            pipe.load_state_dict([])  # type: ignore[arg-type]


def test_map_shuffle_is_a_new_global_permutation_each_epoch():
    loader = DataLoader2(SequenceWrapper(list(range(200))).shuffle())
    loader.seed(0)
    first, second = list(loader), list(loader)
    assert sorted(first) == sorted(second) == list(range(200))
    assert first != second and first != list(range(200))
    # a global shuffle: items move far, not only within a window
    assert max(abs(a - b) for a, b in zip(first, range(200), strict=True)) > 100


@pytest.fixture
def text_tree(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.txt").write_text("b1\nb2\n")
    (tmp_path / "a.txt").write_text("a1\na2\na3\n")
    (tmp_path / "skip.csv").write_text("x\n")
    (tmp_path / "sub" / "c.txt").write_text("c1\n")
    return tmp_path


def test_file_lister_is_sorted_masked_and_recursive(text_tree):
    names = [p.replace(str(text_tree), "") for p in FileLister(str(text_tree), masks="*.txt")]
    assert names == ["/a.txt", "/b.txt"]
    recursive = list(FileLister(str(text_tree), masks=["*.txt"], recursive=True))
    assert [p.replace(str(text_tree), "") for p in recursive] == ["/a.txt", "/b.txt", "/sub/c.txt"]
    assert len(list(FileLister(str(text_tree)))) == 3
    with pytest.raises(FileNotFoundError, match="no such"):
        list(FileLister(str(text_tree / "missing")))


def test_open_and_read_lines(text_tree):
    pipe = FileLister(str(text_tree), masks="*.txt").open_files().readlines()
    lines = [(p.rsplit("/", 1)[1], line) for p, line in pipe]
    assert lines == [("a.txt", "a1"), ("a.txt", "a2"), ("a.txt", "a3"), ("b.txt", "b1"), ("b.txt", "b2")]
    binary = LineReader(FileOpener(FileLister(str(text_tree / "b.txt")), mode="b"), return_path=False)
    assert list(binary) == [b"b1", b"b2"]
    with pytest.raises(ValueError, match="read-only"):
        FileOpener(IterableWrapper([]), mode="w")


def test_reading_lines_resumes_mid_file(text_tree):
    def build():
        return FileLister(str(text_tree), masks="*.txt").shuffle().open_files().readlines(return_path=False)

    reference = DataLoader2(build())
    reference.seed(1)
    expected = list(reference)
    for cut in range(len(expected) + 1):
        loader = DataLoader2(build())
        loader.seed(1)
        iterator = iter(loader)
        head = [next(iterator) for _ in range(cut)]
        state = json.loads(json.dumps(loader.state_dict()))
        loader.shutdown()
        resumed = DataLoader2(build())
        resumed.load_state_dict(state)
        assert finish_epoch(resumed, head, expected) == expected
