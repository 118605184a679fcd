"""The one benchmark harness: ``conveyor bench`` and every suite of ``benchmarks/`` run on it.

A suite declares workloads and loaders (:mod:`~conveyor.tools.bench.harness.declare`); the
harness runs every loader on every workload it applies to, each run in a fresh process,
and measures every run the same way:

- **wall**: from the loader's creation to the end of its shutdown, worker processes
  joined, after a small warm-up epoch with a loader of its own (``child``);
- **first item**: from the loader's creation to its first item;
- **CPU**: of the run's whole process tree, measured from outside: the run's process and
  every process it started, whoever reaped them (``measure``);
- **memory**: the peak of the summed PSS (and RSS) of those processes, sampled;
- **checked**: every item of every epoch (the warm-up too) counted as it arrives, each id
  exactly once, nothing malformed, the checksum of the values right, the last item
  unchanged by the loader's shutdown, and no process left behind it (``tally``); a wrong
  run fails, and never counts.

The tests run the suites' quick runs with each run forked from a process that imported
torch once (``zygote``): they check what runs deliver, never their figures.

The results carry the machine, the versions, the commit and the date (``results``;
``benchmarks/results/README.md`` documents the schema), and every table shown is
generated from them (``tables``).

Every module here uses the standard library only, and imports no other part of conveyor:
runs of peers' loaders execute under the peers' own virtual environments, where
``child.py`` runs as a script and makes this package importable by its one name,
``conveyor.tools.bench.harness``, without importing ``conveyor`` (see ``child``). So its
modules import each other by that name, a module's names only (``from
conveyor.tools.bench.harness.tally import Tally``: the form ``from
conveyor.tools.bench.harness import tally`` would import ``conveyor`` to find it there,
unless every module is loaded already, as ``child`` does before a suite is imported).

Internal: the commands (``conveyor bench``, the suites' scripts) are the interface.
"""
