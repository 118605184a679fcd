"""Collectives between ranks: a gloo group of ``torch.distributed`` with a deadline on every wait.

Data loading agrees on little (a seed per epoch, item counts per window), so it uses its
own CPU group (gloo): that works beside an NCCL training group, and its waits are bounded,
so a rank that died or stalled becomes a :class:`~conveyor.errors.DistributedError` on the
others instead of a hang, naming that rank where :mod:`conveyor.distributed.rank_loss` can tell. torch
is imported here and there only: the core package does not need it.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

from conveyor.core.stage_marks import waits_for_upstream
from conveyor.core.torch_support import require_torch
from conveyor.distributed.rank_loss import RankWatch, name_ranks
from conveyor.errors import DistributedError, PrefetchTimeoutError

_HINT = (
    "Another rank died, stalled, or stopped reading the epoch early (every rank must read "
    "the epoch to its end, or all stop after the same item); check the other ranks' logs."
)
_POLL_S = 1.0  # how often a rank that waits looks for another's failure note
_NAMED_HINT = (
    "Check {ranks}'s log: it died (killed, out of memory, an error), stalled, or stopped reading "
    "the epoch early (every rank must read the epoch to its end, or all stop after the same item)."
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
        self.timeout_s = timeout_s
        self.rank: int = dist.get_rank()
        self.world_size: int = dist.get_world_size()
        self._owned = owned
        self._backend: Any = None  # the group's gloo backend, which numbers its collectives
        first = 0
        try:
            import torch

            self._backend = (group if group is not None else dist.group.WORLD)._get_backend(torch.device("cpu"))
            first = int(self._backend._get_sequence_number_for_group())
        except Exception:
            pass
        # Keys of their own for each use of a group (a borrowed one serves many passes):
        # every rank starts one at the same collective, so numbers it alike.
        self._watch = RankWatch(dist, group, self.rank, self.world_size, timeout_s, f"conveyor/{first}")

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
        created._watch.learn()  # every rank published its connections before the barrier
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
    def wait(self, posted: Posted, what: str) -> None:
        """Wait for ``posted`` within the timeout. Past a short first wait, this rank marks
        that it has come to the collective (so a rank that times out can tell who had
        not), then waits in slices, between which it looks for another rank's failure
        note: gloo does not always fail a wait whose peer is gone (a rank whose pending
        receive is from a live rank that already failed waits its whole timeout)."""
        work = posted.work
        started = time.monotonic()
        deadline = started + self.timeout_s
        first = True
        while True:
            # the first slice is short; a slice of 0 would be no timeout at all
            size = self._watch.mark_after_s if first else _POLL_S
            left = max(0.001, min(size, deadline - time.monotonic()))
            try:
                work.wait(datetime.timedelta(seconds=left))
                return
            except RuntimeError as err:
                if work.is_completed() or time.monotonic() >= deadline:  # failed, or out of time
                    timed_out = not work.is_completed()
                    raise self._error(what, err, timed_out=timed_out, sequence=posted.sequence) from err
                elsewhere = self._watch.failure_elsewhere()
                if elsewhere is not None:  # of the kind it failed with (a stall: a timeout)
                    found = (elsewhere.finding, elsewhere.lost)
                    raise self._error(what, err, timed_out=elsewhere.timed_out, found=found) from err
            if first and posted.sequence is not None:
                self._watch.mark_waiting(posted.sequence)
            first = False

    def destroy(self) -> None:
        """Release the group if this object created it. Idempotent."""
        group, self._group = self._group, None
        if self._owned and group is not None and self._dist.is_initialized():
            self._dist.destroy_process_group(group)

    def _call(self, what: str, collective: Any, *args: Any, **kwargs: Any) -> Posted:
        try:
            work = collective(*args, group=self._group, async_op=True, **kwargs)
        except RuntimeError as err:
            raise self._error(what, err) from err
        sequence = None
        if self._backend is not None:
            try:  # torch numbers a group's collectives alike on every rank
                sequence = int(self._backend._get_sequence_number_for_group())
            except Exception:
                self._backend = None
        return Posted(work, sequence)

    def _error(
        self,
        what: str,
        err: BaseException,
        timed_out: bool = False,
        sequence: int | None = None,
        found: tuple[str, tuple[int, ...]] | None = None,
    ) -> DistributedError:
        """The error, naming the rank that is gone or stalled where the evidence tells
        (``found``: what another rank's failure note says)."""
        if found is not None:
            finding, lost = found
        elif timed_out and sequence is None:
            finding, lost = f"no answer within {self.timeout_s:g} s; which rank stopped answering could not be told", ()
        elif timed_out and sequence is not None:
            finding, lost = self._watch.explain_timeout(sequence, self.timeout_s)
        else:
            finding, lost = self._watch.explain_failure(err)
        self._watch.note_failure(finding, lost, timed_out)
        message = f"{finding} (seen by rank {self.rank} of {self.world_size} in {what}, timeout={self.timeout_s:g} s). "
        message += _NAMED_HINT.format(ranks=name_ranks(lost)) if lost else _HINT
        if timed_out:  # it waited the whole timeout: a rank stalled (torchdata's error type)
            return PrefetchTimeoutError(message, self.timeout_s, lost)
        return DistributedError(message, lost)


class Posted:
    """A collective in flight and torch's number for it in its group (None: unknown)."""

    __slots__ = ("sequence", "work")

    def __init__(self, work: Any, sequence: int | None):
        self.work, self.sequence = work, sequence


class PendingMinMax:
    """A min/max agreement in flight; :meth:`result` waits for it (within the timeout)."""

    def __init__(self, group: RankGroup, work: Posted, tensor: Any, what: str):
        self._group, self._work, self._tensor, self._what = group, work, tensor, what

    def result(self) -> tuple[int, int]:
        self._group.wait(self._work, self._what)
        negated_min, maximum = (int(v) for v in self._tensor.tolist())
        return -negated_min, maximum
