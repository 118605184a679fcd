"""Collectives between ranks: a gloo group of ``torch.distributed`` with a deadline on every wait.

Data loading agrees on little (a seed per epoch, item counts per window), so it uses its
own CPU group (gloo): that works beside an NCCL training group, and its waits are bounded,
so a rank that died or stalled becomes a :class:`~conveyor.errors.DistributedError` on the
others instead of a hang. torch is imported here only: the core package does not need it.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

from conveyor.errors import DistributedError, PrefetchTimeoutError
from conveyor.stage_marks import waits_for_upstream
from conveyor.torch_support import require_torch

_HINT = (
    "Another rank died, stalled, or stopped reading the epoch early (every rank must read "
    "the epoch to its end, or all stop after the same item); check the other ranks' logs."
)


def _torch_distributed() -> Any:
    dist = require_torch("distributed reading").distributed
    if not dist.is_available():
        raise DistributedError("this torch build has no torch.distributed support")
    return dist


def require_process_group(who: str) -> Any:
    """``torch.distributed``, once a default process group exists; a clear error otherwise."""
    dist = _torch_distributed()
    if not dist.is_initialized():
        raise DistributedError(
            f"{who} needs an initialised default process group: call "
            "torch.distributed.init_process_group(...) first (under torchrun, "
            "init_process_group('gloo') or ('nccl') reads the rank and world size from the environment)"
        )
    return dist


class RankGroup:
    """A group of all ranks for data-loading collectives, with ``timeout_s`` per wait.

    ``RankGroup.create`` makes a new gloo group (a collective: every rank must call it at
    the same point) which :meth:`destroy` releases; ``RankGroup.default`` borrows the
    default group when it already is a gloo group, and never destroys it.
    """

    def __init__(self, dist: Any, group: Any, timeout_s: float, owned: bool):
        self._dist = dist
        self._group = group  # None: the default group
        self._timeout = datetime.timedelta(seconds=timeout_s)
        self.timeout_s = timeout_s
        self.rank: int = dist.get_rank()
        self.world_size: int = dist.get_world_size()
        self._owned = owned

    @classmethod
    def create(cls, timeout_s: float, who: str) -> RankGroup:
        dist = require_process_group(who)
        try:
            group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
        except RuntimeError as err:
            raise DistributedError(
                f"{who} on rank {dist.get_rank()}: creating its gloo group failed ({err}). {_HINT}"
            ) from err
        created = cls(dist, group, timeout_s, owned=True)
        # new_group may return on one rank while another is still connecting to the group
        # (torch does no barrier after it unless TORCH_DIST_INIT_BARRIER=1). A rank that
        # then destroyed it at once (a later service refusing the graph, as every rank
        # does) closed the connection under the other: "Connection closed by peer" in its
        # connectFullMesh, once in a test run under load. Past a barrier, every rank is done.
        try:
            created.wait(created._call("its group's set-up", dist.barrier), "its group's set-up")
        except DistributedError:
            created.destroy()
            raise
        return created

    @classmethod
    def for_pass(cls, timeout_s: float, who: str) -> RankGroup:
        """The default group if it is gloo (nothing to create), else a new gloo group."""
        dist = require_process_group(who)
        if dist.get_backend() == "gloo":
            return cls(dist, None, timeout_s, owned=False)
        return cls.create(timeout_s, who)

    def min_max(self, value: int, what: str) -> PendingMinMax:
        """Start agreeing on the smallest and largest ``value`` over all ranks."""
        import torch

        both = torch.tensor([-value, value], dtype=torch.int64)
        work = self._call(what, self._dist.all_reduce, both, op=self._dist.ReduceOp.MAX)
        return PendingMinMax(self, work, both, what)

    def broadcast_from_rank0(self, values: list[int], what: str) -> list[int]:
        """Rank 0's ``values`` (signed 64-bit ints), on every rank."""
        import torch

        tensor = torch.tensor(values, dtype=torch.int64)
        work = self._call(what, self._dist.broadcast, tensor, src=0)
        self.wait(work, what)
        return [int(v) for v in tensor.tolist()]

    @waits_for_upstream
    def wait(self, work: Any, what: str) -> None:
        started = time.monotonic()
        try:
            work.wait(self._timeout)
        except RuntimeError as err:
            waited = time.monotonic() - started
            raise self._error(what, err, timed_out=waited >= 0.9 * self.timeout_s) from err

    def destroy(self) -> None:
        """Release the group if this object created it. Idempotent."""
        group, self._group = self._group, None
        if self._owned and group is not None and self._dist.is_initialized():
            self._dist.destroy_process_group(group)

    def _call(self, what: str, collective: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return collective(*args, group=self._group, async_op=True, **kwargs)
        except RuntimeError as err:
            raise self._error(what, err) from err

    def _error(self, what: str, err: BaseException, timed_out: bool = False) -> DistributedError:
        if timed_out:  # it waited the whole timeout: a rank stalled (torchdata's error type)
            return PrefetchTimeoutError(
                f"rank {self.rank} of {self.world_size}: {what} timed out: no answer within "
                f"timeout={self.timeout_s:g} s ({err}). {_HINT}",
                self.timeout_s,
            )
        return DistributedError(
            f"rank {self.rank} of {self.world_size}: {what} failed or timed out "
            f"(timeout={self.timeout_s:g} s): {err}. {_HINT}"
        )


class PendingMinMax:
    """A min/max agreement in flight; :meth:`result` waits for it (within the timeout)."""

    def __init__(self, group: RankGroup, work: Any, tensor: Any, what: str):
        self._group, self._work, self._tensor, self._what = group, work, tensor, what

    def result(self) -> tuple[int, int]:
        self._group.wait(self._work, self._what)
        negated_min, maximum = (int(v) for v in self._tensor.tolist())
        return -negated_min, maximum
