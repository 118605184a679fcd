"""The main-process pipe that reads the workers: request, receive, merge, hand out.

With ``main_prefetch_cnt > 0`` a background thread receives and merges ahead of the user
(at most that many items); otherwise the consumer's thread does it. Either way the pipe
remembers, for each worker, the state that came with the last item *handed to the
user*, which is what a checkpoint needs.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from conveyor.errors import StateError, WorkerError
from conveyor.pipes.base import IterDataPipe, Position
from conveyor.pipes.prefetch import END, BoundedBuffer, ThreadFailure
from conveyor.random import SeedGenerator
from conveyor.state import require_keys
from conveyor.workers.merge import NEED, Merge, check_merge_state
from conveyor.workers.pool import WorkerPool
from conveyor.workers.protocol import EpochEnd, Failure

_JOIN_TIMEOUT_S = 10.0


class WorkerReader(IterDataPipe):
    """Yields the merged output of a :class:`WorkerPool` for the epoch it was started on."""

    def __init__(self, pool: WorkerPool, in_order: bool, positional: bool, credits: int, prefetch: int):
        self._pool = pool
        self._in_order = in_order
        self._positional = positional
        self._credits = credits
        self._prefetch = prefetch
        self._generation = 0
        self._epoch_started = False
        self._reset_bookkeeping()

    def _reset_bookkeeping(self) -> None:
        count = self._pool.num_workers
        self._worker_states: list[Any] = [None] * count  # compact state after the last item handed out
        self._bounds: list[Position | None] = [None] * count
        self._done_mask = 0
        self._turn = 0
        self._last_lane: int | None = None

    # --- epochs --------------------------------------------------------------------------

    def start_epoch(self, seeds: SeedGenerator, resumes: list[Any], merge_state: Mapping[str, Any] | None) -> None:
        """Send the epoch's start to every worker; the next ``iter()`` reads it."""
        self._generation += 1
        self._reset_bookkeeping()
        self._merge = Merge(self._pool.num_workers, self._in_order, self._positional)
        if merge_state is not None:
            self._merge.restore(dict(merge_state))
            self._turn, self._last_lane = merge_state["turn"], merge_state["last_lane"]
            self._bounds = [tuple(b) if b is not None else None for b in merge_state["bounds"]]
            self._done_mask = sum(1 << i for i, ended in enumerate(merge_state["ended"]) if ended)
            self._worker_states = list(resumes)
        self._pool.start_epoch(self._generation, seeds, resumes, self._credits)
        self._epoch_started = True

    def __iter__(self) -> Iterator[Any]:
        if not self._epoch_started:
            raise RuntimeError("the workers' epoch was not started; iterate through DataLoader2")
        self._epoch_started = False
        if self._prefetch:
            yield from self._hand_out(self._prefetched())
        else:
            yield from self._hand_out(self._entries(self._generation, None))

    def _hand_out(self, entries: Iterator[tuple[Any, ...]]) -> Iterator[Any]:
        states, bounds = self._worker_states, self._bounds
        for lane, item, state, position, turn, done_mask in entries:
            states[lane], bounds[lane] = state, position
            self._last_lane, self._turn, self._done_mask = lane, turn, done_mask
            yield item

    def _entries(self, generation: int, wake: Any) -> Iterator[tuple[Any, ...]]:
        """Merged ``(lane, item, state, position, turn, done_mask)`` until the epoch ends."""
        merge, pool, everyone = self._merge, self._pool, list(range(self._pool.num_workers))
        while True:
            verdict, detail = merge.next_entry()
            if verdict == "item":
                lane, (item, state, position), freed = detail
                if freed and not merge.lanes[lane].ended:
                    pool.grant(lane, generation)
                done_mask = sum(1 << i for i, other in enumerate(merge.lanes) if other.done)
                yield lane, item, state, position, merge.turn, done_mask
            elif verdict == NEED:
                messages = pool.receive(everyone if detail is None else [detail], None, wake)
                if not messages:
                    return  # woken: the consumer is gone
                for worker_id, message in messages:
                    self._accept(merge, worker_id, message, generation)
            else:
                return

    def _accept(self, merge: Merge, worker_id: int, message: Any, generation: int) -> None:
        if isinstance(message, tuple):  # a decoded chunk: (generation, entries)
            chunk_generation, entries = message
            if chunk_generation == generation:
                merge.add_chunk(worker_id, entries)
        elif isinstance(message, EpochEnd):
            if message.generation == generation:
                merge.end_lane(worker_id)
        elif isinstance(message, Failure):
            if message.generation == generation:
                raise self._pool.failure_error(message)
        else:
            raise WorkerError(f"worker {worker_id} sent an unexpected message {type(message).__name__}")

    def _prefetched(self) -> Iterator[tuple[Any, ...]]:
        buffer = BoundedBuffer(self._prefetch)
        wake_reader, wake_writer = os.pipe()
        generation = self._generation
        entries = self._entries(generation, wake_reader)

        def produce() -> None:
            try:
                for entry in entries:
                    if not buffer.put(entry):
                        return
                buffer.put(END)
            except BaseException as error:  # handed to the consumer, which re-raises it
                buffer.put(ThreadFailure(error))

        thread = threading.Thread(target=produce, name="conveyor-worker-reader", daemon=True)
        thread.start()
        try:
            while True:
                entry = buffer.get(thread)
                if entry is END:
                    return
                if isinstance(entry, ThreadFailure):
                    raise entry.error
                yield entry
        finally:
            buffer.close()
            os.write(wake_writer, b"x")
            thread.join(_JOIN_TIMEOUT_S)
            os.close(wake_reader)
            os.close(wake_writer)

    # --- state ---------------------------------------------------------------------------

    def _current_state(self) -> dict[str, Any]:
        return {
            "workers": list(self._worker_states),
            "merge": {
                "turn": self._turn,
                "last_lane": self._last_lane,
                "bounds": [list(b) if b is not None else None for b in self._bounds],
                "ended": [bool(self._done_mask >> i & 1) for i in range(self._pool.num_workers)],
            },
        }

    def _check_state(self, state: Mapping[str, Any]) -> None:
        require_keys(state, {"workers": list, "merge": Mapping}, repr(self))
        if len(state["workers"]) != self._pool.num_workers:
            raise StateError(f"{self!r}: expected {self._pool.num_workers} worker states")
        check_merge_state(state["merge"], self._pool.num_workers, f"{self!r} merge")

    def __repr__(self) -> str:
        return f"WorkerReader(num_workers={self._pool.num_workers}, in_order={self._in_order})"
