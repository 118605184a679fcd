"""Autotuning: ``MultiProcessingReadingService(num_workers="auto", worker_prefetch_cnt="auto",
main_prefetch_cnt="auto")``.

The choice is made from measurements, not from the machine's size alone:

1. **A probe** (first epoch): a throwaway pass over the graph the workers would run,
   in this process, for about :data:`PROBE_S` seconds: what an item costs (CPU) and how
   many bytes of large buffers it carries. Passes share nothing, so the probe changes
   nothing the epoch will read (a source that cannot replay, or a dispatched one, is not
   probed: then every core gets a worker).
2. **A model** of each candidate: ``n`` workers deliver at most ``n / (work + send)``
   items a second, the main process receives at most ``1 / receive``, and all of it
   shares the usable cores (the process's CPU affinity and its cgroup's CPU quota);
   in-process (``n = 0``) reading costs ``work`` per item in the consumer's thread. The
   per-item and per-byte costs of sending and receiving are the transport's, measured
   on this kind of machine (:data:`SEND_S`, :data:`RECEIVE_S`, ...). Workers also cost
   memory: a candidate whose workers' rings and copies of the process would take more
   than a quarter of the available memory is out. Among candidates within
   :data:`CLOSE_ENOUGH` of the best predicted rate, the one with the fewest workers wins.
3. **Epoch boundaries**: each epoch's measured rate (items over the epoch's wall time,
   the consumer's time included) is kept per configuration. When the last epoch fell
   short of the model by more than a third, the next epoch tries the best-ranked worker
   count the model expects to beat the rate just measured, if any (one such trial:
   :data:`TRIALS`); afterwards the best measured configuration is kept.

``worker_prefetch_cnt="auto"`` gives each worker enough chunks in flight to cover
:data:`IN_FLIGHT_S` of its output, and ``main_prefetch_cnt="auto"`` lets the main process
read ahead as many items as arrive in that time (its read-ahead thread still runs only
while it pays); neither goes below the defaults, and the transport bounds the bytes of
large buffers in flight itself. What was chosen and
why is in ``DataLoader2.stats().tuning``.
"""

from __future__ import annotations

import copy
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conveyor.core.base import IterDataPipe
from conveyor.core.graph import apply_random_seed, list_dps
from conveyor.core.passes import PassContext
from conveyor.core.random import SeedGenerator
from conveyor.workers.transport.buffers import prepare_item
from conveyor.workers.transport.shared_memory import memory_backing

AUTO = "auto"
#: How long the probe reads (and at most how many items).
PROBE_S = 0.02
PROBE_ITEMS = 256
#: What moving one item through a worker costs, besides its work (from small ints and
#: 1 MiB arrays through worker processes: ``benchmarks/bench_peers.py``'s workloads):
#: the worker's part (state capture, pickling, the ring copy) ...
SEND_S, SEND_S_PER_BYTE = 2.0e-6, 0.25e-9
#: ... and the main process's (reading, decoding, merging, handing out a lease).
RECEIVE_S, RECEIVE_S_PER_BYTE = 3.0e-6, 0.06e-9
#: What handing out an item costs the loader in this process, besides the graph's work
#: (``DataLoader2``'s per-item path; measured: ~0.15-0.2 us on small ints).
IN_PROCESS_S = 0.2e-6
#: Memory a worker process adds beyond its ring (its own interpreter's pages).
WORKER_MEMORY = 64 << 20
#: Predicted rates this close to the best count as equal (the fewest workers win).
CLOSE_ENOUGH = 0.05
#: An epoch this far below its prediction makes the next try another worker count.
SHORT_OF_MODEL = 1 / 3
#: Worker counts measured at most (the model's choice and one other): every epoch spent
#: on a worse count costs its whole length.
TRIALS = 2
#: The prefetch counts' defaults: "auto" never goes below them.
DEFAULT_PREFETCH = 10
#: Output a worker, and the main process, may hold in flight, in seconds of it.
IN_FLIGHT_S = 0.02


@dataclass
class Probe:
    """What the probe measured: CPU seconds per item, bytes of large buffers per item,
    items read (0: not probed, and why)."""

    item_s: float = 0.0
    item_bytes: float = 0.0
    items: int = 0
    why_not: str = ""


@dataclass
class Choice:
    num_workers: int
    worker_prefetch_cnt: int
    main_prefetch_cnt: int
    predicted_items_s: float
    why: str


