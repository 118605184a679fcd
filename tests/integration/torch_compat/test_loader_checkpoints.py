"""``conveyor.DataLoader``'s checkpoints in the corners torchdata's ``StatefulDataLoader``
defines: a state asked for before the first ``iter()``, a state just loaded, states taken
before the first batch, datasets that are their own iterators, and datasets whose state
and whose iterator's state are both kept."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from torch.utils.data import IterableDataset, get_worker_info

from conveyor import DataLoader
from conveyor.errors import StateError
from stateful_datasets import Drawing, DrawingStream, Noisy, identity, rest_after_reseeded_resume

pytestmark = pytest.mark.timeout(180)


def through_json(state: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(state))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_before_the_first_iter_begins_the_epoch_that_iter_reads(workers: int) -> None:
    """As torchdata's: the epoch (its base seed, its workers' seeds) is fixed when the
    state is asked for, so a loader resumed from it reads that very epoch."""
    torch.manual_seed(7)
    loader = DataLoader(Noisy(), batch_size=4, num_workers=workers, collate_fn=identity)
    state = through_json(loader.state_dict())
    assert through_json(loader.state_dict()) == state  # asked again: the same epoch, not begun twice
    try:
        expected = list(loader)
    finally:
        loader.shutdown()
    torch.manual_seed(99)  # the resumed epoch must not draw again
    again = DataLoader(Noisy(), batch_size=4, num_workers=workers, collate_fn=identity)
    again.load_state_dict(state)
    try:
        assert list(again) == expected
    finally:
        again.shutdown()


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loaded_state_is_what_state_dict_answers_until_the_next_iter(workers: int) -> None:
    loader = DataLoader(Noisy(), batch_size=4, shuffle=True, num_workers=workers, collate_fn=identity)
    it = iter(loader)
    next(it)
    mid_epoch = through_json(loader.state_dict())
    list(it)
    between_epochs = through_json(loader.state_dict())
    other = DataLoader(Noisy(), batch_size=4, shuffle=True, num_workers=workers, collate_fn=identity)
    try:
        for state in (mid_epoch, between_epochs):
            moving = iter(other)
            next(moving)
            next(moving)
            other.load_state_dict(state)
            assert through_json(other.state_dict()) == state
    finally:
        loader.shutdown()
        other.shutdown()


def test_snapshot_every_n_steps_zero_is_accepted_and_resumes_exactly() -> None:
    def make() -> DataLoader:
        return DataLoader(DrawingStream([5, 9]), num_workers=2, collate_fn=identity, snapshot_every_n_steps=0)

    for cut in (0, 3):
        expected, resumed = rest_after_reseeded_resume(make, cut)
        assert resumed == expected, cut


def test_a_state_before_the_first_batch_resumes_draws_the_sampler_made_from_the_global_rng() -> None:
    """In the main process, the default shuffle draws its order from torch's global RNG at
    the first batch, after the dataset's state (that RNG, here) was saved. A resume sets
    the dataset's state back, so the order must be drawn from it again, advancing it as
    the first time, or every item after would come from a shifted RNG."""
    loader = DataLoader(Noisy(), shuffle=True, collate_fn=identity)
    it = iter(loader)
    before_any = loader.state_dict()
    first = [next(it) for _ in range(4)]
    loader.load_state_dict(loader.state_dict())
    whole = first + list(loader)
    loader.load_state_dict(before_any)
    assert list(loader) == whole


class Restarting(IterableDataset):
    """Its own iterator, as many torch users write one: ``__iter__`` (re)starts this
    worker's range, so anything that calls ``iter()`` on it again starts it over."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.cursor: list[int] = [0, 0]

    def __iter__(self) -> Restarting:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        share = self.n // workers
        self.cursor = [share * worker, share * (worker + 1)]
        return self

    def __next__(self) -> int:
        if self.cursor[0] >= self.cursor[1]:
            raise StopIteration
        self.cursor[0] += 1
        return self.cursor[0] - 1

    def state_dict(self) -> dict[str, Any]:
        return {"cursor": list(self.cursor)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cursor = list(state["cursor"])  # only meaningful after __iter__ made the range


@pytest.mark.parametrize("workers", [0, 2])
def test_a_dataset_that_is_its_own_iterator_is_started_once_and_loaded_after(workers: int) -> None:
    loader = DataLoader(Restarting(40), num_workers=workers, collate_fn=identity)
    it = iter(loader)
    seen = [x for _ in range(25) for x in next(it)]
    state = through_json(loader.state_dict())
    loader.shutdown()
    again = DataLoader(Restarting(40), num_workers=workers, collate_fn=identity)
    again.load_state_dict(state)
    try:
        rest = [x for batch in again for x in batch]
    finally:
        again.shutdown()
    assert sorted(seen + rest) == list(range(40))


class Offset(IterableDataset):
    """The dataset keeps a state (an offset, set between epochs) and so does its iterator
    (its position): torchdata loads the dataset's, then calls ``iter()``, then loads the
    iterator's."""

    def __init__(self) -> None:
        self.offset = 0

    def __iter__(self) -> Drawing:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return Drawing([self.offset + k for k in range(worker, 30, workers)])

    def state_dict(self) -> dict[str, Any]:
        return {"offset": self.offset}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.offset = state["offset"]


@pytest.mark.parametrize("workers", [0, 2])
def test_the_datasets_state_is_loaded_before_iter_and_its_iterators_after(workers: int) -> None:
    def make() -> DataLoader:
        dataset = Offset()
        dataset.offset = 1000  # what the dataset's own state carries: the resumed pass must see it
        return DataLoader(dataset, num_workers=workers, collate_fn=identity)

    def make_fresh() -> DataLoader:  # the offset arrives with the state only
        return DataLoader(Offset(), num_workers=workers, collate_fn=identity)

    loader = make()
    it = iter(loader)
    head = [next(it) for _ in range(7)]
    state = through_json(loader.state_dict())
    expected = list(it)
    loader.shutdown()
    torch.manual_seed(4321)
    again = make_fresh()
    again.load_state_dict(state)
    try:
        assert list(again) == expected
    finally:
        again.shutdown()
    assert all(key >= 1000 for batch in head + expected for key, _ in batch)


# --- between epochs ---------------------------------------------------------------------


class Seeds(torch.utils.data.Dataset):
    """Each item: its key, and the base seed of the worker that fetched it (-1 in the main
    process) with a draw from that worker's torch RNG."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> tuple[int, int, int]:
        info = get_worker_info()
        if info is None:  # the user's RNG, in the main process: no loader state can hold it
            return i, -1, -1
        return i, info.seed - info.id, int(torch.randint(1000, (1,)))


def next_epoch_after_resume(make: Any, before: Any = None) -> tuple[list[Any], list[Any]]:
    """Read an epoch of ``make()``, save between epochs, read the next; then (after
    ``before()``, which may move torch's global RNG) a new ``make()`` loads the state and
    reads: ``(the next epoch as read, as resumed)``."""
    loader = make()
    try:
        list(loader)
        state = through_json(loader.state_dict())
        expected = list(loader)
    finally:
        loader.shutdown()
    if before is not None:
        before(state)
    again = make()
    again.load_state_dict(state)
    try:
        return expected, list(again)
    finally:
        again.shutdown()


@pytest.mark.parametrize("workers", [0, 2])
def test_the_loaders_generator_is_kept_between_epochs(workers: int) -> None:
    """The base seed comes from ``generator`` even when the sampler (sequential) has none."""
    generator = torch.Generator()

    def make() -> DataLoader:
        return DataLoader(Seeds(), batch_size=2, num_workers=workers, generator=generator, collate_fn=identity)

    generator.manual_seed(5)
    expected, resumed = next_epoch_after_resume(make, before=lambda _: generator.manual_seed(77))
    assert resumed == expected


@pytest.mark.parametrize("workers", [0, 2])
def test_an_epoch_drawn_from_the_global_rng_is_drawn_again_from_the_saved_one(workers: int) -> None:
    """shuffle=True without a generator: torch's sampler and base seed draw from torch's
    global RNG when the epoch begins. The state between epochs keeps that RNG; a loader
    in a process whose RNG stands elsewhere draws the next epoch from the saved one and
    leaves the user's RNG as it was."""

    def make() -> DataLoader:
        return DataLoader(Seeds(), batch_size=2, shuffle=True, num_workers=workers, collate_fn=identity)

    torch.manual_seed(3)
    elsewhere = {}

    def move_the_global_rng(_: Any) -> None:
        torch.manual_seed(1234)
        elsewhere["rng"] = torch.get_rng_state()

    expected, resumed = next_epoch_after_resume(make, before=move_the_global_rng)
    assert resumed == expected
    if workers:  # the main process drew nothing from the user's RNG (with 0 workers the items draw from it)
        assert torch.equal(torch.get_rng_state(), elsewhere["rng"])


def test_a_user_who_restores_the_global_rng_gets_the_uninterrupted_rng_too() -> None:
    def make() -> DataLoader:
        return DataLoader(Seeds(), batch_size=2, shuffle=True, num_workers=2, collate_fn=identity)

    torch.manual_seed(8)
    loader = make()
    try:
        list(loader)
        state = through_json(loader.state_dict())
        saved_rng = torch.get_rng_state()
        expected = list(loader)
        after = torch.get_rng_state()
    finally:
        loader.shutdown()
    torch.set_rng_state(saved_rng)  # as a training script restores its RNGs from a checkpoint
    again = make()
    again.load_state_dict(state)
    try:
        assert list(again) == expected
    finally:
        again.shutdown()
    assert torch.equal(torch.get_rng_state(), after)


class Epochs(IterableDataset):
    """Counts its epochs itself, as datasets that reshuffle per epoch do, and keeps its
    position (torchdata's contract for a stateful iterable: its state says where it
    stands); each worker yields its share tagged with the epoch."""

    def __init__(self) -> None:
        self.epoch, self.taken = 0, 0

    def __iter__(self) -> Any:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for k in list(range(worker, 8, workers))[self.taken :]:
            self.taken += 1
            yield k, self.epoch
        self.epoch, self.taken = self.epoch + 1, 0  # the epoch ended: the next pass is the next epoch

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "taken": self.taken}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.taken = state["epoch"], state["taken"]


@pytest.mark.parametrize(("workers", "persistent"), [(0, False), (2, True), (2, False)])
def test_a_datasets_state_at_the_end_of_an_epoch_carries_into_the_next(workers: int, persistent: bool) -> None:
    """In the main process, and in persistent workers, the dataset object outlives the
    epoch, so the next epoch starts from its state; workers that start again each epoch
    get a fresh copy, as under torch. A resumed loader reads the same either way."""

    def make() -> DataLoader:
        return DataLoader(Epochs(), num_workers=workers, persistent_workers=persistent, collate_fn=identity)

    expected, resumed = next_epoch_after_resume(make)
    assert resumed == expected
    assert {epoch for batch in expected for _, epoch in batch} == ({0} if workers and not persistent else {1})


@pytest.mark.parametrize("workers", [0, 2])
def test_a_map_datasets_state_at_the_end_of_an_epoch_carries_with_persistent_workers(workers: int) -> None:
    def make() -> DataLoader:
        generator = torch.Generator().manual_seed(21)
        return DataLoader(
            Noisy(),
            batch_size=3,
            shuffle=True,
            generator=generator,
            num_workers=workers,
            persistent_workers=workers > 0,
            collate_fn=identity,
        )

    expected, resumed = next_epoch_after_resume(make, before=lambda _: torch.manual_seed(555))
    assert resumed == expected


def test_an_end_that_is_not_the_end_of_its_epoch_is_refused() -> None:
    loader = DataLoader(Epochs(), persistent_workers=True, num_workers=2, collate_fn=identity)
    it = iter(loader)
    next(it)
    mid = through_json(loader.state_dict())
    loader.shutdown()
    forged = dict(mid, end={"epoch": mid["epoch"], "sampler": mid["sampler"], "base_seed": mid["base_seed"]})
    forged.update(epoch=None, sampler=None)
    again = DataLoader(Epochs(), persistent_workers=True, num_workers=2, collate_fn=identity)
    again.load_state_dict(forged)
    try:
        with pytest.raises(StateError, match="still has batches to read"):
            iter(again)
    finally:
        again.shutdown()


def test_a_state_of_another_version_is_refused() -> None:
    loader = DataLoader(Epochs(), collate_fn=identity)
    state = through_json(loader.state_dict())
    loader.shutdown()
    with pytest.raises(StateError, match=r"version 4, got 'conveyor\.DataLoader' version 1"):
        DataLoader(Epochs(), collate_fn=identity).load_state_dict(dict(state, version=1))


@pytest.mark.parametrize("every", [1, 5])
def test_a_state_after_a_resume_equals_the_uninterrupted_loaders_at_the_same_step(every: int) -> None:
    def make() -> DataLoader:
        return DataLoader(DrawingStream([17, 13]), num_workers=2, collate_fn=identity, snapshot_every_n_steps=every)

    loader = make()
    it = iter(loader)
    for _ in range(7):
        next(it)
    saved = through_json(loader.state_dict())
    next(it), next(it)
    expected = through_json(loader.state_dict())
    loader.shutdown()
    again = make()
    again.load_state_dict(saved)
    moving = iter(again)
    next(moving), next(moving)
    try:
        assert through_json(again.state_dict()) == expected
    finally:
        again.shutdown()
