"""Seeds without ``seed()``: each epoch draws its base seed from torch's global RNG (numpy's
when torch is not imported), as torch's ``DataLoader`` and torchdata's ``DataLoader2`` do,
so ``torch.manual_seed(n)`` before an epoch repeats it, with every reading service."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch

from conveyor import (
    DataLoader2,
    DistributedReadingService,
    InProcessReadingService,
    MultiProcessingReadingService,
    SequentialReadingService,
)
from conveyor.core.random import SeedGenerator, draw_seed
from conveyor.pipes import IterableWrapper
from distributed_helpers import run_ranks, succeeded


def shuffled(n: int = 40) -> Any:
    """Random before the sharding point (a shuffle) and after it (a shuffle of each share)."""
    return IterableWrapper(range(n)).shuffle().sharding_filter().shuffle(buffer_size=8)


def dispatched(n: int = 40) -> Any:
    """The same randomness around a dispatch point instead of a sharding filter."""
    return IterableWrapper(range(n)).shuffle().sharding_round_robin_dispatch().shuffle(buffer_size=8)


SERVICES: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
    "in-process": (InProcessReadingService, shuffled),
    "1 worker": (lambda: MultiProcessingReadingService(num_workers=1), shuffled),
    "2 workers": (lambda: MultiProcessingReadingService(num_workers=2), shuffled),
    "3 workers, dispatching": (lambda: MultiProcessingReadingService(num_workers=3), dispatched),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("service", list(SERVICES))
def test_torch_manual_seed_before_an_epoch_repeats_it(service: str) -> None:
    make_service, make_graph = SERVICES[service]
    loader = DataLoader2(make_graph(), reading_service=make_service())
    try:
        torch.manual_seed(123)
        first = list(loader)
        torch.manual_seed(123)
        second = list(loader)
        torch.manual_seed(124)
        other = list(loader)
        third = list(loader)  # no manual_seed: the RNG moved on
    finally:
        loader.shutdown()
    assert sorted(first) == list(range(40))
    assert first == second
    assert other != first and third != other


def with_noise(item: int, rng: Any) -> tuple[int, int]:
    return item, int(rng.integers(1 << 30))


@pytest.mark.timeout(120)
def test_two_loaders_agree_after_the_same_manual_seed() -> None:
    results = []
    for workers in (0, 2):
        service = MultiProcessingReadingService(num_workers=workers) if workers else InProcessReadingService()
        graph = IterableWrapper(range(40)).shuffle().sharding_filter().random_map(with_noise)
        loader = DataLoader2(graph, reading_service=service)
        torch.manual_seed(7)
        results.append(list(loader))
        loader.shutdown()
    # Per-item randomness is keyed by position, so the order does not depend on the workers.
    assert results[0] == results[1]


def test_seed_keeps_one_seed_for_every_epoch_whatever_torch_draws() -> None:
    def two_epochs() -> list[list[int]]:
        loader = DataLoader2(shuffled())
        loader.seed(5)
        torch.manual_seed(int(torch.randint(0, 1000, ()).item()) + 1)  # torch's RNG moves; seed() holds
        epochs = [list(loader) for _ in range(2)]
        loader.shutdown()
        return epochs

    a, b = two_epochs(), two_epochs()
    assert a == b and a[0] != a[1]


def test_an_unseeded_epoch_resumes_exactly_and_the_next_one_draws_again() -> None:
    torch.manual_seed(11)
    loader = DataLoader2(shuffled())
    iterator = iter(loader)
    head = [next(iterator) for _ in range(13)]
    state = json.loads(json.dumps(loader.state_dict()))
    rest = list(iterator)
    loader.shutdown()
    assert state["seeded"] is False

    torch.manual_seed(999)  # the resumed epoch does not draw: its seed is in the state
    resumed = DataLoader2(shuffled())
    resumed.load_state_dict(state)
    assert head + list(resumed) == head + rest
    torch.manual_seed(11)
    again = list(resumed)  # a fresh epoch draws from torch again
    resumed.shutdown()
    assert again == head + rest


def test_a_version_2_state_reads_as_one_seed_for_every_epoch() -> None:
    loader = DataLoader2(shuffled())
    loader.seed(3)
    expected = [list(loader) for _ in range(2)]
    state = loader.state_dict()
    loader.shutdown()
    state["version"] = 2
    del state["seeded"]
    del state["skipped"], state["rng_at_save"]  # version 2 predates them
    state["epoch"] = 0
    restored = DataLoader2(shuffled())
    restored.load_state_dict(state)
    torch.manual_seed(0)
    assert [list(restored) for _ in range(2)] == expected
    restored.shutdown()


def test_the_seed_generator_draws_from_torch_and_reports_the_epoch() -> None:
    torch.manual_seed(1)
    a = draw_seed()
    torch.manual_seed(1)
    assert draw_seed() == a and 0 <= a < 1 << 64
    torch.manual_seed(1)
    assert SeedGenerator().base_seed == a
    drawn = SeedGenerator(a, epoch=4, drawn=True)
    assert drawn.epoch == 4 and drawn.drawn
    # A drawn seed keys its streams as epoch 0: the same draw gives the same epoch.
    assert drawn.generate_shared_seed() == SeedGenerator(a, epoch=0, drawn=True).generate_shared_seed()
    assert drawn.spawn(1).drawn and drawn.for_epoch(5).drawn and not drawn.for_epoch(5, drawn=False).drawn
    assert SeedGenerator(a, epoch=4).generate_shared_seed() != drawn.generate_shared_seed()


def test_without_torch_the_draw_comes_from_numpys_global_rng() -> None:
    code = (
        "import sys, numpy as np\n"
        "from conveyor import DataLoader2\n"
        "from conveyor.pipes import IterableWrapper\n"
        "loader = DataLoader2(IterableWrapper(range(30)).shuffle())\n"
        "np.random.seed(5); a = list(loader)\n"
        "np.random.seed(5); b = list(loader)\n"
        "np.random.seed(6); c = list(loader)\n"
        "assert 'torch' not in sys.modules\n"
        "print(a == b, a != c, sorted(a) == list(range(30)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "True"]


def _two_epochs_after_manual_seed(rank: int, world_size: int, workers: int) -> list[list[int]]:
    services: list[Any] = [DistributedReadingService()]
    if workers:
        services.append(MultiProcessingReadingService(num_workers=workers))
    service = services[0] if len(services) == 1 else SequentialReadingService(*services)
    loader = DataLoader2(shuffled(48), reading_service=service)
    try:
        epochs = []
        for _ in range(2):
            torch.manual_seed(123 + rank)  # ranks seeded differently: rank 0's draw is shared
            epochs.append(list(loader))
        return epochs
    finally:
        loader.shutdown()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("workers", [0, 2])
def test_ranks_repeat_their_epochs_after_manual_seed(workers: int) -> None:
    results = succeeded(run_ranks(2, _two_epochs_after_manual_seed, workers))
    for epochs in results:
        assert epochs[0] == epochs[1]
    # The shuffle before the sharding point agreed across ranks: their shares partition the items.
    assert sorted(results[0][0] + results[1][0]) == list(range(48))


def _through_resume(make: Any, cut: int, restore_rng: bool) -> tuple[list[Any], list[Any]]:
    """(uninterrupted: the rest of epoch 0 and epoch 1; resumed from a state after ``cut``
    items: the same), the resumed process seeding torch's global RNG the same way at its
    start (as seed_everything does) or, with ``restore_rng``, setting it back to where it
    stood at the checkpoint (as Accelerate's load_state does)."""
    torch.manual_seed(0)
    loader = make()
    it = iter(loader)
    for _ in range(cut):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    at_checkpoint = torch.get_rng_state()
    expected = [list(it), list(loader)]
    loader.shutdown()
    torch.manual_seed(0)
    if restore_rng:
        torch.set_rng_state(at_checkpoint)
    resumed = make()
    resumed.load_state_dict(state)
    got = [list(resumed), list(resumed)]
    resumed.shutdown()
    return expected, got


@pytest.mark.parametrize("restore_rng", [False, True], ids=["reseeded", "rng-restored"])
@pytest.mark.parametrize("kind", ["DataLoader2", "DataLoader"])
def test_the_epoch_after_a_resume_draws_as_the_uninterrupted_one(kind: str, restore_rng: bool) -> None:
    """Without seed() or a generator, epochs draw from torch's global RNG. A resumed epoch
    must leave that RNG where the interrupted run left it, whether the resumed process
    seeded it the same way (the resumed epoch replays its start's draws) or set it back to
    the checkpoint's (the draws are behind it already): either way the next epoch is the
    uninterrupted run's."""
    from conveyor import DataLoader

    def make() -> Any:
        if kind == "DataLoader2":
            return DataLoader2(shuffled())
        return DataLoader(list(range(24)), batch_size=4, shuffle=True, collate_fn=lambda batch: batch)

    expected, got = _through_resume(make, 3, restore_rng)
    assert got == expected
