"""One pipe read by several branches: the machinery under ``fork``, ``demux``,
``round_robin_demux`` and ``unzip``.

A splitting op is a *hub* (:class:`Hub`) over one input, and ``num_instances`` *branch*
pipes (:class:`Branch`) that each read from it (``branch.main_datapipe`` is the hub, as in
torchdata). The hub's :meth:`Hub.route` says which branches get what of each input item.
In a pass tree, every branch's pass reads one shared :class:`HubPass` (kept in the tree's
:class:`~conveyor.core.passes.PassContext`), which pulls from the input on demand and
queues, per branch, what the others have not read yet. How far the branches may drift
apart is bounded: more than ``buffer_size`` input items held for lagging branches is a
:class:`~conveyor.errors.BranchBufferError` naming the hub (``buffer_size=-1``: no bound).

State. Input items are numbered in the order the hub reads them. The hub's state is
``{"start": s, "cursors": [c_0, ...], "source": <input's state before item s>}``: branch
``i`` has read everything routed to it below item ``c_i``, and nothing any branch still
needs lies below ``s``. Each branch's state holds a copy of the hub's. A resume reopens
the input at ``s`` and reads on; what it routes to branch ``i`` below ``c_i`` is dropped,
so the queues fill again exactly as they were (at most what the buffer held is read
again). Each branch takes its own cursor from its own copy, so copies taken at different
moments (a ``prefetch`` inside one branch reports an earlier state than the others')
still compose: the input is reopened at the smallest ``s`` among them.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, ClassVar

from conveyor.core.base import IterDataPipe
from conveyor.core.passes import Pass, PassContext, Position, State
from conveyor.core.validation import check_int
from conveyor.errors import BranchBufferError, GraphError, ResumeError, StateError

#: What :meth:`HubPass.take` returns when a branch has nothing more to read.
_END = object()


class Hub(IterDataPipe):
    """The shared part of a splitting op: reads ``source`` once for all its branches.

    Subclasses implement :meth:`route`. Constructing a subclass returns its branches (a
    list of :class:`Branch`), as torchdata's ``fork``/``demux`` do; the hub is each
    branch's ``main_datapipe``.

    Args:
        source: The pipe the branches share; it is read once, whatever the number of branches.
        num_instances: How many branches to make (at least 1).
        buffer_size: How many input items the hub may hold for branches that are behind the
            others; past it, :class:`~conveyor.errors.BranchBufferError` naming the hub.
            ``-1``: no bound.
    """

    replays_input = True
    state_fields = {"start": int, "cursors": list, "source": dict}
    _params: ClassVar[tuple[str, ...]] = ("num_instances", "buffer_size")
    #: The functional name, for messages.
    op_name: ClassVar[str] = "hub"

    def __new__(cls, source: IterDataPipe, num_instances: int, *args: Any, **kwargs: Any) -> Any:
        hub = super().__new__(cls)
        cls.__init__(hub, source, num_instances, *args, **kwargs)
        return [Branch(hub, index) for index in range(hub.num_instances)]

    def __init__(self, source: IterDataPipe, num_instances: int, buffer_size: int = 1000) -> None:
        if not isinstance(source, IterDataPipe):
            raise TypeError(f"{self.op_name}() reads an IterDataPipe, got {type(source).__name__}")
        check_int("num_instances", num_instances, 1)
        if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size < -1:
            raise ValueError(f"buffer_size must be an int >= 0, or -1 for no bound; got {buffer_size!r}")
        self.source = source
        self.num_instances = num_instances
        self.buffer_size = buffer_size

    def _reduce(self, protocol: Any) -> Any:
        # Pickled and copied without calling __new__ (which returns the branches): an
        # empty instance, then its attributes.
        return (_empty_hub, (type(self),), self.__getstate__())

    def route(self, item: Any, index: int) -> Iterable[tuple[int, Any]]:
        """``(branch, value)`` for each branch that gets something of input item number
        ``index`` (in the order the hub reads items)."""
        raise NotImplementedError(f"{type(self).__name__} must implement route()")

    def branch_length(self, branch: int) -> int:
        """How many items branch ``branch`` yields (``TypeError`` when not known)."""
        raise self._no_length(f"{self.op_name}() cannot tell how its items split before reading them")

    def _open(self, state: State | None, context: PassContext) -> Pass:
        raise GraphError(f"{self!r} is read through its branches (the pipes {self.op_name}() returned), not directly")

    def _iterates_itself(self) -> bool:
        return False  # an op: its state is the fields above, its pass a HubPass that BranchPass makes

    def __len__(self) -> int:
        raise self._no_length(f"it is read through its {self.num_instances} branches")

    def check_own_state(self, state: Mapping[str, Any], where: str) -> None:
        cursors = state["cursors"]
        if len(cursors) != self.num_instances or not all(type(c) is int and 0 <= c < 1 << 63 for c in cursors):
            raise StateError(f"{where}: 'cursors' must be {self.num_instances} ints >= 0")


def _empty_hub(cls: type[Hub]) -> Hub:
    return object.__new__(cls)


class Branch(IterDataPipe):
    """Branch ``instance_id`` of a splitting op: what its hub routes to it, in order.

    Args:
        main_datapipe: The hub whose items this branch reads.
        instance_id: Which of the hub's branches this is, from 0.
    """

    per_item = True
    keeps_order = True
    state_fields = {"source": dict}
    _params = ("instance_id",)

    def __init__(self, main_datapipe: Hub, instance_id: int) -> None:
        self.main_datapipe = main_datapipe
        self.instance_id = instance_id

    def __repr__(self) -> str:
        return f"Branch({self.main_datapipe.op_name}, instance_id={self.instance_id})"

    def __len__(self) -> int:
        return self.main_datapipe.branch_length(self.instance_id)

    def substates(self, state: Mapping[str, Any]) -> list[tuple[IterDataPipe, Any, str]]:
        return [(self.main_datapipe, state["source"], "source")]


class BranchPass(Pass):
    """One branch's reading of the tree's shared :class:`HubPass`."""

    def __init__(self, pipe: Branch, state: State | None, context: PassContext):
        super().__init__(pipe, context)
        self.branch = pipe.instance_id
        hub = context.shared_pass(pipe.main_datapipe, lambda: HubPass(pipe.main_datapipe, context))
        assert isinstance(hub, HubPass)  # the tree's pass over this hub is always one
        self.hub = hub
        self.hub.attach(self, None if state is None else state["source"])
        self.count = 0
        self._position: Position | None = None
        self.items = self._read()

    def _read(self) -> Iterator[Any]:
        take, branch = self.hub.take, self.branch
        while True:
            got = take(branch)
            if got is _END:
                return
            value, self._position = got
            self.count += 1
            yield value

    def state(self) -> State:
        return {"source": self.hub.state()}

    def position(self) -> Position | None:
        return self._position

    def yielded(self) -> int:
        return self.count

    def inputs(self) -> list[Pass]:
        # Walks (statistics) reach the hub, and what it reads, through one branch only.
        return [self.hub] if self.hub.owner is self else []

    def close(self) -> None:
        close = getattr(self.items, "close", None)
        if close is not None:
            close()
        self.hub.detach(self)


class HubPass(Pass):
    """The hub's side of a pass tree: the input's pass, the branches' queues and cursors.

    One lock guards it, so branches read from several threads (a ``prefetch`` inside one
    branch) safely. Queue entries are ``(item number, value, position)``.
    """

    pipe: Hub

    def __init__(self, pipe: Hub, context: PassContext):
        super().__init__(pipe, context)
        count = pipe.num_instances
        self._lock = threading.Lock()
        self._queues: list[deque[tuple[int, Any, Position | None]]] = [deque() for _ in range(count)]
        self._cursors = [0] * count
        #: Item number -> deliveries of it still queued; its length is what the buffer holds.
        self._held: dict[int, int] = {}
        #: ``(item number, input's state before it)`` for items still queued, in order.
        self._before: deque[tuple[int, State]] = deque()
        self._upstream: Pass | None = None
        self._upstream_state: State | None = None  # where to (re)open the input
        self._next = 0  # the number of the next item the input yields
        self._read_since_open = 0
        self._ended = False
        self._attached: dict[int, BranchPass] = {}
        self._closed: set[int] = set()
        self._position: Position | None = None
        self.owner: BranchPass | None = None
        self.items = iter(())

    # --- branches come and go -------------------------------------------------------------

    def attach(self, branch_pass: BranchPass, saved: State | None) -> None:
        """Register a branch's pass, resuming it from its copy of the hub's state."""
        branch = branch_pass.branch
        with self._lock:
            first = self.owner is None
            if first:
                self.owner = branch_pass
            self._attached[branch] = branch_pass
            self._closed.discard(branch)
            if saved is None:
                if first:
                    self._reopen(None, 0)
                return
            if first:
                self._cursors = list(saved["cursors"])
                self._reopen(saved["source"], saved["start"])
            elif self._read_since_open == 0:
                self._cursors[branch] = saved["cursors"][branch]
                if saved["start"] < self._next:
                    self._reopen(saved["source"], saved["start"])
            elif saved["cursors"][branch] != self._cursors[branch]:
                raise ResumeError(
                    f"{self.pipe!r}: branch {branch} was resumed after its hub began reading, from a state "
                    "that disagrees with the other branches'; resume every branch from one state_dict()"
                )

    def _reopen(self, state: State | None, start: int) -> None:
        if self._upstream is not None:
            self._upstream.close()
        self._upstream = self.context.open(self.pipe.source, state)
        self._next, self._read_since_open, self._ended = start, 0, False

    def detach(self, branch_pass: BranchPass) -> None:
        """A branch's pass closed: nothing more is queued for it. When every attached
        branch has closed, the input closes too (a branch attached later reopens it where
        it stood). Never waits on a branch reading in another thread: that thread finishes
        the job after its read."""
        self._closed.add(branch_pass.branch)
        if self._lock.acquire(blocking=False):
            try:
                self._drop_closed()
            finally:
                self._lock.release()

    def _drop_closed(self) -> None:
        for branch in tuple(self._closed):  # detach() adds without the lock
            queue = self._queues[branch]
            while queue:
                self._release(queue.popleft()[0])
        if self._upstream is not None and self._closed.issuperset(self._attached):
            self._upstream_state = self._upstream.state()
            upstream, self._upstream = self._upstream, None
            upstream.close()

    # --- reading ----------------------------------------------------------------------------

    def take(self, branch: int) -> Any:
        """``(value, position)`` of the next thing routed to ``branch``, or ``_END``."""
        with self._lock:
            queue = self._queues[branch]
            while not queue:
                if not self._read_one():
                    if self._closed:
                        self._drop_closed()
                    return _END
            index, value, position = queue.popleft()
            self._release(index)
            self._cursors[branch] = index + 1
            bound = self.pipe.buffer_size
            if 0 <= bound < len(self._held):
                raise self._overflow(branch, bound)
            if self._closed:
                self._drop_closed()
            return value, position

    def _read_one(self) -> bool:
        """Read the input's next item and queue what it routes; False at the input's end."""
        if self._ended:
            return False
        upstream = self._upstream
        if upstream is None:
            upstream = self._upstream = self.context.open(self.pipe.source, self._upstream_state)
        before = upstream.state()
        try:
            item = next(upstream.items)
        except StopIteration:
            self._ended = True
            return False
        index = self._next
        self._next += 1
        self._read_since_open += 1
        self._position = position = upstream.position()
        queued = 0
        cursors, closed, queues = self._cursors, self._closed, self._queues
        for target, value in self.pipe.route(item, index):
            if index >= cursors[target] and target not in closed:
                queues[target].append((index, value, position))
                queued += 1
        if queued:
            self._held[index] = queued
            self._before.append((index, before))
        return True

    def _release(self, index: int) -> None:
        left = self._held[index] - 1
        if left:
            self._held[index] = left
            return
        del self._held[index]
        before = self._before
        while before and before[0][0] not in self._held:
            before.popleft()

    def _overflow(self, branch: int, bound: int) -> BranchBufferError:
        lagging = max(range(len(self._queues)), key=lambda b: len(self._queues[b]))
        return BranchBufferError(
            f"{self.pipe!r}: branch {branch} has read {len(self._held)} input items past what branch {lagging} "
            f"has taken, over buffer_size={bound}. Read the branches more evenly (zip them, or iterate "
            "them in turn), or raise buffer_size (-1 for no bound)"
        )

    # --- state ------------------------------------------------------------------------------

    def state(self) -> State:
        with self._lock:
            needs = [queue[0][0] for queue in self._queues if queue]
            start = min(needs, default=self._next)
            if start == self._next:
                upstream = self._upstream
                source = upstream.state() if upstream is not None else self._upstream_state
            else:
                source = next(state for index, state in self._before if index == start)
            return {"start": start, "cursors": list(self._cursors), "source": source}

    def position(self) -> Position | None:
        return self._position

    def yielded(self) -> int:
        return self._upstream.yielded() if self._upstream is not None else 0

    def inputs(self) -> list[Pass]:
        return [self._upstream] if self._upstream is not None else []

    def close(self) -> None:
        upstream, self._upstream = self._upstream, None
        if upstream is not None:
            upstream.close()


Branch.pass_type = BranchPass
