"""The options of ``conveyor bench`` and the settings they resolve to.

Kept apart from the running code, and free of heavy imports, because the ``conveyor``
command registers every subcommand's arguments at start-up: ``conveyor demo`` must not
pay for (or break on) what the benchmark needs.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from conveyor.tools.cli_types import int_in_range

WORKLOAD_NAMES = ("small", "numpy", "tensor", "cpu", "demo")
LOADER_NAMES = ("conveyor", "torch", "torchdata")
DEFAULT_WORKERS = 2
DEFAULT_REPEATS, QUICK_REPEATS = 3, 1
DEFAULT_CAP_SECONDS, QUICK_CAP_SECONDS = 60.0, 5.0
DEFAULT_PLOT_WORKERS, QUICK_PLOT_WORKERS = (0, 1, 2, 4), (0, 1, 2)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _comma_list(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",")]
    if not text.strip() or any(not name for name in names):
        raise argparse.ArgumentTypeError(f"expected a comma-separated list without empty entries, got {text!r}")
    return list(dict.fromkeys(names))


def _names(what: str, choices: Sequence[str]) -> Callable[[str], tuple[str, ...]]:
    """An argparse ``type`` for a list of ``what`` from ``choices``, returned in the order
    of ``choices`` (the report's order does not depend on how they were typed)."""

    def parse(text: str) -> tuple[str, ...]:
        names = _comma_list(text)
        unknown = [name for name in names if name not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {what}(s) {', '.join(unknown)}; choose from {','.join(choices)}")
        return tuple(name for name in choices if name in names)

    return parse


def _workers_list(text: str) -> tuple[int, ...]:
    parse = int_in_range(0)
    return tuple(sorted({parse(part) for part in _comma_list(text)}))


def add_arguments(parser: argparse.ArgumentParser, workloads: Sequence[str] = WORKLOAD_NAMES) -> None:
    """Add the options of ``conveyor bench`` to ``parser``. ``workloads`` are the ones
    ``--workloads`` offers and runs by default: a front end may narrow them.
    ``--data-dir`` is offered only with the demo workload, the only one that reads files."""
    unknown = [name for name in workloads if name not in WORKLOAD_NAMES]
    if unknown or not workloads:
        raise ValueError(f"workloads must be some of {','.join(WORKLOAD_NAMES)}, got {list(workloads)}")
    workloads = tuple(name for name in WORKLOAD_NAMES if name in workloads)
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"small item counts, {QUICK_REPEATS} repeat, a {QUICK_CAP_SECONDS:g} s cap per run and plot workers "
        f"{','.join(map(str, QUICK_PLOT_WORKERS))}: a smoke run",
    )
    parser.add_argument(
        "--workloads",
        type=_names("workload", workloads),
        default=workloads,
        metavar="LIST",
        help=f"comma-separated, from {','.join(workloads)} (default: all)",
    )
    parser.add_argument(
        "--loaders",
        type=_names("loader", LOADER_NAMES),
        default=LOADER_NAMES,
        metavar="LIST",
        help=f"comma-separated, from {','.join(LOADER_NAMES)} (default: all)",
    )
    parser.add_argument(
        "--workers",
        type=int_in_range(0),
        default=DEFAULT_WORKERS,
        metavar="N",
        help="worker processes per loader for the tables (0: read in the run's process; default: %(default)s)",
    )
    parser.add_argument(
        "--repeats",
        type=int_in_range(1),
        default=None,
        metavar="R",
        help="runs per loader and workload, each a fresh process with a warm-up epoch of its own "
        f"(default: {DEFAULT_REPEATS}; {QUICK_REPEATS} with --quick)",
    )
    parser.add_argument(
        "--items",
        type=int_in_range(1),
        default=None,
        metavar="N",
        help="items per run for every workload (the demo: a dataset of about N images); default: per workload",
    )
    parser.add_argument(
        "--cap-seconds",
        type=_positive_float,
        default=None,
        metavar="S",
        help="a run whose warm-up says it would take longer reads fewer items, and its row says so "
        f"(default: {DEFAULT_CAP_SECONDS:g}; {QUICK_CAP_SECONDS:g} with --quick)",
    )
    parser.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="PATH",
        help="also run every --plot-workers count and draw items/s against num_workers into this PNG (matplotlib)",
    )
    parser.add_argument(
        "--plot-workers",
        type=_workers_list,
        default=None,
        metavar="LIST",
        help="worker counts for --plot, comma-separated "
        f"(default: {','.join(map(str, DEFAULT_PLOT_WORKERS))}; {','.join(map(str, QUICK_PLOT_WORKERS))} with --quick)",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="PATH",
        help="write the results as JSON (the benchmarks' schema) to this file; other --plot-workers counts "
        "to PATH's name with -<N>-workers added",
    )
    where.add_argument(
        "--save",
        action="store_true",
        help="in a conveyor checkout: write the results under benchmarks/results/conveyor-bench/",
    )
    # tests only: that loader's runs leave one item out of their tally, which must fail them
    parser.add_argument("--drop-one", default="", help=argparse.SUPPRESS)
    if "demo" not in workloads:
        parser.set_defaults(data_dir=None)
        return
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="where the demo workload's datasets are generated and reused (default: the per-user cache, "
        "~/.cache/conveyor/bench-demo)",
    )


