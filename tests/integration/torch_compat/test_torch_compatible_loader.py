"""``conveyor.DataLoader``: torch's ``DataLoader`` arguments, checks and batches, with
``StatefulDataLoader``-style checkpoints that resume at every step on any worker count."""

from __future__ import annotations

import json
import warnings
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from conveyor import DataLoader
from conveyor.errors import StateError
from hypothesis_profiles import scaled
from stateful_datasets import DrawingStream, Noisy, identity, rest_after_reseeded_resume

pytestmark = pytest.mark.timeout(180)


class Squares(Dataset):
    """Map-style: item ``i`` is a dict of an int and a small tensor."""

    def __init__(self, n: int = 23) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"i": i, "sq": torch.tensor([i, i * i])}


class Stream(IterableDataset):
    """Iterable: splits itself between torch's workers by ``get_worker_info()``."""

    def __init__(self, n: int = 30) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Any:
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(start, self.n, step))


class WorkerFacts(Dataset):
    """Each item tells what torch's worker info said in the worker that fetched it."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> tuple[int, int, int, bool, int]:
        info = get_worker_info()
        if info is None:
            return (i, -1, -1, False, -1)
        return (i, info.id, info.num_workers, info.dataset is not None, info.seed - info.id)


def same(a: Any, b: Any) -> bool:
    """Deep equality through dicts, lists and tensors."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def read(loader: Any, epochs: int = 2) -> list[list[Any]]:
    try:
        return [list(loader) for _ in range(epochs)]
    finally:
        if isinstance(loader, DataLoader):
            loader.shutdown()


# --- arguments ----------------------------------------------------------------------------


BAD_ARGUMENTS = [
    {"num_workers": -1},
    {"timeout": -1},
    {"prefetch_factor": 2},
    {"num_workers": 1, "prefetch_factor": -1},
    {"persistent_workers": True},
    {"sampler": [0, 1], "shuffle": True},
    {"batch_sampler": [[0]], "batch_size": 2},
    {"batch_sampler": [[0]], "shuffle": True},
    {"batch_sampler": [[0]], "drop_last": True},
    {"batch_size": None, "drop_last": True},
]


@pytest.mark.parametrize("kwargs", BAD_ARGUMENTS, ids=lambda k: ",".join(k))
def test_bad_combinations_raise_what_torch_raises(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError) as theirs:
        TorchDataLoader(Squares(), **kwargs)
    with pytest.raises(ValueError) as ours:
        DataLoader(Squares(), **kwargs)
    first_words = str(theirs.value).split()[:3]
    assert str(ours.value).split()[:3] == first_words


@pytest.mark.parametrize("kwargs", [{"shuffle": True}, {"sampler": [0]}, {"batch_sampler": [[0]]}])
def test_an_iterable_dataset_refuses_samplers_and_shuffle_as_torch_does(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="IterableDataset: expected unspecified"):
        DataLoader(Stream(), **kwargs)


def test_the_attributes_are_torchs() -> None:
    ours, theirs = (
        DataLoader(Squares(), batch_size=4, shuffle=True),
        TorchDataLoader(Squares(), batch_size=4, shuffle=True),
    )
    assert type(ours.sampler) is type(theirs.sampler) and type(ours.batch_sampler) is type(theirs.batch_sampler)
    assert (ours.batch_size, ours.drop_last, ours.collate_fn) == (
        theirs.batch_size,
        theirs.drop_last,
        theirs.collate_fn,
    )
    assert DataLoader(Squares(), num_workers=2).prefetch_factor == 2


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"batch_size": 4}, {"batch_size": 4, "drop_last": True}, {"batch_size": None}, {"batch_size": 7}],
)
def test_len_is_torchs(kwargs: dict[str, Any]) -> None:
    assert len(DataLoader(Squares(), **kwargs)) == len(TorchDataLoader(Squares(), **kwargs))
    assert len(DataLoader(Stream(), **kwargs)) == len(TorchDataLoader(Stream(), **kwargs))


