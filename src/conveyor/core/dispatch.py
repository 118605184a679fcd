"""``sharding_round_robin_dispatch``: shard a source that can be read only once.

In one process (no workers) it is a sharding point like ``sharding_filter``. With the
multiprocessing reading service, everything upstream of it runs once, in the main
process, which reads it and hands item ``i`` to worker ``i % num_workers``; the workers
run everything downstream.
"""

from __future__ import annotations

from typing import Any, TypeVar

from conveyor.core.base import IterDataPipe
from conveyor.core.sharding import ShardingFilter, sharding_level

T = TypeVar("T")


class ShardingRoundRobinDispatcher(ShardingFilter):
    """Marks where a single reader dispatches items round-robin to the workers.

    ``sharding_group_filter`` is accepted for torchdata compatibility (it names the
    sharding level the dispatch serves); the dispatch always splits among workers.
    """

    #: Items are split here by handing them out, not by filtering (see graph.apply_sharding).
    dispatches = True

    def __init__(self, source: IterDataPipe, sharding_group_filter: Any = None):
        super().__init__(source)
        if sharding_group_filter is not None:
            sharding_level(sharding_group_filter)  # a SHARDING_PRIORITIES member, or a clear error
        self.sharding_group_filter = sharding_group_filter

    def takes(self, sharding_group: Any) -> bool:
        """A dispatch point that names its level (``MULTIPROCESSING``: torchdata's pattern
        of splitting by rank with a ``sharding_filter`` first) takes that level only; the
        others go to the sharding points upstream of it."""
        if self.sharding_group_filter is None:
            return True
        return sharding_level(sharding_group) == sharding_level(self.sharding_group_filter)


@IterDataPipe.register_functional("sharding_round_robin_dispatch", builds=ShardingRoundRobinDispatcher)
def sharding_round_robin_dispatch(self: IterDataPipe[T], sharding_group_filter: Any = None) -> IterDataPipe[T]:
    """Marks where one reader hands the items round-robin to the workers.

    What comes before it runs once, in the main process; what comes after runs in the
    workers, each getting every ``num_workers``-th item.

    Args:
        sharding_group_filter: Accepted for torchdata's code (the sharding level the
            dispatch serves); the dispatch always splits among workers.

    Returns:
        A pipe of the same items, split among workers when a loader runs it.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> list(IterableWrapper(range(3)).sharding_round_robin_dispatch())
        [0, 1, 2]
    """
    return ShardingRoundRobinDispatcher(self, sharding_group_filter)
