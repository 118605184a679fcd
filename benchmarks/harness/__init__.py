"""The benchmarks' one harness.

A suite (``benchmarks/bench_<name>.py``) declares workloads and loaders
(:mod:`harness.declare`); the harness runs every loader on every workload it applies to,
each run in a fresh process, and measures every run the same way:

- **wall**: from the loader's creation to the end of its shutdown, worker processes
  joined, after a small warm-up epoch with a loader of its own (:mod:`harness.child`);
- **first item**: from the loader's creation to its first item;
- **CPU**: of the run's whole process tree, measured from outside: the run's process and
  every process it started, whoever reaped them (:mod:`harness.measure`);
- **memory**: the peak of the summed PSS (and RSS) of those processes, sampled;
- **checked**: every item of every epoch (the warm-up too) counted as it arrives, each id
  exactly once, nothing malformed, the checksum of the values right, and no process left
  behind the loader's shutdown (:mod:`harness.tally`); a wrong run fails, and never counts.

The results carry the machine, the versions, the commit and the date
(:mod:`harness.results`; ``results/README.md`` documents the schema), and every table
shown is generated from them (:mod:`harness.tables`).

The modules a run's process imports (``child``, ``declare``, ``processes``, ``tally``)
use the standard library only: runs of peers' loaders execute under the peers' own
virtual environments.
"""
