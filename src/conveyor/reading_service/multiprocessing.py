"""``MultiProcessingReadingService``: the graph replicated into worker processes.

The graph up to its end runs in every worker, each keeping its ``MULTIPROCESSING`` shard;
ops that must not be replicated (``replicable = False``, e.g. pin memory, fullsync), and
everything after them, stay in the main process and read the merged worker output.

Determinism: with ``in_order=True`` the merge follows the sharding point's order, so a
pipeline whose stages after ``sharding_filter`` are per-item (``map``, ``filter``,
``flatmap``, ``random_map``, ...) yields the same items in the same order for every
``num_workers``, 0 included. Stages that group items (``batch``, ``shuffle``, ``header``)
group what one worker sees, as in torch, so their output depends on ``num_workers``.
User code that draws from the global RNGs (``random``, numpy, torch) gets per-worker,
per-epoch seeds: deterministic for a given ``num_workers``, not across them.

Checkpoints: every item carries its worker's state; a checkpoint holds, per worker, the
state after the last item handed to the user, plus where the merge is. It resumes
exactly with the same ``num_workers``, and with any other for per-item pipelines.
"""

from __future__ import annotations

import copy
import multiprocessing
from collections.abc import Callable
from typing import Any

from conveyor.errors import GraphError, StateError
from conveyor.graph import apply_random_seed, list_dps, replace_dp
from conveyor.pipes.base import DataPipe, IterDataPipe, ShardingPoint, check_int
from conveyor.pipes.dispatch import RoundRobinDispatcher
from conveyor.pipes.prefetch import Prefetcher
from conveyor.pipes.sharding import skip_handed_out
from conveyor.random import SeedGenerator
from conveyor.reading_service.interface import CheckpointableReadingServiceInterface, IterResetFn
from conveyor.state import (
    capture_graph_state,
    load_graph_state,
    require_keys,
    reset_graph,
    validate_graph_state,
)
from conveyor.stats import StageTotals
from conveyor.validation import require_position
from conveyor.worker_info import IN_MAIN, WorkerInfo, enter_main_worker, leave_main_worker
from conveyor.workers.dispatch import DispatchedSource, Dispatcher
from conveyor.workers.merge import check_merge_state
from conveyor.workers.pool import WorkerPool
from conveyor.workers.reader import WorkerReader
from conveyor.workers.state_machine import expand_compact_state, holds_state

InitFn = Callable[[DataPipe, WorkerInfo], DataPipe]
ResetFn = Callable[[DataPipe, WorkerInfo, SeedGenerator], DataPipe]


