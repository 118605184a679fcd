"""What a suite declares: its workloads, its loaders, and the few hooks a suite needs
beyond them. The harness runs every loader on every workload it applies to.

A suite is one file, ``benchmarks/bench_<name>.py``, or one module of conveyor
(``conveyor.tools.bench.suite``, the suite of ``conveyor bench``), holding a
:class:`Suite`. The same file is imported by the orchestrator and by every run's fresh
process (possibly under a peer's interpreter), so it imports only the standard library,
numpy and the harness at its top, and each loader's library inside that loader's ``open``.

Adding a workload is one :class:`Workload` (its sizes, how a run counts its items, what
the count must come to); adding a loader is one :class:`Loader` (how it is built over a
workload's items and shut down, or, for a bound with no loader, its own epoch).

Standard library only.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from conveyor.tools.bench.harness.results import Result
    from conveyor.tools.bench.harness.tally import Tally


class RunError(RuntimeError):
    """A run cannot be made as asked (a loader that does not apply to the workload, a
    bound's worker that failed): its process prints one line and the run counts as failed."""


class Opened(NamedTuple):
    """A loader built for one epoch: the items to iterate, how to shut it down (its worker
    processes joined), and optionally the epoch's own figures beyond the harness's, read
    after the shutdown (seconds spent in a call the loader's items make, say): numbers
    become metrics where the suite defines them (``Suite.metrics``), anything else is
    kept as the run's details."""

    items: Iterable[Any]
    close: Callable[[], None]
    extra: Callable[[], Mapping[str, Any]] | None = None


@dataclass(frozen=True)
class Context:
    """One epoch of one run, as the suite's code sees it (in the run's process)."""

    workload: Workload
    loader: Loader | None  # None in the orchestrator, working out what a run must deliver
    items: int
    settings: Mapping[str, Any]  # the suite's settings for every run (sizes, data paths)
    warmup: bool  # the small epoch before the timed one


def default_warmup(items: int) -> int:
    """A warm-up epoch's items: enough for first calls, imports and caches, not more."""
    return min(items, max(8, items // 50))


@dataclass(frozen=True)
class Workload:
    """What every loader delivers: ``items`` ids per epoch, made by the loader's workers.

    ``tally`` makes the run's count of an epoch (each item checked as it arrives);
    ``expected`` gives, in the orchestrator, the checksum that count must come to (None:
    ids only). ``item_bytes`` makes the results carry MB/s. ``unit`` names the items in
    tables ("images", "rows"); ``settings`` are the workload's own, handed to its runs.
    ``cappable``: whether a run may read fewer items than asked when a cap on its time is
    set (not when the items are files made for that count).
    """

    key: str
    items: int
    quick_items: int
    describe: str
    tally: Callable[[Context], Tally]
    expected: Callable[[Context], Any] = lambda context: None
    item_bytes: int = 0
    unit: str = "items"
    warmup: Callable[[int], int] = default_warmup
    settings: Mapping[str, Any] = field(default_factory=dict)
    cappable: bool = True

    def count(self, quick: bool) -> int:
        return self.quick_items if quick else self.items


class Epoch(NamedTuple):
    """What a loader's own epoch (``Loader.epoch``) measured: seconds from its start to its
    end and to its first item (None: it delivers no single first item), and its tally.
    ``cpu_s`` is set by an epoch whose processes outlive it (ranks), which counts its own
    CPU over the epoch; otherwise the orchestrator measures the whole process tree."""

    wall_s: float
    first_s: float | None
    tally: Tally
    cpu_s: float | None = None
    extra: Mapping[str, Any] = {}


@dataclass(frozen=True)
class Loader:
    """One way to deliver a workload: ``open`` builds the loader over the context's items
    (the harness times the epoch); ``epoch`` runs an epoch of its own instead (a bound that
    is no loader: forked processes sharing the work, say) and reports what it measured.

    ``venv``: the run's interpreter is ``benchmarks/.venvs/<venv>/bin/python`` (a peer's,
    made by ``peer_envs.sh``) instead of the orchestrator's. ``workloads``: the workloads it
    runs (None: all). ``packages``: whose versions a run records. ``needs``: modules the
    orchestrator's interpreter must find for it to run, or ``module:name``: a module that
    must have ``name`` (else its rows say unavailable). ``unavailable``, asked in the
    orchestrator before any run: why the loader cannot run here ('' when it can), for a
    library that is installed but cannot be imported, say.
    """

    key: str
    label: str
    open: Callable[[Context], Opened] | None = None
    epoch: Callable[[Context], Epoch] | None = None
    venv: str | None = None
    workloads: tuple[str, ...] | None = None
    packages: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()
    unavailable: Callable[[], str] | None = None

    def runs(self, workload: str) -> bool:
        return self.workloads is None or workload in self.workloads


class Slot(NamedTuple):
    """One run of a schedule: the repeat it belongs to, its workload and its loader."""

    repeat: int
    workload: Workload
    loader: Loader


def rounds(workloads: Sequence[Workload], loaders: Sequence[Loader], repeats: int) -> Iterator[Slot]:
    """The default schedule: workload after workload, and for each, every loader once per
    repeat, in turn (a slow phase of a shared machine then hits every loader alike)."""
    for workload in workloads:
        for repeat in range(repeats):
            for loader in loaders:
                if loader.runs(workload.key):
                    yield Slot(repeat, workload, loader)


@dataclass(frozen=True)
class Suite:
    """A benchmark: workloads x loaders, run and reported by the harness.

    ``path`` is the suite's file; ``module`` the name a run's process imports it by when it
    is a module of conveyor (None: from ``path``, its folder on ``sys.path``).

    ``subject`` is the loader the tables compare the others with; ``columns`` the metrics
    (``results``) the tables show, ``spread`` those shown with their runs' min-max;
    ``ratio`` the metric whose subject's median the ratio column divides by each row's
    (None: no ratio column); ``metrics`` defines the suite's own metrics, ``key -> (label,
    unit)``: the figures its runs report (``Opened.extra``, ``Epoch.extra``) and those
    ``derive`` adds.

    The hooks, all optional: ``arguments`` adds the suite's options; ``settings`` turns
    them into the settings every run gets; ``prepare`` writes data or starts servers for
    the runs (a context manager around them, adding settings); ``check`` finds what is
    wrong with a run beyond its tally (from the run's figures); ``derive`` adds metrics
    computed across a result's entries; ``notes`` gives the lines printed and saved under
    the tables (targets, and whether each held); ``schedule`` orders the runs; ``command``
    wraps a run's command (a private mount namespace, say), or returns why the workload
    cannot run here.
    """

    name: str
    title: str
    path: str
    workloads: tuple[Workload, ...]
    loaders: tuple[Loader, ...]
    subject: str = "conveyor"
    columns: tuple[str, ...] = ("items_per_s", "cpu_us_per_item", "first_item_ms", "peak_pss_mib")
    spread: tuple[str, ...] = ("items_per_s",)
    ratio: str | None = "items_per_s"
    metrics: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    default_workloads: tuple[str, ...] | None = None
    repeats: int = 3
    arguments: Callable[[argparse.ArgumentParser], None] | None = None
    settings: Callable[[argparse.Namespace], dict[str, Any]] | None = None
    prepare: Callable[[argparse.Namespace, dict[str, Any]], AbstractContextManager[dict[str, Any]]] = (
        lambda options, settings: nullcontext({})
    )
    check: Callable[[Mapping[str, Any]], list[str]] | None = None
    derive: Callable[[Result], None] | None = None
    notes: Callable[[Result], list[str]] | None = None
    schedule: Callable[[Sequence[Workload], Sequence[Loader], int], Iterator[Slot]] = rounds
    command: Callable[[Workload, list[str]], list[str] | str] | None = None
    module: str | None = None

    def workload(self, key: str) -> Workload:
        return next(w for w in self.workloads if w.key == key)

    def loader(self, key: str) -> Loader:
        return next(loader for loader in self.loaders if loader.key == key)