# --- the same batches as torch ------------------------------------------------------------


@settings(max_examples=scaled(12), deadline=None)
@given(
    batch_size=st.sampled_from([None, 1, 3, 8]),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
    workers=st.sampled_from([0, 1, 2]),
    seed=st.integers(0, 2**31),
    with_generator=st.booleans(),
)
def test_map_style_batches_equal_torchs(
    batch_size: int | None, shuffle: bool, drop_last: bool, workers: int, seed: int, with_generator: bool
) -> None:
    drop_last = drop_last and batch_size is not None

    def make(cls: Any) -> Any:
        generator = torch.Generator().manual_seed(seed) if with_generator else None
        kwargs = {"batch_size": batch_size, "shuffle": shuffle, "drop_last": drop_last, "generator": generator}
        return cls(Squares(), num_workers=workers, **kwargs)

    torch.manual_seed(seed)
    theirs = read(make(TorchDataLoader))
    torch.manual_seed(seed)
    ours = read(make(DataLoader))
    assert same(ours, theirs)


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")  # 3 workers on 2 cores
@pytest.mark.parametrize("workers", [0, 2, 3])
@pytest.mark.parametrize("batch_size", [None, 4])
def test_an_iterable_dataset_gives_torchs_batches(workers: int, batch_size: int | None) -> None:
    theirs = read(TorchDataLoader(Stream(), batch_size=batch_size, num_workers=workers), 1)
    ours = read(DataLoader(Stream(), batch_size=batch_size, num_workers=workers), 1)
    assert same(ours, theirs)


def test_torchs_worker_info_in_the_workers_and_none_in_the_main_process() -> None:
    torch.manual_seed(4)
    (main,) = read(DataLoader(WorkerFacts(), batch_size=None), 1)
    assert {tuple(facts[1:]) for facts in main} == {(-1, -1, False, -1)}  # default_convert makes lists
    torch.manual_seed(4)
    (ours,) = read(DataLoader(WorkerFacts(), batch_size=None, num_workers=2), 1)
    torch.manual_seed(4)
    (theirs,) = read(TorchDataLoader(WorkerFacts(), batch_size=None, num_workers=2), 1)
    assert ours == theirs  # the same ids, counts and base seed as torch's workers
    assert {facts[1] for facts in ours} == {0, 1}


class Tagging:
    """A ``worker_init_fn`` that leaves a mark torch's and conveyor's workers can show."""

    def __call__(self, worker_id: int) -> None:
        torch.utils.data.get_worker_info().dataset.tag = worker_id * 100


class Tagged(Dataset):
    tag = -1

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> int:
        return self.tag + i


def test_worker_init_fn_runs_in_each_worker_with_its_id() -> None:
    ours = read(DataLoader(Tagged(), batch_size=None, num_workers=2, worker_init_fn=Tagging()), 1)
    theirs = read(TorchDataLoader(Tagged(), batch_size=None, num_workers=2, worker_init_fn=Tagging()), 1)
    assert ours == theirs == [[0, 101, 2, 103, 4, 105]]


# --- checkpoints --------------------------------------------------------------------------


def resumable(workers: int, seed: int = 3) -> DataLoader:
    return DataLoader(
        Squares(), batch_size=3, shuffle=True, num_workers=workers, generator=torch.Generator().manual_seed(seed)
    )


@pytest.mark.parametrize(("saved_with", "resumed_with"), [(0, 0), (2, 2), (0, 2), (2, 3), (3, 0)])
def test_resumes_at_every_step_on_any_worker_count(saved_with: int, resumed_with: int) -> None:
    full = read(resumable(saved_with))
    steps = len(full[0])
    for cut in range(steps + 1):
        loader = resumable(saved_with)
        it = iter(loader)
        head = [next(it) for _ in range(cut)]
        state = json.loads(json.dumps(loader.state_dict()))
        loader.shutdown()
        again = resumable(resumed_with)
        again.load_state_dict(state)
        rest, following = read(again)
        if cut == steps:  # after the epoch's last batch: the first iter() reads the next epoch
            assert same(rest, full[1]), cut
            continue
        assert same(head + rest, full[0]), cut
        assert same(following, full[1]), cut