class MultiProcessingReadingService(CheckpointableReadingServiceInterface):
    """Runs the graph in ``num_workers`` processes (0: in the calling process, same semantics).

    Args:
        num_workers: worker processes; 0 reads in the main process. They start with the
            first epoch, one at a time while the first delivers (a fork costs the main
            process milliseconds), and live until ``shutdown()``.
        multiprocessing_context: ``"fork"``, ``"spawn"`` or ``"forkserver"``; None is
            Python's default. Lambdas and ``__main__`` functions travel by value under all.
        worker_prefetch_cnt: messages a worker may have in flight. Small items travel
            up to 64 per message, items with large buffers up to 2 MiB of them. 0 (the
            reference's "no prefetch") allows one message in flight, the protocol's least.
        main_prefetch_cnt: items the main process may receive and merge ahead of the
            user, in a thread, while the user spends time elsewhere (a training step) and
            the workers are ahead; while the user would wait for the workers anyway, the
            caller's thread receives (a thread would only add hand-offs). 0: always the
            caller's thread.
        worker_init_fn: ``fn(datapipe, worker_info) -> datapipe``, once per worker.
        worker_reset_fn: ``fn(datapipe, worker_info, seed_generator) -> datapipe``, once per
            worker at the start of each epoch; must return the graph it was given. A
            worker that an epoch ended before it was started runs it for that epoch
            when the next one begins.
            With ``num_workers=0`` both hooks run in this process with
            ``WorkerInfo(num_workers=1, worker_id=0)``, which ``get_worker_info()`` also
            returns here from the start of each epoch to its end (or ``shutdown()``).
        in_order: deterministic merge (True) or first come, first served (False).
        timeout: seconds to wait for any one worker message (None or 0, torch's
            spelling: no limit; a worker that dies is noticed at once either way).
        shared_memory_budget: bytes of shared memory that all workers' page rings may take
            together (a ring's pages are reserved before first use: its first 4 MiB when
            its worker starts, more as the worker needs them). Large buffers (numpy arrays,
            torch tensors, ``bytes`` of 64 KiB and more) travel through the rings with
            one copy; one that misses its ring travels in a shared file of its own (also
            one copy, but slower for many small buffers). None: 64 MiB per worker, capped
            at 1/8 of the memory limit that backs it (the process's cgroup limit and the
            system's available memory; not ``/dev/shm``'s size, which does not bound
            these rings). 0: no rings. When rings cannot be reserved the loader warns
            once (``SharedMemoryWarning``) and goes on with the slower paths.
    """

    def __init__(
        self,
        num_workers: int = 0,
        multiprocessing_context: str | None = None,
        worker_prefetch_cnt: int = 10,
        main_prefetch_cnt: int = 10,
        worker_init_fn: InitFn | None = None,
        worker_reset_fn: ResetFn | None = None,
        in_order: bool = True,
        timeout: float | None = None,
        shared_memory_budget: int | None = None,
    ):
        check_int("num_workers", num_workers, 0)
        check_int("shared_memory_budget", shared_memory_budget, 0, allow_none=True)
        check_int("worker_prefetch_cnt", worker_prefetch_cnt, 0)
        check_int("main_prefetch_cnt", main_prefetch_cnt, 0)
        if (
            multiprocessing_context is not None
            and multiprocessing_context not in multiprocessing.get_all_start_methods()
        ):
            raise ValueError(
                f"multiprocessing_context must be one of {multiprocessing.get_all_start_methods()}, "
                f"got {multiprocessing_context!r}"
            )
        if timeout is not None and not timeout >= 0:
            raise ValueError(f"timeout must be a number of seconds >= 0 (0: no limit) or None, got {timeout!r}")
        self.num_workers = num_workers
        self.multiprocessing_context = multiprocessing_context
        self.worker_prefetch_cnt = worker_prefetch_cnt
        self.main_prefetch_cnt = main_prefetch_cnt
        self.worker_init_fn = worker_init_fn
        self.worker_reset_fn = worker_reset_fn
        self.in_order = in_order
        self.timeout = timeout or None
        self.shared_memory_budget = shared_memory_budget
        self._end: DataPipe | None = None  # what the loader iterates
        self._worker_graph: IterDataPipe | None = None  # the replicated part (a copy stays here)
        self._reader: WorkerReader | None = None
        self._pool: WorkerPool | None = None
        self._dispatcher: Dispatcher | None = None
        self._resume: dict[str, Any] | None = None  # a restored state for the next epoch
        self._collect_stats = False
        self._tail_nodes = 0  # main-process ops after the workers' part
        self._main_epoch = False  # num_workers=0: an epoch runs here as worker 0 of 1

    # --- lifecycle -----------------------------------------------------------------------

    def initialize(self, datapipe: DataPipe) -> DataPipe:
        if not isinstance(datapipe, IterDataPipe):
            raise TypeError(f"expected an IterDataPipe, got {type(datapipe).__name__}")
        worker_graph, tail = split_replicable(datapipe)
        self._tail_nodes = len(tail)
        if self.num_workers > 0:
            _check_sharding_point_in_workers(tail)
        if self.num_workers == 0:
            graph = worker_graph
            if self.worker_init_fn is not None:
                enter_main_worker()
                try:
                    graph = self.worker_init_fn(worker_graph, IN_MAIN)
                finally:
                    leave_main_worker()
            self._worker_graph = graph
            self._end = _reattach(tail, graph, worker_graph) if tail else graph
            return self._end
        replicated, upstream = split_dispatch(worker_graph)
        self._worker_graph = replicated
        self._pool = WorkerPool(
            replicated,
            self.num_workers,
            self.multiprocessing_context,
            self.worker_init_fn,
            self.worker_reset_fn,
            self.timeout,
            start_all_at_once=upstream is not None,  # the dispatcher feeds every worker from the start
            shared_memory_budget=self.shared_memory_budget,
        )
        dispatcher, dispatch_state = None, None
        positional = keeps_position_order(replicated)
        if upstream is not None:
            dispatcher = Dispatcher(upstream, self._pool, window=DISPATCH_WINDOW)
            dispatch_state = dispatched_state_reader(replicated)
            # The merge may skip ahead of a worker only when outputs come item by item.
            positional = positional and is_per_item(replicated)
        self._dispatcher = dispatcher
        self._reader = WorkerReader(
            self._pool,
            self.in_order,
            positional,
            max(1, self.worker_prefetch_cnt),
            self.main_prefetch_cnt,
            dispatcher,
            dispatch_state,
        )
        self._reader.collect_stats = self._collect_stats
        self._end = _reattach(tail, self._reader, worker_graph) if tail else self._reader
        return self._end

    def initialize_iteration(
        self, seed_generator: SeedGenerator, iter_reset_fn: IterResetFn | None = None
    ) -> IterResetFn | None:
        end = self._require_end()
        resume, self._resume = self._resume, None
        apply_random_seed(end, seed_generator)  # main-process stages (and, with 0 workers, all)
        if self.num_workers == 0:
            graph = self._worker_graph
            assert graph is not None
            self._begin_main_epoch()
            if self.worker_reset_fn is not None:
                returned = self.worker_reset_fn(graph, IN_MAIN, seed_generator.spawn(0))
                if returned is not graph:
                    raise ValueError("worker_reset_fn must return the graph it was given (changed in place)")
            if resume is not None and "fresh" in resume["main"]:
                reset_graph(end)  # saved before any item of the epoch was handed out
            elif resume is not None:
                load_graph_state(end, resume["main"], "MultiProcessingReadingService state")
            return iter_reset_fn
        assert self._reader is not None
        if resume is not None:
            load_graph_state(end, resume["main"], "MultiProcessingReadingService state")
            reader_state = self._reader._take_restored() or self._reader.state_dict()
            self._reader.start_epoch(seed_generator, reader_state["workers"], reader_state["merge"])
        else:
            self._reader.start_epoch(seed_generator, [None] * self.num_workers, None)
        return iter_reset_fn

    def finalize_iteration(self) -> None:
        self._end_main_epoch()

    def _begin_main_epoch(self) -> None:
        """With num_workers=0 this process is worker 0 of 1 while an epoch runs."""
        if not self._main_epoch:
            self._main_epoch = True
            enter_main_worker()

    def _end_main_epoch(self) -> None:
        if self._main_epoch:
            self._main_epoch = False
            leave_main_worker()

    def finalize(self) -> None:
        self._end_main_epoch()
        if self._dispatcher is not None:
            self._dispatcher.close()
        if self._pool is not None:
            self._pool.close()
        self._pool = self._reader = self._end = self._worker_graph = self._dispatcher = None

    def set_stats_collection(self, enabled: bool) -> None:
        self._collect_stats = enabled

    def worker_stage_totals(self) -> list[StageTotals] | None:
        return self._reader.stage_totals() if self._reader is not None else None

    # --- checkpoints ---------------------------------------------------------------------

    def checkpoint(self) -> dict[str, Any]:
        end = self._require_end()
        assert self._worker_graph is not None
        main = capture_graph_state(end)
        state: dict[str, Any] = {
            "num_workers": self.num_workers,
            # Only an in-order, positional merge hands items out in single-process order,
            # which is what lets another worker count pick up from the last item; and only
            # when no main-process op holds a snapshot of the workers' side (prefetch,
            # fullsync), whose layout depends on the worker count.
            "per_item": is_per_item(self._worker_graph)
            and self._dispatcher is None
            and (self.num_workers == 0 or (self.in_order and keeps_position_order(self._worker_graph)))
            and not any(_holds_graph_state(entry["state"]) for entry in main["nodes"][: self._tail_nodes]),
            "main": main,
            "position": None,
        }
        if self.num_workers == 0:
            position = self._worker_graph.item_position()
            state["position"] = list(position) if position is not None else None
        return state

    def validate_checkpoint(self, datapipe: DataPipe, state: Any) -> None:
        self._converted(datapipe, state)

    def restore(self, datapipe: DataPipe, state: Any) -> DataPipe:
        converted = self._converted(datapipe, state)
        end = self.initialize(datapipe)
        self._resume = {"main": converted}
        return end

    def _converted(self, datapipe: DataPipe, state: Any) -> dict[str, Any]:
        """The ``main`` graph state for this service's ``num_workers``, validated."""
        where = "MultiProcessingReadingService state"
        require_keys(
            state,
            {"num_workers": int, "per_item": bool, "main": dict, "position": (list, type(None))},
            where,
        )
        if state["position"] is not None:
            require_position(state["position"], where)
        if not isinstance(datapipe, IterDataPipe):
            raise TypeError(f"expected an IterDataPipe, got {type(datapipe).__name__}")
        worker_graph, tail = split_replicable(datapipe)
        upstream = None
        if self.num_workers > 0:
            worker_graph, upstream = split_dispatch(worker_graph)
        saved = state["num_workers"]
        if saved < 0:
            raise StateError(f"{where}: num_workers must be >= 0")
        tail_nodes = len(tail)
        nodes = state["main"].get("nodes") if isinstance(state["main"], dict) else None
        if not isinstance(nodes, list) or len(nodes) < tail_nodes:
            raise StateError(f"{where}: 'main' is not a graph state of this pipeline")
        if saved == self.num_workers and saved > 0:
            reader = self._check_reader_state(worker_graph, nodes, tail_nodes, saved, where)
            if upstream is not None:
                _check_dispatched_states(worker_graph, upstream, reader["workers"], where)
            return state["main"]
        if saved == 0 and self.num_workers == 0:
            if self.worker_init_fn is None:
                validate_graph_state(datapipe, state["main"], where)
            return state["main"]
        # Another number of workers: only per-item pipelines map one onto the other.
        if not (state["per_item"] and is_per_item(worker_graph)) or upstream is not None:
            raise StateError(
                f"{where}: saved with num_workers={saved}, now {self.num_workers}; only a per-item "
                "pipeline merged in order resumes on another worker count (this one groups items per "
                "worker after sharding_filter (batch, shuffle, header, ...), dispatches, or was read "
                f"with in_order=False), so resume it with num_workers={saved}"
            )
        global_state, position = self._global_worker_state(worker_graph, state, nodes, tail_nodes, where)
        if global_state is not None and position:
            global_state = skip_handed_out(global_state, position[0])
        tail_state = {"nodes": nodes[:tail_nodes]}
        if self.num_workers == 0:
            if global_state is None:
                return {"fresh": True}
            return {"nodes": [*tail_state["nodes"], *global_state["nodes"]]}
        compact = compact_state(worker_graph, global_state) if global_state is not None else None
        reader_state = {
            "workers": [compact] * self.num_workers,
            "merge": {"last_lane": None, "bounds": [position] * self.num_workers},
        }
        return {"nodes": [*tail_state["nodes"], {"pipe": "WorkerReader", "state": reader_state}]}

    def _global_worker_state(
        self, worker_graph: IterDataPipe, state: dict[str, Any], nodes: list[Any], tail_nodes: int, where: str
    ) -> tuple[dict[str, Any] | None, list[int] | None]:
        """The worker-part state after the last item handed out, and that item's position."""
        saved = state["num_workers"]
        if saved == 0:
            global_state = {"nodes": nodes[tail_nodes:]}
            validate_graph_state(worker_graph, global_state, where)
            return global_state, state["position"]
        reader = self._check_reader_state(worker_graph, nodes, tail_nodes, saved, where)
        lane = reader["merge"]["last_lane"]
        if lane is None:
            return None, None
        compact = reader["workers"][lane]
        if compact is None:
            raise StateError(f"{where}: the last lane has no state")
        return expand_compact_state(worker_graph, compact), reader["merge"]["bounds"][lane]

    def _check_reader_state(
        self, worker_graph: IterDataPipe, nodes: list[Any], tail_nodes: int, count: int, where: str
    ) -> dict[str, Any]:
        if len(nodes) != tail_nodes + 1:
            raise StateError(f"{where}: 'main' is not a graph state of this pipeline")
        entry = nodes[tail_nodes]
        require_keys(entry, {"pipe": str, "state": dict}, where)
        reader = entry["state"]
        require_keys(reader, {"workers": list, "merge": dict}, f"{where} (reader)")
        if len(reader["workers"]) != count:
            raise StateError(f"{where}: expected {count} worker states")
        check_merge_state(reader["merge"], count, f"{where} (merge)")
        if self.worker_init_fn is None:
            stateful = sum(1 for node in list_dps(worker_graph) if holds_state(node))
            for worker_id, compact in enumerate(reader["workers"]):
                if compact is None:
                    continue
                if not isinstance(compact, list) or len(compact) != stateful:
                    raise StateError(f"{where}: worker {worker_id} state does not fit this pipeline")
                validate_graph_state(
                    worker_graph, expand_compact_state(worker_graph, compact), f"{where}, worker {worker_id}"
                )
        return reader

    def _require_end(self) -> DataPipe:
        if self._end is None:
            raise RuntimeError("MultiProcessingReadingService is not initialized; iterate the loader first")
        return self._end


