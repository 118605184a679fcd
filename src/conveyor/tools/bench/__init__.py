"""``conveyor bench``: conveyor against ``torch.utils.data.DataLoader`` and torchdata 0.7.1's
``DataLoader2`` on the same workloads, on the harness every benchmark of the project runs on.

- ``harness``: the one harness (fresh process per run, CPU of the whole process tree,
  summed PSS, first item, every item checked, results as JSON); the suites of
  ``benchmarks/`` import it from here;
- ``suite``: this command's suite, its ``workloads`` x its ``loaders``, each run's items
  counted by ``tallies`` and made by ``per_item`` (the demo's files: ``demo_data``);
- ``command``: runs the suite for each ``num_workers``; ``report`` prints its tables with
  ratio rows, ``plot`` draws throughput against ``num_workers``;
- ``options``: the command-line options and the :class:`~conveyor.tools.bench.options.Settings`
  they resolve to.

:func:`run` is the ``conveyor bench`` subcommand; :func:`main` is ``python -m conveyor.tools.bench``.
Internal: the commands are the interface, not these modules. Nothing is imported here at
import time: a run's process imports ``suite`` through this package, and the ``conveyor``
command imports ``options`` at start-up.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def run(args: argparse.Namespace) -> int:
    """The ``conveyor bench`` subcommand: ``args`` as parsed by ``options.add_arguments``."""
    from conveyor.tools.bench.command import execute
    from conveyor.tools.bench.options import settings_from_args

    return execute(settings_from_args(args))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m conveyor.tools.bench``: the same as ``conveyor bench``."""
    from conveyor.tools.bench.options import add_arguments

    parser = argparse.ArgumentParser(
        prog="python -m conveyor.tools.bench", description=(__doc__ or "").split("\n", 1)[0]
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))
