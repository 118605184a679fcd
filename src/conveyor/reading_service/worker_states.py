"""Workers' states inside a pipeline state: reading them, checking them, re-splitting them.

Under a multiprocessing service the pipeline state ends (below the main-process tail) in
the :class:`~conveyor.workers.parent.merged_output.MergedWorkerOutput`'s part: one state of the worker graph
per worker, plus where the merge is. A per-item pipeline merged in position order hands
items out in single-process order, so its state reduces to "the worker state that came
with the last item handed out, and that item's position": that is what lets a state saved
with one number of workers resume on another (:func:`resplit`). Everything here finds
parts by following the graph (:func:`conveyor.core.state.walk_state`), never by names in the
state.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from conveyor.core.base import IterDataPipe
from conveyor.core.passes import State
from conveyor.core.sharding import ShardingFilter
from conveyor.core.state import walk_state
from conveyor.core.validation import require_position
from conveyor.errors import StateError


def bottom_of_tail(tail: list[IterDataPipe], pipeline: State) -> tuple[Callable[[State], None] | None, State]:
    """``(a function that puts a new part in its place, the part)`` for the part below the
    main-process tail: the reader's state (with workers) or the worker graph's (without).
    The function is None when there is no tail (the pipeline state is that part). Every
    tail op must hold its input's live state and nothing from an earlier point."""
    replace: Callable[[State], None] | None = None
    part = pipeline
    for node in tail:
        inner = node.substates(part)
        if len(inner) != 1 or not node.holds_live_input(part):
            raise StateError(
                f"{node!r} runs in the main process and holds its input's state from an earlier point, so "
                "this state resumes with the number of workers it was saved with"
            )
        _, child, key = inner[0]
        replace = _replacer(part, key)
        part = child
    return replace, part


def _replacer(part: State, key: str) -> Callable[[State], None]:
    """Sets the input state at ``key`` (``"source"``, ``"inputs[0]"``, or a dotted path to
    one of those: ``"window.source"``) of ``part``."""
    while "." in key:
        outer, key = key.split(".", 1)
        part = part[outer]
    if key.endswith("]"):
        name, index = key[:-1].split("[")
        container: Any = part[name]
        position: Any = int(index)
    else:
        container, position = part, key

    def replace(value: State) -> None:
        container[position] = value

    return replace


def skip_handed_out(worker_graph: IterDataPipe, state: State, first_unseen: int) -> State:
    """A copy of a worker-graph state whose sharding points skip every position below
    ``first_unseen``, in states saved from earlier points too.

    Resuming with another number of workers loads one worker's state everywhere; states it
    holds from earlier points (an item being expanded) were taken where *that* worker
    stood, possibly before items that others already handed out. Skipping them at the
    sharding point replays nothing twice.
    """
    copied = copy.deepcopy(state)
    for node, part in walk_state(worker_graph, copied):
        if isinstance(node, ShardingFilter):
            part["skip_below"] = max(part["skip_below"], first_unseen)
    return copied


def resplit(
    tail: list[IterDataPipe],
    worker_graph: IterDataPipe,
    pipeline: State,
    position: list[int] | None,
    saved_workers: int,
    num_workers: int,
) -> State | None:
    """A per-item pipeline's state saved with ``saved_workers`` workers, for
    ``num_workers``; None when nothing had been handed out (start the epoch afresh).
    ``position`` is where the last item handed out stood (saved without workers)."""
    pipeline = copy.deepcopy(pipeline)
    replace, bottom = bottom_of_tail(tail, pipeline)
    if saved_workers == 0:
        global_state, last = bottom, position
    else:
        lane = bottom["merge"]["last_lane"]
        if lane is None:
            return None
        global_state, last = bottom["workers"][lane], bottom["merge"]["bounds"][lane]
        if global_state is None:
            raise StateError("the worker that handed out the last item has no state")
    if last:
        global_state = skip_handed_out(worker_graph, global_state, last[0])
    if num_workers == 0:
        new_bottom = global_state
    else:
        new_bottom = {
            "workers": [global_state] * num_workers,
            "merge": {"last_lane": None, "bounds": [last] * num_workers},
        }
    if replace is None:
        return new_bottom
    replace(new_bottom)
    return pipeline


def check_saved_workers(tail: list[IterDataPipe], pipeline: State, saved_workers: int, where: str) -> None:
    """The shape of the part below the tail, as saved (checked before re-splitting it)."""
    _, bottom = bottom_of_tail(tail, pipeline)
    if saved_workers == 0:
        return
    if type(bottom) is not dict or set(bottom) != {"workers", "merge"}:
        raise StateError(f"{where}: the state has no workers' part, though it was saved with {saved_workers} workers")
    workers, merge = bottom["workers"], bottom["merge"]
    if type(workers) is not list or len(workers) != saved_workers or type(merge) is not dict:
        raise StateError(f"{where}: expected {saved_workers} worker states and a merge state")
    lane = merge.get("last_lane")
    bounds = merge.get("bounds")
    if lane is not None and (type(lane) is not int or not 0 <= lane < saved_workers):
        raise StateError(f"{where}: 'last_lane' out of range")
    if type(bounds) is not list or len(bounds) != saved_workers:
        raise StateError(f"{where}: expected {saved_workers} merge bounds")
    if lane is not None and bounds[lane] is not None:
        require_position(bounds[lane], where)
