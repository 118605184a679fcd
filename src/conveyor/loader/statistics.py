"""What ``DataLoader2.stats()`` reports: a loader's statistics, a fresh recorder each epoch.

The loader owns one :class:`LoaderStatistics`; the reading service counts what runs in
its workers, and the epoch's recorder (:class:`~conveyor.observe.stats.EpochStats`, or
:class:`~conveyor.observe.stack_sampler.StageSampler` with ``collect_stats="sample"``)
counts what runs in this process.
"""

from __future__ import annotations

import copy
import dataclasses

from conveyor.core.base import DataPipe, IterDataPipe
from conveyor.core.error_budget import SkipLedger
from conveyor.core.passes import Pass, PassContext
from conveyor.observe.pull_profiler import PullProfiler
from conveyor.observe.stack_sampler import StageSampler
from conveyor.observe.stats import EpochStats, PipelineStats
from conveyor.reading_service.interface import ReadingServiceInterface


class LoaderStatistics:
    """One loader's statistics (``collect_stats``: ``True``, ``"sample"`` or ``False``, as
    ``DataLoader2`` checked it), read through ``service``, whose workers report their own."""

    def __init__(self, collect_stats: bool | str, service: ReadingServiceInterface) -> None:
        self.mode = collect_stats
        self._service = service
        service.set_stats_collection(collect_stats)
        self._recorder: EpochStats | StageSampler | None = None  # the epoch in progress's, or the last one's

    def begin(self, datapipe: DataPipe | None) -> None:
        """A new epoch over ``datapipe`` (the graph as the service adapted it)."""
        if not isinstance(datapipe, IterDataPipe):
            self._recorder = None  # a service handed back another kind of iterable: no stages to count
            return
        if self.mode == "sample":
            sampler = StageSampler(datapipe, watch_consumer=True)
            sampler.start()
            self._recorder = sampler
        elif self.mode:
            earlier = self._recorder if isinstance(self._recorder, EpochStats) else None
            self._recorder = EpochStats(datapipe, earlier=earlier)

    def context(self) -> PassContext:
        """What the epoch's pass is opened with."""
        return self._recorder.context() if self._recorder is not None else PassContext()

    def attach(self, opened: Pass) -> None:
        """The epoch's pass is open: count what it does."""
        if self._recorder is not None:
            self._recorder.attach(opened)

    @property
    def profiler(self) -> PullProfiler | None:
        """What times a sample of the consumer's pulls, when anything does."""
        return self._recorder.profiler if isinstance(self._recorder, EpochStats) else None

    def stop(self) -> None:
        """The epoch is over (or never began): its numbers stay readable."""
        if self._recorder is not None:
            self._recorder.stop()

    def report(self, ledger: SkipLedger | None) -> PipelineStats:
        """The epoch's numbers, with the items ``ledger`` skipped and the service's restarts
        and tuning. Raises ``RuntimeError`` under ``collect_stats=False``."""
        if not self.mode:
            raise RuntimeError("this DataLoader2 was created with collect_stats=False; pass collect_stats=True")
        skipped = tuple(copy.deepcopy(ledger.records)) if ledger is not None else ()
        restarts = tuple(self._service.worker_restarts())
        tuning = self._service.tuning()
        if self._recorder is None:
            return PipelineStats((), 0.0, 0.0, 0, skipped=skipped, worker_restarts=restarts, tuning=tuning)
        report = self._recorder.report(self._service.worker_stage_totals())
        return dataclasses.replace(report, skipped=skipped, worker_restarts=restarts, tuning=tuning)