PrototypeMultiProcessingReadingService = MultiProcessingReadingService

#: Dispatch mode: fed items a worker may hold beyond what it has taken.
DISPATCH_WINDOW = 128


def split_dispatch(worker_graph: IterDataPipe) -> tuple[IterDataPipe, IterDataPipe | None]:
    """``(graph the workers run, graph the main process reads and dispatches)``.

    Without a ``sharding_round_robin_dispatch`` point the workers run everything. With
    one, the workers get a copy of the graph in which that point reads from the main
    process's dispatch, and the main process keeps what was upstream of it.
    """
    points = [node for node in list_dps(worker_graph) if isinstance(node, RoundRobinDispatcher)]
    if not points:
        return worker_graph, None
    if len(points) > 1:
        raise GraphError("a graph can have one sharding_round_robin_dispatch() point")
    upstream = points[0].source
    threaded = [node for node in list_dps(worker_graph, exclude=upstream) if isinstance(node, Prefetcher)]
    if threaded:
        raise GraphError(
            f"{threaded[0]!r} after sharding_round_robin_dispatch(): its thread would read the dispatched "
            "items ahead of the worker; drop it (the service already prefetches per worker)"
        )
    replicated = copy.deepcopy(worker_graph)
    point = next(node for node in list_dps(replicated) if isinstance(node, RoundRobinDispatcher))
    replicated = replace_dp(replicated, point, DispatchedSource())
    return replicated, upstream


