"""The ``conveyor`` command line.

Each subcommand is a pair of functions: one adds its arguments to its sub-parser, one
runs it and returns the exit code. Each pair imports its module itself, so one
command's optional dependencies (torch, for a benchmark) never break another. To add a
command, write the pair and list it in ``_COMMANDS``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from conveyor import __version__
from conveyor.tools.cli_types import int_in_range

AddArguments = Callable[[argparse.ArgumentParser], None]
Run = Callable[[argparse.Namespace], int]


positive_int = int_in_range(1)
non_negative_int = int_in_range(0)
seed_int = int_in_range(0, 1 << 64)


# --- demo ------------------------------------------------------------------------------


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    from conveyor.tools.demo import DemoConfig, default_data_dir

    defaults = DemoConfig(data_dir=default_data_dir())
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=defaults.data_dir,
        metavar="DIR",
        help="where the dataset is generated, or reused if its manifest matches (default: %(default)s)",
    )
    integers: list[tuple[str, Callable[[str], int], int, str]] = [
        ("--shards", positive_int, defaults.shards, "number of .npz shard files"),
        ("--items-per-shard", positive_int, defaults.items_per_shard, "images per shard"),
        ("--batch-size", positive_int, defaults.batch_size, "items per batch"),
        ("--epochs", positive_int, defaults.epochs, "epochs to train"),
        ("--seed", seed_int, defaults.seed, "the loader's seed, in [0, 2**64)"),
        ("--shuffle-buffer", non_negative_int, defaults.shuffle_buffer, "item shuffle buffer; 0 or 1 disables it"),
        ("--workers", non_negative_int, defaults.workers, "worker processes (0: read in this process)"),
    ]
    for flag, parse, default, help_text in integers:
        parser.add_argument(flag, type=parse, default=default, metavar="N", help=f"{help_text} (default: %(default)s)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    parser.add_argument(
        "--backend",
        choices=("auto", "numpy", "torch"),
        default=defaults.backend,
        help="the model's framework; auto: torch when installed (default: %(default)s)",
    )
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="where the mid-run checkpoint goes (default: beside the data dir, <data-dir>-checkpoint)",
    )


def _demo_run(args: argparse.Namespace) -> int:
    from conveyor.tools.demo import DemoConfig, DemoError, run_demo

    config = DemoConfig(
        data_dir=args.data_dir,
        shards=args.shards,
        items_per_shard=args.items_per_shard,
        batch_size=args.batch_size,
        epochs=args.epochs,
        seed=args.seed,
        shuffle_buffer=args.shuffle_buffer,
        workers=args.workers,
        progress=not args.no_progress,
        backend=args.backend,
        checkpoint_dir=args.checkpoint_dir,
    )
    try:
        return run_demo(config)
    except (DemoError, OSError) as err:
        print(f"conveyor demo: error: {err}", file=sys.stderr)
        return 1


# --- bench -----------------------------------------------------------------------------


def _bench_arguments(parser: argparse.ArgumentParser) -> None:
    from conveyor.tools.bench.options import add_arguments

    add_arguments(parser)


def _bench_run(args: argparse.Namespace) -> int:
    from conveyor.tools.bench import run

    return run(args)


# --- wiring ----------------------------------------------------------------------------

_COMMANDS: dict[str, tuple[str, AddArguments, Run]] = {
    "demo": (
        "generate a small dataset, train a tiny model from it in worker processes, checkpoint and resume exactly",
        _demo_arguments,
        _demo_run,
    ),
    "bench": (
        "compare conveyor with torch's DataLoader and torchdata's DataLoader2 on the same pipelines",
        _bench_arguments,
        _bench_run,
    ),
}


def build_parser() -> argparse.ArgumentParser:
    """The ``conveyor`` parser with every subcommand registered."""
    parser = argparse.ArgumentParser(prog="conveyor", description="conveyor: resumable data loading for PyTorch.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, add_arguments, run) in _COMMANDS.items():
        sub = subparsers.add_parser(name, help=help_text, description=help_text)
        add_arguments(sub)
        sub.set_defaults(run=run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``conveyor`` console script; returns the exit code (argparse
    exits with 2 on bad arguments)."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print(f"conveyor {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
