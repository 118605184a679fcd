"""Per-stage statistics: where a pipeline spends its time, and which stage holds it back.

The default (``collect_stats=True``) installs nothing in any process: no signal handler,
no timer, no thread.

* **Items** are counted exactly, by the passes themselves (:meth:`Pass.yielded
  <conveyor.core.passes.Pass.yielded>`): most know their count without a cost per item
  (a source's index, a map's input's count); the few that do not keep a counter.
* **Time** is measured on a sample of items by the thread that pulls them (the
  consumer's, a worker's loop): see :mod:`conveyor.observe.pull_profiler`. Each stage gets *busy*
  seconds (its own code and the functions it calls) and seconds *waiting on upstream*.

``collect_stats="sample"`` samples every thread's stack instead (see
:mod:`conveyor.observe.stack_sampler`, and what it installs). Worker processes measure their own
copy of the graph and send their numbers along with their output; the main process adds
them up per stage. The *bottleneck* is the stage with the most busy time per process
that runs it; when the loop reading the loader hardly waits for it, the consumer is.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from conveyor.core.base import DataPipe, IterDataPipe
from conveyor.core.graph import list_dps
from conveyor.core.passes import Pass, PassContext
from conveyor.core.stages import stage_label
from conveyor.observe.pull_profiler import PullProfiler

#: What a worker's time outside every stage is charged to: its event loop, capturing
#: each item's state and moving items to the main process.
WORKER_RUNTIME = "worker loop (state, transport)"
#: A worker's time in pulls that no sample of its own split between its stages: its one
#: pull of the epoch (everything else filtered out) was its first, which is not traced.
#: The main process splits it as the other workers' samples split theirs
#: (:func:`spread_unsampled`); the row shows only where nothing could split it.
UNSAMPLED = "worker pulls no sample split"
#: Consumer wait below this share of the epoch's wall time: the loader keeps up.
KEEPS_UP_BELOW = 0.05
#: The ways ``collect_stats`` may be set.
STATS_MODES = (True, False, "sample")

CONSUMER = "consumer (the loop reading the loader)"


def check_stats_mode(mode: Any) -> None:
    if not any(mode is option or (isinstance(mode, str) and mode == option) for option in STATS_MODES):
        raise ValueError(f"collect_stats must be True, False or 'sample', got {mode!r}")


@dataclass
class StageTotals:
    """Raw numbers for one stage in one or more processes (plain data: it crosses pipes)."""

    label: str
    items: int = 0
    busy_s: float = 0.0
    waiting_s: float = 0.0
    processes: int = 1

    def add(self, other: StageTotals) -> None:
        self.items += other.items
        self.busy_s += other.busy_s
        self.waiting_s += other.waiting_s


# --- the report ---------------------------------------------------------------------------


@dataclass(frozen=True)
class StageStats:
    """One stage: where it runs, items it yielded, seconds busy and seconds waiting on
    upstream (summed over the processes that run it)."""

    index: int
    label: str
    where: str  # "main" or "workers"
    items: int
    busy_s: float
    waiting_s: float
    processes: int

    @property
    def busy_per_process_s(self) -> float:
        return self.busy_s / max(1, self.processes)


@dataclass(frozen=True)
class PipelineStats:
    """What ``DataLoader2.stats()`` returns: per-stage numbers, sources last, and the bottleneck.

    ``wall_s`` is the time since the epoch began; ``consumer_wait_s`` how much of it the
    loop reading the loader spent waiting for the next item.
    """

    stages: Sequence[StageStats]
    wall_s: float
    consumer_wait_s: float
    items: int
    #: ``DataLoader2(on_error="skip")``: the items the epoch dropped for errors, as
    #: records (``stage``, ``position``, ``type``, ``message``, ...; see
    #: :mod:`conveyor.core.error_budget`), in the order the loader learnt of them.
    skipped: Sequence[dict[str, Any]] = ()
    #: ``MultiProcessingReadingService(max_worker_restarts=n)``: the dead workers replaced
    #: over the loader's life (``worker_id``, ``death``, ``at``, ``restart``).
    worker_restarts: Sequence[dict[str, Any]] = ()
    #: ``MultiProcessingReadingService(num_workers="auto", ...)``: what it chose and why,
    #: what it measured (see :mod:`conveyor.reading_service.autotune`); None otherwise.
    tuning: dict[str, Any] | None = None

    @property
    def bottleneck(self) -> str:
        """The label of the stage holding the pipeline back, or :data:`CONSUMER`."""
        if self.wall_s <= 0 or self.consumer_wait_s < KEEPS_UP_BELOW * self.wall_s or not self.stages:
            return CONSUMER
        return max(self.stages, key=lambda s: s.busy_per_process_s).label

    def table(self) -> str:
        """A fixed-width table, one row per stage, ending with the bottleneck."""
        header = f"{'stage':<40} {'runs in':<12} {'items':>10} {'busy s':>9} {'waiting s':>10}"
        rows = [header, "-" * len(header)]
        for stage in reversed(self.stages):  # sources first, as data flows
            where = stage.where if stage.processes == 1 else f"{stage.processes} {stage.where}"
            rows.append(
                f"{stage.label[:40]:<40} {where:<12} {stage.items:>10,} {stage.busy_s:>9.2f} {stage.waiting_s:>10.2f}"
            )
        share = self.consumer_wait_s / self.wall_s if self.wall_s > 0 else 0.0
        rows.append(
            f"{self.items:,} items in {self.wall_s:.2f} s; the loop waited {self.consumer_wait_s:.2f} s "
            f"({share:.0%}) for items; bottleneck: {self.bottleneck}"
        )
        if self.skipped:
            rows.append(f"{len(self.skipped):,} items skipped for errors (see .skipped)")
        if self.worker_restarts:
            rows.append(f"{len(self.worker_restarts)} dead workers replaced (see .worker_restarts)")
        return "\n".join(rows)

    def __str__(self) -> str:
        return self.table()


def merge_totals(into: list[StageTotals] | None, more: Sequence[StageTotals]) -> list[StageTotals]:
    """Add one process's totals to another's, stage by stage (same graph)."""
    if into is None:
        return [StageTotals(t.label, t.items, t.busy_s, t.waiting_s, t.processes) for t in more]
    for mine, theirs in zip(into, more, strict=True):
        mine.add(theirs)
        mine.processes += theirs.processes
    return into


def spread_unsampled(rows: list[StageTotals]) -> list[StageTotals]:
    """Workers' rows (one graph's, summed over workers) with the :data:`UNSAMPLED` time
    split between the stages in the shares the samples gave them, and its row dropped;
    kept, where no stage has any time to take shares from."""
    unsampled = next((row for row in rows if row.label == UNSAMPLED), None)
    if unsampled is None:
        return rows
    if unsampled.busy_s:
        stages = [row for row in rows if row.label not in (UNSAMPLED, WORKER_RUNTIME)]
        sampled = sum(row.busy_s for row in stages)
        if not sampled:
            return rows  # nothing to take shares from: the row stays
        scale = (sampled + unsampled.busy_s) / sampled
        for row in stages:
            row.busy_s *= scale
            row.waiting_s *= scale
    return [row for row in rows if row is not unsampled]


class EpochStats:
    """One epoch's statistics in one process, the default way: items from the passes,
    time from sampled pulls (:class:`~conveyor.observe.pull_profiler.PullProfiler`).

    Open the epoch's pass with :meth:`context`, hand it to :meth:`attach`, and pull through
    :attr:`profiler`. ``runtime_label`` names a row for time the process spent outside
    every stage (a worker's loop), added with :meth:`add_runtime`. ``earlier``: the same
    graph's previous epoch, whose sampling schedule goes on.
    """

    def __init__(self, graph: DataPipe, runtime_label: str | None = None, earlier: EpochStats | None = None) -> None:
        self._nodes = [node for node in list_dps(graph) if isinstance(node, IterDataPipe)]
        self._stage_of = {id(node): index for index, node in enumerate(self._nodes)}
        self.profiler: PullProfiler
        if earlier is not None and earlier._stage_of == self._stage_of:
            # The same graph's next epoch: the sampling schedule goes on (see new_epoch).
            self.profiler = earlier.profiler
            self.profiler.new_epoch()
        else:
            # A worker (it names its runtime) times its second pull: its pulls are its work,
            # not a start, but the first one runs what its stages import at first use, and
            # tracing that delayed the first item by milliseconds.
            self.profiler = PullProfiler(self._stage_of, len(self._nodes), 2 if runtime_label is not None else None)
        self._threads: list[tuple[PullProfiler, Callable[[], int]]] = []  # other pullers, and their pulls
        self._retired: dict[int, int] = {}
        self._root: Pass | None = None
        self._final_counts: list[int] | None = None  # once stopped
        self._runtime_label = runtime_label
        self._runtime_s = 0.0  # seconds the puller spent, pulls included
        self._pulls = [0, 0, 0.0]  # a puller that times some of its pulls: pulls, timed, their seconds
        self._started = time.perf_counter()
        self._stopped = 0.0

    def context(self) -> PassContext:
        """The context to open the epoch's pass in (it keeps the counts of replaced passes)."""
        return PassContext(retired=self._retired, stats=self)

    def thread_profiler(self, pulls: Callable[[], int]) -> PullProfiler:
        """A profiler for a thread that pulls from part of the tree (a prefetch's), whose
        pulls so far ``pulls()`` tells."""
        profiler = PullProfiler(self._stage_of, len(self._nodes))
        self._threads.append((profiler, pulls))
        return profiler

    def attach(self, root: Pass) -> None:
        self._root = root

    def add_runtime(self, seconds: float, pulls: int, timed: int, timed_s: float) -> None:
        """The puller spent ``seconds`` on ``pulls`` pulls and what goes with them (a
        worker's chunk); ``timed`` of the pulls took ``timed_s``. What the pulls do not
        account for is the runtime's own."""
        self._runtime_s += seconds
        counted = self._pulls
        counted[0] += pulls
        counted[1] += timed
        counted[2] += timed_s

    @property
    def _pull_s(self) -> float | None:
        """Seconds in pulls, from the timed ones, when the puller times some."""
        pulls, timed, timed_s = self._pulls
        return timed_s * pulls / timed if timed else None

    def stop(self) -> None:
        """The epoch is over: its numbers are kept, its passes let go (they hold what the
        epoch had buffered, items included, which must not live as long as the report)."""
        if not self._stopped:
            self._stopped = time.perf_counter()
            self._final_counts = self.counts()
            self._threads = [(profiler, _returning(pulls())) for profiler, pulls in self._threads]
            self._root = None

    def counts(self) -> list[int]:
        """Items each stage yielded this epoch."""
        if self._final_counts is not None:
            return list(self._final_counts)
        counts = [self._retired.get(id(node), 0) for node in self._nodes]
        stack = [self._root] if self._root is not None else []
        while stack:
            opened = stack.pop()
            stage = self._stage_of.get(id(opened.pipe))
            if stage is not None:
                counts[stage] += opened.yielded()
            stack.extend(opened.inputs())
        return counts

    def totals(self) -> list[StageTotals]:
        """Per stage, in graph order; then the runtime's own time, when it has a label."""
        counts = self.counts()
        busy, waiting, in_pulls = self._estimates(counts)
        for profiler, pulls in self._threads:
            more_busy, more_waiting, _ = profiler.estimates(max(pulls(), profiler.covered))
            busy = [a + b for a, b in zip(busy, more_busy, strict=True)]
            waiting = [a + b for a, b in zip(waiting, more_waiting, strict=True)]
        totals = [
            StageTotals(stage_label(node), count, spent, waited)
            for node, count, spent, waited in zip(self._nodes, counts, busy, waiting, strict=True)
        ]
        if self._runtime_label is not None:
            unsplit = in_pulls if not any(busy) and not any(waiting) else 0.0
            totals.append(StageTotals(UNSAMPLED, 0, unsplit, 0.0))
            totals.append(StageTotals(self._runtime_label, 0, max(0.0, self._runtime_s - in_pulls), 0.0))
        return totals

    def _estimates(self, counts: list[int]) -> tuple[list[float], list[float], float]:
        """``(busy, waiting, seconds in pulls)`` of the puller's pulls. A puller that times
        its pulls (a worker) gives their time, the samples split it between the stages;
        otherwise the samples tell the share of its time it spends in pulls (from the gaps
        right after them: a ratio, steadier than adding sampled pulls up) and how it is
        spent waiting, and the busy time is the sampled pulls' scaled to the pulls made
        (as everything is before any gap was seen)."""
        profiler = self.profiler
        pulls = max(counts[0] if counts else 0, profiler.covered)
        shares = profiler.shares() if self._pull_s is None else None
        if shares is not None:
            # Busy time adds the samples up, each standing for the pulls since the last:
            # it barely depends on whether a sample caught one of the rare long waits,
            # which decide the shares. Time in pulls and waiting come from the shares.
            share, _, waiting_shares = shares
            in_pulls = share * self._wall()
            busy = profiler.estimates(pulls)[0]
            total = sum(busy)
            if total > in_pulls:  # no more than there was
                busy = [b * in_pulls / total for b in busy]
            return busy, [w * in_pulls for w in waiting_shares], in_pulls
        busy, waiting, in_pulls = profiler.estimates(pulls, self._pull_s)
        wall = self._wall()
        if self._pull_s is None and in_pulls > wall > 0:  # few samples, one of them long: no more than there was
            scale = wall / in_pulls
            busy, waiting, in_pulls = [b * scale for b in busy], [w * scale for w in waiting], wall
        return busy, waiting, in_pulls

    def _wall(self) -> float:
        return (self._stopped or time.perf_counter()) - self._started

    def report(self, worker_totals: Sequence[StageTotals] | None = None) -> PipelineStats:
        """This process's stages (then the workers' ones, when given) as a report."""
        wall = self._wall()
        waited = min(wall, self._estimates(self.counts())[2])  # an estimate: never more than there was
        return build_report(self.totals(), worker_totals, wall, waited)


def _returning(value: int) -> Callable[[], int]:
    return lambda: value


def build_report(
    main: Sequence[StageTotals], worker_totals: Sequence[StageTotals] | None, wall_s: float, consumer_wait_s: float
) -> PipelineStats:
    """The report of this process's stage totals and the workers' (summed over them)."""
    stages = [StageStats(i, t.label, "main", t.items, t.busy_s, t.waiting_s, 1) for i, t in enumerate(main)]
    for t in worker_totals or ():
        stages.append(StageStats(len(stages), t.label, "workers", t.items, t.busy_s, t.waiting_s, t.processes))
    items = main[0].items if main else 0
    return PipelineStats(stages=stages, wall_s=wall_s, consumer_wait_s=consumer_wait_s, items=items)