@dataclass
class AutoTuner:
    """Chooses the values given as ``"auto"`` and revises them between epochs."""

    num_workers: int | str
    worker_prefetch_cnt: int | str
    main_prefetch_cnt: int | str
    ring_bytes: int
    cores: int = field(default_factory=lambda: usable_cores())
    memory: int = field(default_factory=lambda: available_memory())
    probe: Probe | None = None
    choice: Choice | None = None
    #: Measured items/s per worker count, and the model's ranking of counts.
    measured: dict[int, float] = field(default_factory=dict)
    ranked: list[int] = field(default_factory=list)
    _epoch_start: float | None = None

    # --- the first choice -------------------------------------------------------------

    def choose(self, worker_graph: IterDataPipe, dispatched: bool) -> Choice:
        self.probe = measure(worker_graph) if not dispatched else Probe(why_not="a dispatched source is read once")
        return self._decide()

    def _decide(self, prefer: int | None = None) -> Choice:
        probe = self.probe or Probe(why_not="not probed")
        limit = self.max_workers(probe)
        if isinstance(self.num_workers, int):
            candidates = [self.num_workers]
        elif not probe.items:
            candidates = [limit]
        else:
            candidates = list(range(limit + 1))
        rates = {n: self.predict(n, probe) for n in candidates}
        self.ranked = sorted(candidates, key=lambda n: (-rates[n], n))
        best = max(rates.values())
        if prefer is not None and prefer in rates:
            chosen = prefer
        else:
            chosen = min(n for n in candidates if rates[n] >= (1 - CLOSE_ENOUGH) * best)
        why = self._why(chosen, probe, rates)
        self.choice = Choice(chosen, *self._prefetch(chosen, probe), rates[chosen], why)
        return self.choice

    def max_workers(self, probe: Probe) -> int:
        """Workers the cores and the memory allow."""
        per_worker = WORKER_MEMORY + self.ring_bytes
        by_memory = max(1, int(self.memory // 4 // per_worker))
        return max(1, min(self.cores, by_memory))

    def predict(self, n: int, probe: Probe) -> float:
        """Items a second the model expects from ``n`` workers (0: in this process)."""
        if not probe.items:
            return float(n)  # nothing measured: more workers, more throughput
        work = max(probe.item_s, 1e-9)
        if n == 0:
            return 1.0 / (work + IN_PROCESS_S)
        send = SEND_S + SEND_S_PER_BYTE * probe.item_bytes
        receive = RECEIVE_S + RECEIVE_S_PER_BYTE * probe.item_bytes
        return min(n / (work + send), 1.0 / receive, self.cores / (work + send + receive))

    def _prefetch(self, n: int, probe: Probe) -> tuple[int, int]:
        """At least the defaults (fewer in flight made the JPEG batches wait on the
        in-order merge: 0.84x with 2 and 2), more where items come fast: enough chunks,
        and items, to cover :data:`IN_FLIGHT_S` of output. Large buffers in flight are
        bounded by the transport itself (bytes, not chunks)."""
        worker = self.worker_prefetch_cnt
        main = self.main_prefetch_cnt
        rate = self.predict(n, probe) if probe.items else 0.0
        if not isinstance(worker, int):
            chunk_items = 64 if probe.item_bytes < 32 << 10 else max(1, int((2 << 20) // max(probe.item_bytes, 1)))
            chunks = math.ceil(IN_FLIGHT_S * rate / max(n, 1) / chunk_items)
            worker = max(DEFAULT_PREFETCH, min(chunks, 64))
        if not isinstance(main, int):
            main = max(DEFAULT_PREFETCH, min(math.ceil(IN_FLIGHT_S * rate), 1024))
        return worker, main

    def _why(self, chosen: int, probe: Probe, rates: dict[int, float]) -> str:
        if not probe.items:
            return f"{probe.why_not or 'not probed'}: one worker per usable core ({chosen})"
        costs = f"an item costs {probe.item_s * 1e6:.1f} us of work and carries {probe.item_bytes / 1024:.0f} KiB"
        options = ", ".join(f"{n}: {rate:,.0f}/s" for n, rate in sorted(rates.items()))
        return f"{costs}; predicted items/s by workers ({options}); {self.cores} usable cores"

    def fix_workers(self, num_workers: int) -> None:
        """Only ``num_workers`` will do (a state that resumes with its own worker count)."""
        self.num_workers = num_workers
        if self.choice is not None and self.choice.num_workers != num_workers:
            self._decide()

    # --- epoch boundaries -------------------------------------------------------------

    def epoch_started(self) -> None:
        self._epoch_start = time.perf_counter()

    def epoch_ended(self, items: int) -> None:
        """Record the epoch just read with the current choice (whole epochs only)."""
        if self._epoch_start is None or self.choice is None or items <= 0:
            return
        seconds = time.perf_counter() - self._epoch_start
        self._epoch_start = None
        if seconds > 0:
            self.measured[self.choice.num_workers] = items / seconds

    def next_choice(self) -> Choice | None:
        """A different choice for the next epoch, or None to keep the current one."""
        choice = self.choice
        if choice is None or not isinstance(self.num_workers, str) or choice.num_workers not in self.measured:
            return None
        rate = self.measured[choice.num_workers]
        probe = self.probe or Probe()
        # Worth a trial: a count the model expects to beat what was just measured (a slow
        # epoch alone says nothing about whether another count would do better).
        promising = [
            n for n in self.ranked if n not in self.measured and self.predict(n, probe) > rate * (1 + CLOSE_ENOUGH)
        ]
        exploring = len(self.measured) < TRIALS and promising
        if exploring and rate < (1 - SHORT_OF_MODEL) * choice.predicted_items_s:
            return self._decide(prefer=promising[0])
        best = max(self.measured, key=lambda n: self.measured[n])
        if best != choice.num_workers and self.measured[best] > rate * (1 + CLOSE_ENOUGH):
            return self._decide(prefer=best)
        return None

    def report(self) -> dict[str, Any]:
        """What ``stats().tuning`` shows (plain data)."""
        choice = self.choice
        probe = self.probe or Probe()
        return {
            "num_workers": choice.num_workers if choice else None,
            "worker_prefetch_cnt": choice.worker_prefetch_cnt if choice else None,
            "main_prefetch_cnt": choice.main_prefetch_cnt if choice else None,
            "predicted_items_s": choice.predicted_items_s if choice else None,
            "why": choice.why if choice else "",
            "probe": {"item_s": probe.item_s, "item_bytes": probe.item_bytes, "items": probe.items},
            "measured_items_s": {str(n): rate for n, rate in sorted(self.measured.items())},
            "cores": self.cores,
        }


# --- the probe ------------------------------------------------------------------------------


def probe_target(datapipe: IterDataPipe) -> tuple[IterDataPipe, bool]:
    """``(a copy of the part of datapipe the workers would run, whether a source is
    dispatched to them)``: what :meth:`AutoTuner.choose` probes."""
    from conveyor.reading_service.graph_split import split_dispatch, split_replicable

    worker_graph, _ = split_replicable(copy.deepcopy(datapipe))
    replicated, upstreams = split_dispatch(worker_graph)
    return replicated, bool(upstreams)


def measure(worker_graph: IterDataPipe) -> Probe:
    """Read the start of a throwaway pass over ``worker_graph`` (seeded with a fixed seed):
    CPU seconds and large-buffer bytes per item. The first item's cost is left out when
    more came (it pays for filling buffers, opening files, warming caches: a shuffle's
    whole window); the probe ends after :data:`PROBE_ITEMS` more or :data:`PROBE_S`."""
    if not all(getattr(node, "replayable", True) for node in list_dps(worker_graph)):
        return Probe(why_not="a source that does not replay cannot be probed")
    apply_random_seed(worker_graph, SeedGenerator(0).for_epoch(0, drawn=False))
    opened = worker_graph.open(None, PassContext())
    items, size = 0, 0
    clock = time.thread_time
    started = clock()
    first_done = deadline = 0.0
    try:
        for item in opened.items:
            _, large = prepare_item(item)
            size += large
            items += 1
            if items == 1:
                first_done, deadline = clock(), time.perf_counter() + PROBE_S
            elif items > PROBE_ITEMS or time.perf_counter() >= deadline:
                break
    finally:
        opened.close()
    spent = clock()
    if not items:
        return Probe(why_not="the probe read no item")
    item_s = (spent - first_done) / (items - 1) if items > 1 else first_done - started
    return Probe(item_s=item_s, item_bytes=size / items, items=items)


# --- the machine ----------------------------------------------------------------------------


def usable_cores() -> int:
    """CPUs this process may run on, within its cgroup's CPU quota (``cpu.max``)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return cores  # no cgroup v2 CPU controller here: the affinity is the limit
    if quota != "max" and period.isdigit() and int(period) > 0:
        cores = min(cores, max(1, int(int(quota) / int(period))))
    return cores


def available_memory() -> int:
    """The memory this process may use: the smallest of its cgroup limits and
    ``MemAvailable`` (as shared memory is sized)."""
    return memory_backing(memfd=True).bytes
