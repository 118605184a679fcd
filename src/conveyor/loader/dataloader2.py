"""``DataLoader2``: the user-facing loader. It owns the lifecycle, the seeds and the state.

It works on its own copies of the graph and of the reading service. Each ``iter()``
starts an epoch (or finishes the one a loaded state was saved in); epoch ``e`` draws all
its randomness from ``(seed, e)``, so consecutive epochs differ and two loaders with the
same seed and configuration yield the same items, epoch by epoch.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterable
from typing import Any

from conveyor.core.base import DataPipe, IterDataPipe
from conveyor.core.error_budget import ErrorBudget, check_error_policy
from conveyor.core.graph import fingerprint
from conveyor.core.passes import Pass, State
from conveyor.core.random import SeedGenerator, draw_seed, global_rng_digest
from conveyor.errors import StateError
from conveyor.loader.adapters import Adapter
from conveyor.loader.checkpoint import LoaderCheckpoint
from conveyor.loader.epoch import Epoch, close_all, weakly
from conveyor.loader.epoch_iterator import DataLoader2Iterator
from conveyor.loader.intake import loaders_graph, own_copy
from conveyor.loader.statistics import LoaderStatistics
from conveyor.observe.stats import PipelineStats, check_stats_mode
from conveyor.reading_service.in_process import InProcessReadingService
from conveyor.reading_service.interface import (
    CheckpointableReadingServiceInterface,
    ReadingServiceInterface,
)


class DataLoader2(LoaderCheckpoint):
    """Iterates a pipe graph through a reading service (in-process by default).

    Args:
        datapipe: the graph's last pipe. A ``MapDataPipe`` is read in index order, split
            between ranks and workers by index (each loads only its own items). A torch
            ``Dataset``, ``IterableDataset`` or datapipe graph is wrapped with
            :func:`conveyor.pipes.from_torch` first.
        datapipe_adapter_fn: an :class:`~conveyor.loader.adapters.Adapter` (or several) applied
            to the graph once, e.g. ``Shuffle(False)``.
        reading_service: how to run the graph; the loader works on a copy of it.
        collect_stats: per-stage numbers for :meth:`stats`. ``True`` (the default) counts
            items and times a sample of them, installing nothing in any process (see
            :mod:`conveyor.observe.stats`); ``"sample"`` samples every thread's stack instead,
            with a thread, and a ``SIGPROF`` timer in each worker (see
            :mod:`conveyor.observe.stack_sampler`); ``False``: none.
        on_error: what an error raised by a per-item stage (``map``, ``filter``,
            ``flatmap``, a decoder, ``collate``...) does: ``"raise"`` (the default) ends the
            epoch with it; ``"skip"`` drops the item and records it (stage, position,
            type, message) in ``stats().skipped`` and in the state, the same items on
            every run and for every ``num_workers`` (see :mod:`conveyor.core.error_budget`).
        max_skipped: with ``on_error="skip"``, how many items an epoch may skip: a count
            (int), or a fraction of the items seen (float below 1). Past it the epoch
            raises :class:`~conveyor.errors.SkipBudgetError`, listing them.
    """

    def __init__(
        self,
        datapipe: DataPipe,
        datapipe_adapter_fn: Adapter | Iterable[Adapter] | None = None,
        reading_service: ReadingServiceInterface | None = None,
        *,
        collect_stats: bool | str = True,
        on_error: str = "raise",
        max_skipped: int | float = 0,
    ):
        check_stats_mode(collect_stats)
        check_error_policy(on_error, max_skipped)
        graph = loaders_graph(datapipe, datapipe_adapter_fn)
        if reading_service is not None and not isinstance(reading_service, ReadingServiceInterface):
            raise TypeError(
                f"reading_service must implement ReadingServiceInterface, got {type(reading_service).__name__}"
            )
        self._graph: IterDataPipe = graph  # the user's graph, before any service adapts it
        self._fingerprint = fingerprint(graph)
        self.reading_service: ReadingServiceInterface = (
            own_copy(reading_service, "the reading service")
            if reading_service is not None
            else InProcessReadingService()
        )
        self.datapipe: DataPipe | None = None  # the graph as adapted by the service
        # Until seed() is called, each epoch draws its base seed (see __iter__).
        self._seeds, self._seeded = SeedGenerator(0), False
        self._next_epoch = 0  # the epoch the next fresh iter() starts
        self._epoch: int | None = None  # the epoch in progress, if any
        self._pending: dict[str, Any] | None = None  # a loaded state not yet resumed ...
        self._pending_pipeline: State | None = None  # ... its pipeline state, adapted to the services
        self._pending_adapted = False  # (False: the services could not preview the graph)
        self._generation = 0  # epochs opened and states loaded: an epoch of an older one is dead
        # The last epoch opened (in progress, or ended: its skip ledger stays readable).
        self._current: Epoch | None = None
        self._iterator: weakref.ref[DataLoader2Iterator] | None = None  # the last iter()'s
        # A loader dropped mid-epoch without shutdown(): its pass's threads end with it.
        self._open_pass: list[Pass] = []
        weakref.finalize(self, close_all, self._open_pass)
        self._initialized = False
        self._shut_down = False
        self._final_state: dict[str, Any] | None = None  # state_dict() after shutdown()
        # conveyor.DataLoader's (loader.inner.InnerLoader): keep the state of each epoch as it
        # ended (its last item's, in-progress form), from which a resume sets its Stateful
        # objects as they ended.
        self._keep_end_state = False
        self._end_state: dict[str, Any] | None = None
        # Whether an iterator of a resumed epoch with nothing left goes on into the next
        # epoch (conveyor.DataLoader begins its epochs itself: its InnerLoader does not).
        self._rolls_over = True
        self._length: int | None = None  # len(), once known
        self._resumed_length: int | None = None  # a loaded epoch's, when longer (elastic resume)
        self._stats = LoaderStatistics(collect_stats, self.reading_service)
        self._budget = ErrorBudget(max_skipped) if on_error == "skip" else None

    # --- seeds ---------------------------------------------------------------------------

    def seed(self, seed: int) -> None:
        """Fix the base seed and restart the epoch count: the next ``iter()`` is epoch 0 of
        ``seed``. Later epochs derive from ``(seed, epoch)`` and differ from each other.

        Without it, each epoch draws its base seed from torch's global RNG when torch is
        imported (numpy's otherwise), as torch's ``DataLoader`` does: ``torch.manual_seed(n)``
        before an epoch makes it repeatable."""
        if self._pending is not None:
            raise RuntimeError(
                "seed() after load_state_dict() would discard the restored position; the state "
                "carries its own seed. Call seed() before load_state_dict(), or not at all."
            )
        self._seeds.seed(seed)
        self._seeded = True
        self._next_epoch = 0

    # --- pause, resume, limit (torchdata's _pause, _resume, _limit) -------------------------

    def pause(self) -> None:
        """Pause the epoch in progress: its iterator's ``next()`` raises
        :class:`~conveyor.errors.PauseIteration` (a ``StopIteration``: a ``for`` loop ends)
        without ending the epoch, and the reading service may stop reading ahead, until
        :meth:`resume`. ``state_dict()`` works while paused."""
        self._epoch_iterator("pause").pause()

    def resume(self) -> None:
        """Continue the paused epoch where it stopped (``RuntimeError`` if it is not paused)."""
        iterator = self._epoch_iterator("resume")
        if not iterator.paused:
            raise RuntimeError("resume() was called on a DataLoader2 that is not paused; pause() or limit() first")
        iterator.resume()

    def limit(self, num_items: int | None) -> None:
        """Pause the epoch in progress after ``num_items`` more items (``None``: no limit);
        after each :meth:`resume` the limit counts again."""
        self._epoch_iterator("limit").limit(num_items)

    # torchdata's private names for the same, which its users and tests call.
    _pause, _resume, _limit = pause, resume, limit

    def _epoch_iterator(self, action: str) -> DataLoader2Iterator:
        iterator = self._iterator() if self._iterator is not None else None
        # The last iterator reads the loader's last epoch (made by that iter(), or rolled
        # over into by the iterator): it is in progress while that epoch is live.
        current = self._current
        if self._epoch is None or iterator is None or current is None or not current.live:
            raise RuntimeError(f"no epoch is in progress to {action}: call iter() on the DataLoader2 first")
        return iterator

    # --- iteration -----------------------------------------------------------------------

    def __iter__(self) -> DataLoader2Iterator:
        if self._shut_down:
            raise RuntimeError("this DataLoader2 was shut down; create a new one to read again")
        resuming = self._pending is not None and self._pending["in_progress"]
        epoch = self._begin_epoch()
        # A resumed epoch whose state was taken after its last item has nothing left: its
        # iterator then goes straight on into the next epoch, as the uninterrupted loader's
        # next iter() would (trainers call iter() once per epoch).
        epoch.rolls_over = resuming and self._rolls_over
        # The iterator holds the loader (a `for` loop over DataLoader2(...) holds nothing
        # else) and reads only its public datapipe; everything else goes through the epoch.
        iterator = DataLoader2Iterator(self, epoch)
        self._iterator = weakref.ref(iterator)  # not a cycle: a dropped loader ends at once
        return iterator

    def _begin_epoch(self) -> Epoch:
        """Open the next epoch (or the loaded one)."""
        self._close_active()
        self._epoch = None  # an epoch still open is abandoned: the next one is this iter()'s
        self._end_state = None
        if not self._initialized:
            self._initialize()
        resume = self._pending
        resuming = resume is not None and resume["in_progress"]
        epoch = resume["epoch"] if resuming else self._next_epoch  # type: ignore[index]
        if resuming and self._resumed_length is None:
            self._resumed_length = self._loaded_epoch_length()
        elif not resuming:
            self._resumed_length = None
        self._new_generation()
        try:
            pipeline = self._resumed_pipeline(resume) if resuming else None  # type: ignore[arg-type]
            if not self._seeded and not (resuming and resume["rng_at_save"] == global_rng_digest()):  # type: ignore[index]
                # Each epoch without seed() takes one draw from the global RNG; a resumed
                # epoch takes it too (its seed is the state's), so the epochs after it draw
                # what the uninterrupted loader's drew when the caller seeds the same way,
                # unless the caller set the RNG back to where it stood at the checkpoint.
                drawn = draw_seed()
                if not resuming:
                    self._seeds.seed(drawn)
            seeds = self._seeds.for_epoch(epoch, drawn=not self._seeded)
            reset_fn = self.reading_service.initialize_iteration(seeds)  # one argument, as torchdata calls it
            if reset_fn is not None:
                self.datapipe = reset_fn(self.datapipe)  # type: ignore[arg-type]
            self._stats.begin(self.datapipe)
            opened = self._open_epoch(pipeline, resume["skipped"] if resuming else [])  # type: ignore[index]
        except BaseException:
            self._stats.stop()
            if resume is not None:  # keep the state: the next iter() restarts the service from it
                self._restart_service()
            raise
        self._pending, self._pending_pipeline = None, None
        self._epoch, self._next_epoch = epoch, epoch + 1
        opened.handed_out = opened.first_item = resume["items"] if resuming else 0  # type: ignore[index]
        if opened.opened is not None:
            opened.profiler = self._stats.profiler
        return opened

    def _new_generation(self) -> None:
        """A new epoch, a loaded state or shutdown: the last epoch's iterator is invalid."""
        self._generation += 1
        if self._current is not None:
            self._current.live = False

    def _resumed_pipeline(self, resume: dict[str, Any]) -> State | None:
        """The loaded pipeline state, adapted to the services now that they built the graph
        (when they could not preview it at load time)."""
        if self._pending_adapted:
            return self._pending_pipeline
        service = self._checkpointable("resume from a state")
        assert self.datapipe is not None
        return service.adapt_pipeline_state(
            self.datapipe, resume["pipeline"], resume["position"], resume["reading_service"]
        )

    def _open_epoch(self, pipeline: State | None, skipped: list[Any]) -> Epoch:
        """The epoch: a pass over the graph (from ``pipeline``, checked against it), or,
        for a service that hands back another kind of iterable, its iterator."""
        datapipe = self.datapipe
        epoch = self._current = Epoch(
            self._generation,
            self.reading_service,
            ended=weakly(self._epoch_ended),
            failed=weakly(self._epoch_failed),
            begin_next=weakly(self._begin_epoch),
        )
        if not isinstance(datapipe, IterDataPipe) and pipeline is not None:
            raise StateError(
                f"DataLoader2 state: {type(self.reading_service).__name__} reads the graph through a "
                f"{type(datapipe).__name__}, which cannot resume a pipeline state"
            )
        epoch.open(datapipe, pipeline, self._stats.context(), self._budget, skipped)
        if epoch.opened is not None:
            self._open_pass[:] = [epoch.opened]
            self._stats.attach(epoch.opened)
        return epoch

    def _initialize(self) -> None:
        pending = self._pending
        if pending is not None and pending["reading_service"] is not None:
            service = self._checkpointable("resume from a state")
            self.datapipe = service.restore(self._graph, pending["reading_service"])
        else:
            self.datapipe = self.reading_service.initialize(self._graph)
        self._initialized = True

    def _epoch_ended(self, epoch: Epoch) -> None:
        self._resumed_length = None  # the next epoch is as long as any
        if epoch.live and self._epoch is not None:
            if self._keep_end_state:
                self._end_state = self._local_state()
            self._epoch = None
            opened = epoch.release()
            self._open_pass.clear()
            if opened is not None:
                opened.close()  # inputs an op stopped reading early (header, zip) end now, threads too
            self._stats.stop()
            self.reading_service.epoch_read(epoch.handed_out - epoch.first_item)
            self.reading_service.finalize_iteration()

    def _epoch_failed(self, epoch: Epoch) -> None:
        """The epoch's items raised: its pass is closed (its threads end) and leaves the
        list the loader's finalizer holds. A pass may keep the error to raise it again, and
        the error references the frames it went through, the caller's too, which reference
        this loader: held from the finalizer, the loader (and its workers) would live as
        long as the process. ``state_dict()`` still reads the closed pass's last position."""
        self._stats.stop()  # the epoch is over: its numbers stay readable
        if epoch.live and epoch.opened is not None:
            self._open_pass.clear()
            with contextlib.suppress(ValueError):  # running in another thread: it ends on its own
                epoch.opened.close()

    def _close_active(self) -> None:
        """End the current epoch's pass, stopping any threads it runs."""
        self._open_pass.clear()
        self._stats.stop()
        if self._current is not None:
            self._current.close()

    # --- statistics ----------------------------------------------------------------------

    def stats(self) -> PipelineStats:
        """Per-stage items, busy and waiting time, and the bottleneck, for the epoch in
        progress (or the last one). Stages in worker processes are summed over workers.
        Raises ``RuntimeError`` if the loader was made with ``collect_stats=False``."""
        return self._stats.report(self._current.ledger if self._current is not None else None)

    def __len__(self) -> int:
        """Items per epoch in this process, when the graph's length is known (``TypeError``
        otherwise): worked out once by the reading service (a rank's share under
        ``DistributedReadingService``) and the same before, during and after ``iter()``,
        so a trainer's fetcher never reads ahead to find an epoch's end."""
        if self._length is None:
            self._length = self.reading_service.epoch_length(self._graph)
        if self._resumed_length is None and self._pending is not None and self._pending["in_progress"]:
            self._resumed_length = self._loaded_epoch_length()
        # A trainer reads len() once, after loading a state, and counts the steps it
        # restored against it: an epoch resumed on another world size may be longer than
        # the others (more of what is left falls to each rank), and is never reported
        # shorter, so that the later epochs are not cut short either.
        return max(self._length, self._resumed_length or 0)

    def _loaded_epoch_length(self) -> int | None:
        """The loaded in-progress epoch's length, counting what it handed out before its
        checkpoint, where the reading service makes it differ from any other's."""
        part = self._pending["reading_service"] if self._pending is not None else None
        lengths = getattr(self.reading_service, "resumed_epoch_length", None)
        if part is None or lengths is None:
            return None
        try:
            return lengths(self._graph, part)
        except TypeError:  # the graph's length is not known
            return None

    # --- state (the rest: loader_checkpoint.LoaderCheckpoint) ----------------------------

    def _restart_service(self) -> None:
        """Loading into a used loader: end the service, rebuild it from the user's graph."""
        self._close_active()
        self._new_generation()
        self.reading_service.finalize()
        self.datapipe = None
        self._initialized = False
        self._epoch = None

    # --- shutdown ------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop every epoch in flight and release the service (``finalize()``, as in
        torchdata, even if it never ran). Idempotent. ``state_dict()`` keeps answering
        with where the loader stood, so a job can still save it after shutting down."""
        if self._shut_down:
            return
        try:
            checkpointable = isinstance(self.reading_service, CheckpointableReadingServiceInterface)
            opened = self._current.opened if self._current is not None else None
            if self._epoch is None or (checkpointable and opened is not None):
                self._final_state = self._local_state()
        finally:
            self._shut_down = True
            self._new_generation()
            try:
                self._close_active()
            finally:
                self.reading_service.finalize()

    def __enter__(self) -> DataLoader2:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"DataLoader2({self._graph!r}, reading_service={type(self.reading_service).__name__})"