def dispatched_state_reader(replicated: IterDataPipe) -> Callable[[Any], tuple[int, Any]]:
    """From a worker's compact state: ``(position of the last fed item it has fully taken
    in, upstream state after it)``. Snapshots inside the state count too: an op that
    replays (``flatmap`` mid-item) needs its fed items again from an earlier point."""
    stateful = [node for node in list_dps(replicated) if holds_state(node)]
    index = next(i for i, node in enumerate(stateful) if isinstance(node, DispatchedSource))

    def read(compact: Any) -> tuple[int, Any]:
        found = [compact[index]]
        _collect_dispatched(compact, found)
        earliest = min(found, key=lambda state: state["position"])
        return earliest["position"], earliest["upstream"]

    return read


def _collect_dispatched(value: Any, found: list[Any]) -> None:
    if isinstance(value, dict):
        if value.get("pipe") == DispatchedSource.__name__ and isinstance(value.get("state"), dict):
            found.append(value["state"])
            return
        for inner in value.values():
            _collect_dispatched(inner, found)
    elif isinstance(value, list):
        for inner in value:
            _collect_dispatched(inner, found)


def _check_dispatched_states(replicated: IterDataPipe, upstream: IterDataPipe, states: list[Any], where: str) -> None:
    read = dispatched_state_reader(replicated)
    for worker_id, compact in enumerate(states):
        if compact is None:
            continue
        position, snapshot = read(compact)
        if position < -1:
            raise StateError(f"{where}: worker {worker_id} has a negative dispatch position")
        if snapshot is not None:
            validate_graph_state(upstream, snapshot, f"{where}, dispatcher upstream of worker {worker_id}")


