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

Checkpoints: every item carries its worker's state; the pipeline state holds, per worker,
the state after the last item handed to the user, plus where the merge is. It resumes
exactly with the same ``num_workers``, and with any other for per-item pipelines (see
:mod:`conveyor.reading_service.worker_states`). Where each part of the graph runs is
decided in :mod:`conveyor.reading_service.graph_split`.

``worker_type="thread"`` runs the same workers as threads of this process
(:mod:`conveyor.workers.parent.thread`): the same graph split, merge, states and errors, with
items handed over without pickling. A state saved with either kind resumes with the other.
"""

from __future__ import annotations

import copy
import multiprocessing
from collections.abc import Callable
from typing import Any

from conveyor.core.base import DataPipe, IterDataPipe
from conveyor.core.graph import apply_random_seed, list_dps
from conveyor.core.random import SeedGenerator
from conveyor.core.validation import check_int
from conveyor.core.worker_info import IN_MAIN, WorkerInfo, enter_main_worker, leave_main_worker
from conveyor.observe.stats import StageTotals
from conveyor.pipes.fullsync import FullSync
from conveyor.reading_service.autotune import AUTO, AutoTuner, Choice, probe_target
from conveyor.reading_service.elastic import is_elastic
from conveyor.reading_service.graph_split import (
    adds_sub_positions,
    check_sharding_point_in_workers,
    is_per_item,
    keeps_position_order,
    reattach,
    split_dispatch,
    split_replicable,
)
from conveyor.reading_service.interface import CheckpointableReadingServiceInterface, IterResetFn
from conveyor.reading_service.worker_checkpoints import WorkerCheckpoints
from conveyor.workers.child.dispatch import dispatched_state_reader
from conveyor.workers.parent.dispatcher import Dispatcher
from conveyor.workers.parent.merged_output import MergedWorkerOutput
from conveyor.workers.parent.pool import WorkerPool
from conveyor.workers.parent.worker_reader import DispatchSetup, MergeOrder, WorkerReader
from conveyor.workers.transport.shared_memory import RING_BYTES

InitFn = Callable[[IterDataPipe[Any], WorkerInfo], IterDataPipe[Any]]
ResetFn = Callable[[IterDataPipe[Any], WorkerInfo, SeedGenerator], IterDataPipe[Any]]


class MultiProcessingReadingService(WorkerCheckpoints, CheckpointableReadingServiceInterface):
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
            spelling: no limit; a worker that dies is noticed at once either way); past
            it, a ``WorkerTimeoutError`` names the workers that hold the epoch up.
        worker_type: ``"process"`` (worker processes) or ``"thread"``: each worker a thread
            of this process, for pipelines whose stages release the GIL (numpy, Pillow's
            decoding, pyarrow, file and network reads), and for every stage on a
            free-threaded Python. They start in microseconds, share this process's memory,
            and hand items over as they are (no pickling, no copy: items need not pickle).
            The output, states, errors and every other argument are as with processes
            (a state saved with one kind resumes with the other), except:
            ``multiprocessing_context`` must stay None and ``shared_memory_budget`` does
            not apply; the global RNGs (``random``, numpy's, torch's) are not seeded per
            worker (they are the process's, shared by the threads and the user), so user
            code that draws from them is not reproducible in thread workers (conveyor's
            random ops, keyed by item, are); ``get_worker_info()`` is per thread. A thread
            cannot be killed: ``shutdown()`` waits 0.5 s at most, and leaves a thread
            stuck in a user call to end on its own, holding only its own pass.
        shared_memory_budget: bytes of shared memory that all workers' page rings may take
            together (a ring's pages are reserved before first use: its first 1 MiB when
            its worker starts, more as the worker needs them). Large buffers (numpy arrays,
            torch tensors, ``bytes`` of 64 KiB and more) travel through the rings with
            one copy; one that misses its ring travels in a shared file of its own (also
            one copy, but slower for many small buffers). None: 64 MiB per worker, capped
            at 1/8 of the memory limit that backs it (the process's cgroup limit and the
            system's available memory; not ``/dev/shm``'s size, which does not bound
            these rings). 0: no rings. When rings cannot be reserved the loader warns
            once (``SharedMemoryWarning``) and goes on with the slower paths.
        max_worker_restarts: how many dead workers (killed, out of memory, a crash in
            native code, ``os._exit``) may be replaced over the loader's life. A new process
            takes a dead worker's place and resumes from the last item received from it,
            so the epoch's output is unchanged; each restart is logged (logger
            ``conveyor.workers``, WARNING) and counted in ``stats().worker_restarts``.
            0 (the default): a death ends the epoch with a ``WorkerError``, as does one
            past the limit or in dispatch mode (see :mod:`conveyor.workers.parent.healing`).
    """

    def __init__(
        self,
        num_workers: int | str = 0,
        multiprocessing_context: str | None = None,
        worker_prefetch_cnt: int | str = 10,
        main_prefetch_cnt: int | str = 10,
        worker_init_fn: InitFn | None = None,
        worker_reset_fn: ResetFn | None = None,
        in_order: bool = True,
        timeout: float | None = None,
        shared_memory_budget: int | None = None,
        worker_type: str = "process",
        max_worker_restarts: int = 0,
    ):
        for name, count in (
            ("num_workers", num_workers),
            ("worker_prefetch_cnt", worker_prefetch_cnt),
            ("main_prefetch_cnt", main_prefetch_cnt),
        ):
            if isinstance(count, str):
                if count != AUTO:
                    raise ValueError(f"{name} must be an int >= 0 or 'auto', got {count!r}")
            else:
                check_int(name, count, 0)
        check_int("max_worker_restarts", max_worker_restarts, 0)
        if not isinstance(worker_type, str):
            raise TypeError(f"worker_type must be a str, 'process' or 'thread', got {type(worker_type).__name__}")
        if worker_type not in WORKER_TYPES:
            raise ValueError(f"worker_type must be 'process' or 'thread', got {worker_type!r}")
        if worker_type == "thread" and multiprocessing_context is not None:
            raise ValueError(
                f"multiprocessing_context={multiprocessing_context!r} starts worker processes; thread workers "
                "(worker_type='thread') run in this process: leave multiprocessing_context None"
            )
        check_int("shared_memory_budget", shared_memory_budget, 0, allow_none=True)
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
        self.max_worker_restarts = max_worker_restarts
        self.worker_type = worker_type
        self._end: IterDataPipe | None = None  # what the loader iterates
        self._worker_graph: IterDataPipe | None = None  # the replicated part (a copy stays here)
        self._tail: list[IterDataPipe] = []  # main-process ops after the workers' part, from the end down
        self._reader: MergedWorkerOutput | None = None
        self._pool: WorkerPool | None = None
        self._dispatcher: Dispatcher | None = None
        self._collect_stats: bool | str = False
        self._main_epoch = False  # num_workers=0: an epoch runs here as worker 0 of 1
        # "auto" values: chosen at the first initialize, revised between whole epochs.
        self._tuner = (
            AutoTuner(
                num_workers, worker_prefetch_cnt, main_prefetch_cnt, ring_bytes=shared_memory_budget or RING_BYTES
            )
            if AUTO in (num_workers, worker_prefetch_cnt, main_prefetch_cnt)
            else None
        )
        self._source: IterDataPipe | None = None  # the graph given to initialize (a copy), to re-tune
        self._retune = False  # a whole epoch was read since the last choice

    # --- lifecycle -----------------------------------------------------------------------

    def initialize(self, datapipe: DataPipe) -> DataPipe:
        if not isinstance(datapipe, IterDataPipe):
            raise TypeError(f"expected an IterDataPipe, got {type(datapipe).__name__}")
        if self._tuner is not None:
            self._source = copy.deepcopy(datapipe)
            if self._tuner.choice is None:
                self._apply(self._tuner.choose(*probe_target(datapipe)))
        worker_graph, tail = split_replicable(datapipe)
        self._tail = tail
        if self.num_workers > 0:
            check_sharding_point_in_workers(tail)
        if self.num_workers == 0:
            graph = worker_graph
            if self.worker_init_fn is not None:
                enter_main_worker()
                try:
                    graph = self.worker_init_fn(worker_graph, IN_MAIN)
                finally:
                    leave_main_worker()
            self._worker_graph = graph
            self._end = reattach(tail, graph, worker_graph) if tail else graph
            return self._end
        replicated, upstreams = split_dispatch(worker_graph)
        self._worker_graph = replicated
        self._pool = WorkerPool(
            replicated,
            self.num_workers,
            self.multiprocessing_context,
            self.worker_init_fn,
            self.worker_reset_fn,
            self.timeout,
            # The dispatcher feeds every worker from the start; and no worker may be forked
            # while a thread of ours runs (a main-process prefetch, or stack sampling). A
            # thread starts in microseconds: all at once.
            start_all_at_once=bool(upstreams) or self._starts_threads(tail) or self.worker_type == "thread",
            shared_memory_budget=self.shared_memory_budget,
            worker_type=self.worker_type,
            max_restarts=self.max_worker_restarts,
        )
        if upstreams:
            self._dispatcher = Dispatcher(upstreams, self._pool, window=DISPATCH_WINDOW)
        self._reader = self._make_reader(replicated, upstreams, self._pool, self._dispatcher)
        self._reader.collect_stats = self._collect_stats
        self._end = reattach(tail, self._reader, worker_graph) if tail else self._reader
        return self._end

    def _starts_threads(self, tail: list[IterDataPipe]) -> bool:
        """Whether the main process runs threads of ours while the epoch is read (then
        every worker is started first)."""
        return self._collect_stats == "sample" or any(getattr(node, "runs_threads", False) for node in tail)

    def _make_reader(
        self,
        replicated: IterDataPipe,
        upstreams: list[IterDataPipe],
        pool: WorkerPool | None,
        dispatcher: Dispatcher | None,
    ) -> MergedWorkerOutput:
        worker_prefetch, main_prefetch = self.worker_prefetch_cnt, self.main_prefetch_cnt
        assert isinstance(worker_prefetch, int) and isinstance(main_prefetch, int)  # "auto" was chosen by now
        positional = keeps_position_order(replicated)
        if upstreams:
            positional = positional and is_per_item(replicated)  # the merge may skip ahead of a fed worker
        dispatch = None
        if upstreams and dispatcher is not None:
            dispatch = DispatchSetup(dispatcher, dispatched_state_reader(replicated), len(upstreams))
        order = MergeOrder(self.in_order, positional, sub_positions=adds_sub_positions(replicated))
        reader = WorkerReader(self.num_workers, pool, order, max(1, worker_prefetch), main_prefetch, dispatch)
        return MergedWorkerOutput(
            replicated, reader, check_worker_states=self.worker_init_fn is None, dispatch_upstreams=upstreams
        )

    def preview(self, datapipe: DataPipe) -> DataPipe | None:
        """The graph ``initialize`` would return, with no worker started (None when a
        ``worker_init_fn`` builds the graph the main process reads, with 0 workers)."""
        if not isinstance(datapipe, IterDataPipe):
            raise TypeError(f"expected an IterDataPipe, got {type(datapipe).__name__}")
        if self._tuner is not None and self._tuner.choice is None:
            return None  # the worker count is chosen when the graph is built
        datapipe = copy.deepcopy(datapipe)
        worker_graph, tail = split_replicable(datapipe)
        if self.num_workers == 0:
            return None if self.worker_init_fn is not None else datapipe
        replicated, upstreams = split_dispatch(worker_graph)
        reader = self._make_reader(replicated, upstreams, None, None)
        return reattach(tail, reader, worker_graph) if tail else reader

    def _apply(self, choice: Choice) -> None:
        self.num_workers = choice.num_workers
        self.worker_prefetch_cnt = choice.worker_prefetch_cnt
        self.main_prefetch_cnt = choice.main_prefetch_cnt

    def _retuned(self, iter_reset_fn: IterResetFn | None) -> IterResetFn | None:
        """After a whole epoch: another choice, when the tuner makes one, with the graph
        built again for it (not when another service owns part of the graph: fullsync)."""
        self._retune = False
        assert self._tuner is not None and self._source is not None
        if any(isinstance(node, FullSync) for node in list_dps(self._source)):
            return iter_reset_fn
        choice = self._tuner.next_choice()
        if choice is None or choice.num_workers == self.num_workers:
            return iter_reset_fn
        source = self._source
        self.finalize()
        self._apply(choice)
        end = self.initialize(source)
        return lambda _graph: end

    def epoch_read(self, items: int) -> None:
        if self._tuner is not None:
            self._tuner.epoch_ended(items)
            self._retune = True

    def tuning(self) -> dict[str, Any] | None:
        return self._tuner.report() if self._tuner is not None else None

    def restore(self, datapipe: DataPipe, state: Any) -> DataPipe:
        self.validate_checkpoint(datapipe, state)
        if self._tuner is not None and not is_elastic(state) and not state["per_item"]:
            self._tuner.fix_workers(state["num_workers"])  # only that worker count resumes it
        return self.initialize(datapipe)

    def initialize_iteration(
        self, seed_generator: SeedGenerator, iter_reset_fn: IterResetFn | None = None
    ) -> IterResetFn | None:
        if self._retune:
            iter_reset_fn = self._retuned(iter_reset_fn)
        if self._tuner is not None:
            self._tuner.epoch_started()
        end = self._require_end()
        apply_random_seed(end, seed_generator)  # main-process stages (and, with 0 workers, all)
        if self.num_workers == 0:
            graph = self._worker_graph
            assert graph is not None
            self._begin_main_epoch()
            if self.worker_reset_fn is not None:
                returned = self.worker_reset_fn(graph, IN_MAIN, seed_generator.spawn(0))
                if returned is not graph:
                    raise ValueError("worker_reset_fn must return the graph it was given (changed in place)")
            return iter_reset_fn
        assert self._reader is not None
        self._reader.prepare_epoch(seed_generator)
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
        if self._pool is not None:
            self._pool.close()
        self._pool = self._reader = self._end = self._worker_graph = self._dispatcher = None

    def set_stats_collection(self, enabled: bool | str) -> None:
        self._collect_stats = enabled

    def worker_stage_totals(self) -> list[StageTotals] | None:
        return self._reader.stage_totals() if self._reader is not None else None

    def worker_restarts(self) -> list[dict[str, Any]]:
        return list(self._pool.restarts.events) if self._pool is not None else []

    def __repr__(self) -> str:
        defaults = MultiProcessingReadingService.__init__.__defaults__ or ()
        names = MultiProcessingReadingService.__init__.__code__.co_varnames[1 : 1 + len(defaults)]
        shown = [
            f"{name}={getattr(self, name)!r}"
            for name, default in zip(names, defaults, strict=True)
            if name in ("num_workers", "worker_type") or getattr(self, name) != default
        ]
        return f"MultiProcessingReadingService({', '.join(shown)})"

    def _require_end(self) -> IterDataPipe:
        if self._end is None:
            raise RuntimeError("MultiProcessingReadingService is not initialized; iterate the loader first")
        return self._end


PrototypeMultiProcessingReadingService = MultiProcessingReadingService

#: Dispatch mode: fed items a worker may hold beyond what it has taken.
DISPATCH_WINDOW = 128
#: What ``worker_type`` may be: worker processes, or threads of this process.
WORKER_TYPES = ("process", "thread")
