"""Roles an op can take besides being a pipe: it draws random numbers (:class:`RandomOp`),
it can be paused (:class:`Pausable`), or it is where items are split between ranks and
workers (:class:`ShardingPoint`, at the levels of :class:`SHARDING_PRIORITIES`). Graph
tools and loaders find ops by these roles."""

from __future__ import annotations

import enum
from typing import Any

from conveyor.core.passes import pause_tree
from conveyor.core.random import PipeRandomness, SeedGenerator, fresh_randomness


class RandomOp:
    """Mixin for ops that draw random numbers. :func:`conveyor.core.graph.apply_random_seed`
    gives each one its :class:`~conveyor.core.random.PipeRandomness` per epoch; a pass takes the
    one set when it opens (a pass opened outside any loader draws a fresh key).
    """

    _randomness: PipeRandomness | None = None

    def set_randomness(self, randomness: PipeRandomness) -> None:
        self._randomness = randomness

    def set_seed(self, seed: int) -> RandomOp:
        """torch's protocol for random datapipes (``graph_settings.apply_random_seed``,
        which torch's ``DataLoader`` calls with the seed its workers share): passes opened
        from now on draw from ``seed``, until the next ``set_seed`` or a loader's seeds."""
        self.set_randomness(SeedGenerator(seed).pipe_randomness(0, keyed_by_position=False))
        return self

    def randomness(self) -> PipeRandomness:
        """The randomness for a pass opened now."""
        return self._randomness if self._randomness is not None else fresh_randomness(keyed_by_position=False)


class Pausable:
    """Mixin for ops whose passes read ahead (``prefetch``) or sit above some that do
    (``fullsync``): torchdata's ``pause()``/``resume()`` on the pipe itself. They act on the
    last pass ``iter()`` opened on the pipe and everything under it; a loader pauses its
    own passes (``DataLoader2.pause()``)."""

    def pause(self) -> None:
        """Stop reading ahead in the background: a thread reads no item past the one it is
        reading; what it read stays buffered, and ``next()`` reads on by itself (nothing
        waits on a paused reader), until :meth:`resume`."""
        pause_tree(self.__dict__.get("_latest_pass"), True)

    def resume(self) -> None:
        """Read ahead again from the next ``next()`` on."""
        pause_tree(self.__dict__.get("_latest_pass"), False)


class SHARDING_PRIORITIES(enum.IntEnum):
    """Sharding levels, the groups a :class:`ShardingPoint` splits at (also
    ``conveyor.core.graph.SHARDING_PRIORITIES``). Levels nest in this order: an item's position
    ``i`` is split by ``DEFAULT``, then ``DISTRIBUTED`` (``i % world_size``), then
    ``MULTIPROCESSING`` (``(i // world_size) % num_workers``), so what a rank receives does
    not depend on its number of workers.
    """

    DEFAULT = 0
    DISTRIBUTED = 1
    MULTIPROCESSING = 2


class ShardingPoint:
    """Marker for the node where items are split between ranks and workers."""

    def apply_sharding(self, num_of_instances: int, instance_id: int, sharding_group: Any = 0) -> None:
        """Keep share ``instance_id`` of ``num_of_instances`` at level ``sharding_group``
        (``SHARDING_PRIORITIES``, conveyor's or torch's; torch's argument names)."""
        raise NotImplementedError(f"{type(self).__name__} must implement apply_sharding")

    def takes(self, sharding_group: Any) -> bool:
        """Whether this point splits items at level ``sharding_group`` (every level, unless
        it serves one only: a dispatch point for the workers)."""
        return True