def test_a_state_between_epochs_resumes_the_next_epoch() -> None:
    full = read(resumable(2), 3)
    loader = resumable(2)
    list(loader)
    state = json.loads(json.dumps(loader.state_dict()))
    loader.shutdown()
    again = resumable(0)
    again.load_state_dict(state)
    assert same(read(again), full[1:])


def test_a_state_of_another_loader_is_refused() -> None:
    loader = resumable(0)
    next(iter(loader))
    state = loader.state_dict()
    with pytest.raises(StateError):
        DataLoader(Squares(9), batch_size=5).load_state_dict(state)
    broken = dict(state, format="something else")
    with pytest.raises(StateError, match="format"):
        resumable(0).load_state_dict(broken)


def test_pin_memory_without_an_accelerator_warns_and_keeps_batches() -> None:
    with pytest.warns(UserWarning, match="no accelerator"):
        theirs = read(TorchDataLoader(Squares(), batch_size=4, pin_memory=True), 1)
    with pytest.warns(UserWarning, match="no accelerator"):
        ours = read(DataLoader(Squares(), batch_size=4, pin_memory=True, num_workers=2), 1)
    assert same(ours, theirs)


class Positioned(torch.utils.data.Sampler):
    """torchdata's protocol for a sampler that keeps its own position: ``state_dict()`` is
    where the current pass stands, and after ``load_state_dict`` the next iteration goes on
    from there. Its order depends on the epoch the user sets, as ``DistributedSampler``'s.
    The state holds a tensor and a tuple, as real ones do."""

    def __init__(self, n: int) -> None:
        self.n, self.epoch, self.yielded = n, 0, 0
        self._resume_at: int | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Any:
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(100 + self.epoch)).tolist()
        start, self._resume_at = self._resume_at or 0, None
        self.yielded = start
        for key in order[start:]:
            self.yielded += 1
            yield key

    def state_dict(self) -> dict[str, Any]:
        return {"yielded": torch.tensor(self.yielded), "shape": (self.n,)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resume_at = int(state["yielded"])


def epochs_with(loader: DataLoader, sampler: Positioned, epochs: range) -> list[list[Any]]:
    out = []
    for epoch in epochs:
        sampler.set_epoch(epoch)
        out.append(list(loader))
    return out


@pytest.mark.parametrize(("saved_with", "resumed_with"), [(0, 0), (2, 2), (2, 3), (2, 0)])
def test_a_sampler_that_keeps_its_position_resumes_exactly(saved_with: int, resumed_with: int) -> None:
    def make(workers: int) -> tuple[DataLoader, Positioned]:
        sampler = Positioned(23)
        return DataLoader(Squares(), batch_size=4, sampler=sampler, num_workers=workers), sampler

    loader, sampler = make(saved_with)
    full = epochs_with(loader, sampler, range(3))
    loader.shutdown()
    assert not same(full[0], full[1])  # each epoch its own order
    for cut in (0, 2, 6):  # inside the second epoch, and after its last batch (6 of 6)
        loader, sampler = make(saved_with)
        epochs_with(loader, sampler, range(1))
        sampler.set_epoch(1)
        it = iter(loader)
        head = [next(it) for _ in range(cut)]
        state = json.loads(json.dumps(loader.state_dict()))
        loader.shutdown()
        again, resumed_sampler = make(resumed_with)
        resumed_sampler.set_epoch(1)  # the user's own bookkeeping, as with DistributedSampler
        again.load_state_dict(state)
        if cut == 6:
            # After the epoch's last batch: the first iter() is the next epoch, whose order
            # the user's bookkeeping sets (as a trainer's set_epoch() does).
            assert same(epochs_with(again, resumed_sampler, range(2, 3)), full[2:]), cut
            again.shutdown()
            continue
        assert same(head + list(again), full[1]), cut
        assert same(epochs_with(again, resumed_sampler, range(2, 3)), full[2:]), cut
        again.shutdown()


# --- iterable datasets that keep their position ------------------------------------------


class CountingStream(IterableDataset):
    """An iterable dataset that is its own iterator and keeps its position."""

    def __init__(self, n: int) -> None:
        self.n, self.i = n, 0

    def __iter__(self) -> CountingStream:
        return self

    def __next__(self) -> int:
        if self.i >= self.n:
            raise StopIteration
        self.i += 1
        return self.i * 10

    def state_dict(self) -> dict[str, Any]:
        return {"i": self.i}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.i = state["i"]


@pytest.mark.parametrize("workers", [0, 3])
@pytest.mark.parametrize("every", [1, 5])
@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
def test_an_iterable_dataset_that_keeps_its_position_resumes_from_it(workers: int, every: int) -> None:
    """The items draw from the global RNG: resuming by replay in the main process would
    draw other numbers; the iterator's own state (its RNG included) resumes exactly."""

    def make() -> DataLoader:
        return DataLoader(
            DrawingStream([0, 20, 7]), num_workers=workers, collate_fn=identity, snapshot_every_n_steps=every
        )

    for cut in (0, 1, 10):
        expected, resumed = rest_after_reseeded_resume(make, cut)
        assert resumed == expected, cut


def test_a_dataset_that_is_its_own_iterator_and_keeps_its_position() -> None:
    loader = DataLoader(CountingStream(9), batch_size=2)
    it = iter(loader)
    head = [next(it).tolist() for _ in range(2)]
    state = json.loads(json.dumps(loader.state_dict()))
    rest = [b.tolist() for b in it]
    again = DataLoader(CountingStream(9), batch_size=2)
    again.load_state_dict(state)
    assert head + [b.tolist() for b in again] == head + rest == [[10, 20], [30, 40], [50, 60], [70, 80], [90]]


def test_an_iterator_keeps_reading_when_its_loader_is_dropped() -> None:
    """``for batch in DataLoader(...)``: nothing else holds the loader."""
    assert sum(batch["i"].numel() for batch in DataLoader(Squares(), batch_size=4, num_workers=2)) == 23


@pytest.mark.parametrize("workers", [0, 2])
def test_a_map_dataset_that_keeps_a_state_resumes_its_draws(workers: int) -> None:
    def make(count: int) -> DataLoader:
        generator = torch.Generator().manual_seed(13)
        return DataLoader(
            Noisy(), batch_size=3, shuffle=True, generator=generator, num_workers=count, collate_fn=identity
        )

    for cut in (0, 1, 5):
        expected, resumed = rest_after_reseeded_resume(lambda: make(workers), cut)
        assert resumed == expected, cut
    loader = make(2)
    next(iter(loader))
    state = loader.state_dict()
    loader.shutdown()
    with pytest.raises(StateError, match="keeps a state of its own in each worker"):
        make(3).load_state_dict(state)


class EveryWorkerReadsAll(IterableDataset):
    """Says it has ``n`` items, and each worker yields them all (its replica unconfigured)."""

    def __init__(self, n: int = 6) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Any:
        return iter(range(self.n))


def test_workers_yielding_more_than_the_datasets_len_warn_as_torchs(start_method: str) -> None:
    dataset = EveryWorkerReadsAll(6)
    loader = DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context=start_method)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert len(list(loader)) == 12  # len() not asked yet: no warning
        assert len(loader) == 6
        it = iter(loader)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert len([next(it) for _ in range(6)]) == 6  # up to the length: none
        for fetched in range(7, 13):
            with pytest.warns(UserWarning, match=rf"but {fetched} samples have been fetched\. For multiprocessing"):
                next(it)
        with pytest.raises(StopIteration):
            next(it)
    finally:
        loader.shutdown()
