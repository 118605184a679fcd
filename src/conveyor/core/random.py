"""Counter-based seeds: every random number conveyor draws is a pure function of a key.

Scheme (documented so a run can be reproduced from ``(seed, epoch, config)``):

* A loader has a 64-bit *base seed*: ``DataLoader2.seed(s)``, or, when nobody called
  ``seed``, one drawn for each epoch from torch's global RNG when torch is imported
  (numpy's otherwise; :func:`draw_seed`), as torch's ``DataLoader`` and torchdata draw
  theirs, so ``torch.manual_seed(n)`` before an epoch makes it repeatable.
* Everything for epoch ``e`` derives from ``numpy.random.SeedSequence(base,
  spawn_key=(e, domain, ...))`` (``e`` is 0 for a drawn base: each epoch draws its own),
  with a domain per purpose:

  - ``SHARED`` (0): the same on every rank and worker; drives random ops before the
    sharding point (e.g. a global shuffle of file names).
  - ``LOCAL`` (1) followed by the generator's *path* (rank, then worker): seeds the global
    RNGs (``random``, numpy, torch) inside workers, for user code that uses them.
  - ``PIPE`` (2) followed by the op's ordinal in the graph: a 128-bit Philox key per random
    op. The op draws from ``Philox(key, counter=(0, a, b, c))``, where ``(a, b, c)`` is the
    item's position at the sharding point (after the sharding point) or the op's own
    counters (before it). No generator state ever needs saving: a position is enough.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.random  # loaded here, before workers fork, rather than once in each worker

from conveyor.core.torch_support import loaded_torch, torch_worker_info

SHARED, LOCAL, PIPE = 0, 1, 2
#: The purpose key of the stream that seeds a worker's global RNGs.
GLOBAL_RNGS = 0
_MASK64 = (1 << 64) - 1


def _fold(values: tuple[int, ...]) -> int:
    """Fold extra counter words into one 64-bit word (splitmix64 steps), deterministically."""
    acc = 0
    for value in values:
        acc = (acc ^ (value & _MASK64)) + 0x9E3779B97F4A7C15 & _MASK64
        acc = (acc ^ (acc >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
        acc = (acc ^ (acc >> 27)) * 0x94D049BB133111EB & _MASK64
        acc ^= acc >> 31
    return acc


class SeedGenerator:
    """Derives every seed of a loader from a base seed, an epoch and a path.

    The path is empty in the main process and grows with :meth:`spawn` (rank, then worker),
    so per-rank and per-worker seeds differ while shared seeds stay identical everywhere.

    Args:
        seed: The base seed (an int); None: one drawn from torch's global RNG when torch is
            imported, numpy's otherwise.
        epoch: The epoch whose seeds to derive.
        path: Where this generator is: ``()`` in the main process, then the rank, then the worker
            (:meth:`spawn` extends it).
        drawn: Whether the base seed was drawn for this epoch alone (no ``seed()`` call): its
            streams are then keyed as epoch 0.
    """

    def __init__(
        self, seed: int | None = None, *, epoch: int = 0, path: tuple[int, ...] = (), drawn: bool = False
    ) -> None:
        self._base = _check_seed(seed) if seed is not None else draw_seed()
        self._epoch = int(epoch)
        # A base drawn for this epoch alone keys its streams as epoch 0, so that the same
        # draw gives the same epoch whatever its number; ``epoch`` still says which it is.
        self._drawn = bool(drawn)
        self._path = tuple(int(p) for p in path)
        self._shared_draws = self._local_draws = 0  # seeds handed out (a new generator or epoch: none)

    @property
    def base_seed(self) -> int:
        return self._base

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def path(self) -> tuple[int, ...]:
        return self._path

    def seed(self, seed: int) -> None:
        """Restart the schedule from ``seed``: epoch 0, same path."""
        self._base = _check_seed(seed)
        self._epoch = 0
        self._drawn = False
        self._shared_draws = self._local_draws = 0

    @property
    def _key_epoch(self) -> int:
        return 0 if self._drawn else self._epoch

    @property
    def drawn(self) -> bool:
        """Whether the base seed was drawn for this epoch (no ``seed()``)."""
        return self._drawn

    def for_epoch(self, epoch: int, *, drawn: bool | None = None) -> SeedGenerator:
        """The same base and path at another epoch (``drawn``: see :attr:`drawn`; kept by default)."""
        return SeedGenerator(self._base, epoch=epoch, path=self._path, drawn=self._drawn if drawn is None else drawn)

    def spawn(self, key: int, *, inplace: bool = False) -> SeedGenerator:
        """A child for rank or worker ``key``: shared seeds unchanged, local seeds new.

        ``inplace=True`` turns this generator into the child (and returns it): how a
        service composed before others (distributed, then workers) hands its rank's
        seeds to the next one.
        """
        if inplace:
            self._path = (*self._path, int(key))
            self._local_draws = 0  # a new local stream
            return self
        return SeedGenerator(self._base, epoch=self._epoch, path=(*self._path, int(key)), drawn=self._drawn)

    def adopt_base_seed(self, seed: int) -> None:
        """Take another base seed, keeping epoch and path: every rank adopts rank 0's, so
        their shared streams agree even when only rank 0 was seeded."""
        self._base = _check_seed(seed)
        self._shared_draws = self._local_draws = 0

    def shared_sequence(self, *purpose: int) -> np.random.SeedSequence:
        return np.random.SeedSequence(self._base, spawn_key=(self._key_epoch, SHARED, *purpose))

    def local_sequence(self, *purpose: int) -> np.random.SeedSequence:
        return np.random.SeedSequence(
            self._base, spawn_key=(self._key_epoch, LOCAL, len(self._path), *self._path, *purpose)
        )

    def generate_shared_seed(self) -> int:
        """The next 64-bit seed of this epoch's shared stream: the n-th call returns the
        same on every rank and worker (each call a new one, as torchdata's)."""
        self._shared_draws += 1
        return int(self.shared_sequence().generate_state(self._shared_draws, np.uint64)[-1])

    def generate_seed(self) -> int:
        """The next 64-bit seed of this rank's/worker's stream for this epoch (the first
        seeds the global RNGs in workers)."""
        self._local_draws += 1
        return int(self.local_sequence().generate_state(self._local_draws, np.uint64)[-1])

    def global_rng_seed(self) -> int:
        """The seed of this rank's/worker's global RNGs (``random``, numpy, torch) this
        epoch: a stream of its own, so the draws of :meth:`generate_seed` stay the user's,
        the same with workers or without."""
        return int(self.local_sequence(GLOBAL_RNGS).generate_state(1, np.uint64)[0])

    def pipe_randomness(self, ordinal: int, keyed_by_position: bool) -> PipeRandomness:
        key = np.random.SeedSequence(self._base, spawn_key=(self._key_epoch, PIPE, ordinal))
        k0, k1 = (int(x) for x in key.generate_state(2, np.uint64))
        return PipeRandomness(k0, k1, keyed_by_position)

    def __repr__(self) -> str:
        drawn = ", drawn=True" if self._drawn else ""
        return f"SeedGenerator(base_seed={self._base}, epoch={self._epoch}, path={self._path}{drawn})"


@dataclass(frozen=True)
class PipeRandomness:
    """The randomness one random op gets for one epoch: a Philox key and its keying mode.

    ``keyed_by_position`` is true for ops after the sharding point: they must call
    :meth:`generator` with the item's position so that the draw does not depend on
    which worker or rank runs the item.

    Args:
        key0: The first 64-bit word of the op's Philox key.
        key1: The second 64-bit word of the op's Philox key.
        keyed_by_position: Whether the op draws per item, keyed by the item's position at the
            sharding point.
    """

    key0: int
    key1: int
    keyed_by_position: bool

    def generator(self, *counter: int) -> np.random.Generator:
        a = counter[0] & _MASK64 if counter else 0
        b = counter[1] & _MASK64 if len(counter) > 1 else 0
        c = _fold(counter[2:]) if len(counter) > 2 else 0
        bits = np.random.Philox(key=[self.key0, self.key1], counter=[0, a, b, c])
        return np.random.Generator(bits)


def fresh_randomness(keyed_by_position: bool = False) -> PipeRandomness:
    """Randomness for an op iterated outside any loader (nobody called ``seed``). In a
    worker of torch's ``DataLoader`` it comes from the base seed all its workers share
    (torch's worker seed less the worker id), so a shuffle before ``sharding_filter()``
    orders the items alike in every worker and each keeps a disjoint share."""
    info = torch_worker_info()
    seed = (info.seed - info.id) & _MASK64 if info is not None else None  # type: ignore[attr-defined]
    return SeedGenerator(seed).pipe_randomness(0, keyed_by_position)


def draw_seed() -> int:
    """A base seed from the caller's global RNG: torch's when torch is imported (as its
    ``DataLoader`` draws its base seed), numpy's legacy global RNG otherwise. Seeding
    that RNG (``torch.manual_seed``, ``numpy.random.seed``) makes the draw repeatable."""
    torch = loaded_torch()
    if torch is not None:
        return int(torch.empty((), dtype=torch.int64).random_().item())
    return int(np.random.randint(0, np.iinfo(np.int64).max, dtype=np.int64))


def global_rng_digest() -> str:
    """A short name for where the global RNG that :func:`draw_seed` draws from stands now
    (torch's when torch is imported, numpy's otherwise). A loader keeps it in a mid-epoch
    state: a resumed epoch whose seed was drawn replays that draw only when the caller did
    not set the RNG back to where it stood at the checkpoint (a trainer that restores RNG
    states, as Accelerate's ``load_state`` does, has the draw behind it already)."""
    torch = loaded_torch()
    if torch is not None:
        raw = torch.get_rng_state().numpy().tobytes()
    else:
        state = np.random.get_state()
        assert isinstance(state, tuple)  # the legacy form, numpy's default
        _, keys, position, *_ = state
        raw = keys.tobytes() + int(position).to_bytes(8, "little")
    return hashlib.sha256(raw).hexdigest()[:32]


def _check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if not 0 <= int(seed) <= _MASK64:
        raise ValueError(f"seed must be in [0, 2**64), got {seed}")
    return int(seed)


def seed_global_rngs(seed: int) -> None:
    """Seed ``random``, numpy's and (when loaded) torch's global RNGs for this worker and epoch.

    Args:
        seed: The seed, a non-negative int (numpy's RNG gets its low 32 bits).
    """
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch = loaded_torch()
    if torch is not None:
        # The CPU generator only: torch.manual_seed also probes every accelerator backend,
        # which costs milliseconds per worker and epoch.
        torch.default_generator.manual_seed(seed)