def split_replicable(datapipe: IterDataPipe) -> tuple[IterDataPipe, list[IterDataPipe]]:
    """``(graph for the workers, main-process tail from the end down)``.

    Everything downstream of a non-replicable op stays in the main process; that tail
    must be a single chain ending at the graph's end.
    """
    nodes = list_dps(datapipe)
    pinned = [node for node in nodes if isinstance(node, IterDataPipe) and not node.replicable]
    if not pinned:
        return datapipe, []
    tail: list[IterDataPipe] = []
    node: Any = datapipe
    while any(p is node or _is_upstream(p, node) for p in pinned):
        inputs = node.inputs()
        if len(inputs) != 1:
            raise GraphError(
                f"{node!r} must run in the main process (it is, or reads from, a non-replicable op) "
                "but has several inputs; put non-replicable ops after the merge of all branches"
            )
        tail.append(node)
        node = inputs[0]
    return node, tail


def _check_sharding_point_in_workers(tail: list[IterDataPipe]) -> None:
    """A sharding point after a non-replicable op would stay in the main process with it,
    and every worker would read (and the loader yield) every item once per worker."""
    for index, node in enumerate(tail):
        if isinstance(node, ShardingPoint):
            pinned = next(n for n in reversed(tail[index:]) if not n.replicable)
            raise GraphError(
                f"{pinned!r} cannot be replicated into workers, so it and everything after it runs in "
                f"the main process, including the sharding point {node!r}: every worker would read every "
                "item. Move it after sharding_filter() (best at the end of the pipeline), or read the "
                "source once with sharding_round_robin_dispatch()"
            )


