"""Multi-process throughput: conveyor's ``DataLoader2`` + ``MultiProcessingReadingService`` against
``torch.utils.data.DataLoader`` and torchdata 0.7.1's ``DataLoader2``, with ``W`` worker processes each.

The workloads are the multiprocessing issue's targets, each ``range(N)`` sharded across the
workers and mapped there by a module-level function:

- ``small``: 200,000 ints, identity. The per-item cost of moving an item between processes.
- ``numpy``: 2,000 numpy arrays of 1 MiB (``np.full(1 << 20, i % 251, uint8)``). Bulk data.
- ``tensor``: 2,000 torch tensors of 1 MiB (``torch.full``). Bulk data, torch's own sharing path.

This script is ``conveyor bench`` (the ``conveyor.tools.bench`` package) with ``--workloads``
narrowed to these three: it kept its name because notes and ``benchmarks/README.md`` point
to it, and it runs the same code so that its numbers and ``conveyor bench``'s can never
disagree on how they were measured and checked. It takes the same options and prints the
same report; the package's docstrings say what a run measures, checks and reports.

    python benchmarks/bench_multiprocessing.py [--workloads small,numpy,tensor] [--workers W]
        [--repeats R] [--quick] [--cap-seconds S] [--items N] [--plot PATH] [--plot-workers LIST]

Exit code 0; 1 when a conveyor or torch run failed (raised, or read wrong items); 2 for bad
arguments. Timings are never asserted anywhere.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from conveyor.tools.bench import add_arguments, run

#: The workloads of the multiprocessing issue, offered and run by default.
WORKLOADS = ("small", "numpy", "tensor")


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, run the benchmark and print its report; returns the exit code."""
    parser = argparse.ArgumentParser(description=" ".join((__doc__ or "").split("\n\n", 1)[0].split()))
    add_arguments(parser, workloads=WORKLOADS)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