@dataclass(frozen=True)
class Settings:
    """What one ``conveyor bench`` invocation runs, every default resolved."""

    workloads: tuple[str, ...] = WORKLOAD_NAMES
    loaders: tuple[str, ...] = LOADER_NAMES
    workers: int = DEFAULT_WORKERS
    repeats: int = DEFAULT_REPEATS
    quick: bool = False
    items: int | None = None
    cap_seconds: float = DEFAULT_CAP_SECONDS
    plot: Path | None = None
    plot_workers: tuple[int, ...] = DEFAULT_PLOT_WORKERS
    data_dir: Path | None = None
    out: Path | None = None
    save: bool = False
    drop_one: str = ""

    def items_for(self, items: int, quick_items: int) -> int:
        """Items per run of a workload of these sizes: ``--items``, else its quick or full count."""
        if self.items is not None:
            return self.items
        return quick_items if self.quick else items

    @property
    def worker_counts(self) -> list[int]:
        """Every ``num_workers`` to run: the tables' count, plus the plot's sweep."""
        return sorted({self.workers, *(self.plot_workers if self.plot is not None else ())})

    def command(self, workers: int) -> str:
        """The command that runs what these settings ran with ``workers`` workers."""
        words = ["conveyor", "bench", "--workloads", ",".join(self.workloads), "--loaders", ",".join(self.loaders)]
        words += ["--workers", str(workers), "--repeats", str(self.repeats), "--cap-seconds", f"{self.cap_seconds:g}"]
        words += ["--quick"] if self.quick else []
        words += ["--items", str(self.items)] if self.items is not None else []
        words += ["--data-dir", str(self.data_dir)] if self.data_dir is not None and "demo" in self.workloads else []
        return shlex.join(words)

    def describe(self, items: dict[str, int]) -> str:
        """The settings line of the report: enough to rerun exactly this benchmark."""
        sizes = ", ".join(f"{name} {count:,}" for name, count in items.items())
        plot = f"{self.plot} over workers {','.join(map(str, self.plot_workers))}" if self.plot else "-"
        return (
            f"settings: quick={'yes' if self.quick else 'no'} workloads={','.join(self.workloads)} "
            f"loaders={','.join(self.loaders)} workers={self.workers} repeats={self.repeats} "
            f"(each run a fresh process: a warm-up epoch, then the timed one; loaders take turns) "
            f"items per run: {sizes}; cap={self.cap_seconds:g} s per run; plot={plot}"
        )


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Resolve the parsed options (``--quick`` changes the defaults of the others)."""
    quick = bool(args.quick)
    return Settings(
        workloads=tuple(args.workloads),
        loaders=tuple(args.loaders),
        workers=args.workers,
        repeats=args.repeats if args.repeats is not None else (QUICK_REPEATS if quick else DEFAULT_REPEATS),
        quick=quick,
        items=args.items,
        cap_seconds=args.cap_seconds
        if args.cap_seconds is not None
        else (QUICK_CAP_SECONDS if quick else DEFAULT_CAP_SECONDS),
        plot=args.plot,
        plot_workers=args.plot_workers
        if args.plot_workers is not None
        else (QUICK_PLOT_WORKERS if quick else DEFAULT_PLOT_WORKERS),
        data_dir=args.data_dir,
        out=args.out,
        save=args.save,
        drop_one=args.drop_one,
    )