def _is_upstream(candidate: DataPipe, of: DataPipe) -> bool:
    return any(n is candidate for n in list_dps(of) if n is not of)


def _reattach(tail: list[IterDataPipe], new_input: IterDataPipe, old_input: IterDataPipe) -> IterDataPipe:
    """Point the tail's lowest op at ``new_input`` instead of ``old_input``."""
    if new_input is not old_input:
        replace_dp(tail[-1], old_input, new_input)
    return tail[0]


def is_per_item(worker_graph: IterDataPipe) -> bool:
    """Whether every op after the sharding point treats items one by one."""
    return _all_after_sharding_point(worker_graph, "per_item")


def keeps_position_order(worker_graph: IterDataPipe) -> bool:
    """Whether the workers' outputs come in increasing sharding-point positions (then the
    merge can restore the single-process order); otherwise it is a round robin."""
    return _all_after_sharding_point(worker_graph, "keeps_order")


def _all_after_sharding_point(worker_graph: IterDataPipe, flag: str) -> bool:
    """Whether the graph has one sharding point and every op after it sets ``flag``."""
    points = [node for node in list_dps(worker_graph) if isinstance(node, ShardingPoint)]
    if len(points) != 1:
        return False
    after = list_dps(worker_graph, exclude=points[0])
    return all(isinstance(node, IterDataPipe) and getattr(node, flag) for node in after)


def _holds_graph_state(value: Any) -> bool:
    """Whether a node's state embeds a snapshot of its upstream (a graph state)."""
    if isinstance(value, dict):
        return isinstance(value.get("nodes"), list) or any(_holds_graph_state(v) for v in value.values())
    if isinstance(value, list):
        return any(_holds_graph_state(v) for v in value)
    return False


def compact_state(graph: IterDataPipe, full: dict[str, Any]) -> list[dict[str, Any]]:
    return [entry["state"] for node, entry in zip(list_dps(graph), full["nodes"], strict=True) if holds_state(node)]
