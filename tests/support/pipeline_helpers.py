"""Module-level pipeline functions and loader helpers shared by the worker tests
(module-level so that spawned and forkserver workers can import them)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.pipes import IterableWrapper, IterDataPipe


def tag(x: int) -> tuple[int, int]:
    return (x, x * x)


def not_multiple_of_three(pair: tuple[int, int]) -> bool:
    return pair[0] % 3 != 0


def twice(pair: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    return [pair, pair[::-1]]


def jitter(pair: tuple[Any, ...], rng: Any) -> tuple[Any, ...]:
    return (*pair, int(rng.integers(1 << 30)))


def per_item_pipeline(n: int = 60) -> IterDataPipe:
    """A pipeline whose every op after the sharding point treats items one by one (its
    output does not depend on the number or kind of workers)."""
    return (
        IterableWrapper(range(n))
        .shuffle(buffer_size=9)
        .sharding_filter()
        .map(tag)
        .filter(not_multiple_of_three)
        .flatmap(twice)
        .random_map(jitter)
    )


def read_epochs(pipe: IterDataPipe, seed: int = 5, count: int = 2, **service: Any) -> list[list[Any]]:
    """``count`` epochs of a seeded loader over ``pipe`` with those service settings."""
    loader = DataLoader2(pipe, reading_service=MultiProcessingReadingService(**service))
    loader.seed(seed)
    try:
        return [list(loader) for _ in range(count)]
    finally:
        loader.shutdown()


def mid_epoch_state(
    build: Callable[[], IterDataPipe], cut: int, seed: int = 0, **service: Any
) -> tuple[list[Any], dict[str, Any]]:
    """``(the first cut items, the loader's state after them, through JSON)``."""
    loader = DataLoader2(build(), reading_service=MultiProcessingReadingService(**service))
    loader.seed(seed)
    try:
        iterator = iter(loader)
        head = [next(iterator) for _ in range(cut)]
        return head, json.loads(json.dumps(loader.state_dict()))
    finally:
        loader.shutdown()


def resume_after(
    build: Callable[[], IterDataPipe], cut: int, seed: int, saved_with: int, resumed_with: int
) -> tuple[list[Any], list[Any]]:
    """Read ``cut`` items, save (through JSON), resume in a new loader: ``(head + rest of the
    epoch, the next epoch)`` (after the epoch's last item, the resumed loader's first
    ``iter()`` is the next epoch)."""
    head, state = mid_epoch_state(build, cut, seed, num_workers=saved_with)
    ended = state_ends_its_epoch(build, cut, seed, saved_with)
    second = DataLoader2(build(), reading_service=MultiProcessingReadingService(resumed_with))
    second.load_state_dict(state)
    try:
        # A state taken after the epoch's last item resumes straight into the next epoch.
        return (head if ended else head + list(second)), list(second)
    finally:
        second.shutdown()


def state_ends_its_epoch(build: Callable[[], IterDataPipe], cut: int, seed: int, num_workers: int) -> bool:
    """Whether the epoch has nothing after its first ``cut`` items."""
    loader = DataLoader2(build(), reading_service=MultiProcessingReadingService(num_workers))
    loader.seed(seed)
    try:
        iterator = iter(loader)
        for _ in range(cut):
            next(iterator)
        return next(iterator, _END) is _END
    finally:
        loader.shutdown()


_END = object()


def finish_epoch(loader: Any, head: list[Any], whole: list[Any]) -> list[Any]:
    """The epoch a loader resumed after ``head`` (the items handed out before its state was
    taken) finishes: ``head`` and the rest it reads, or ``head`` alone when ``head`` is the
    whole epoch ``whole``: a state taken after an epoch's last item resumes straight into
    the next epoch, so reading on would give that one."""
    if len(head) == len(whole):
        return head
    return head + list(loader)
