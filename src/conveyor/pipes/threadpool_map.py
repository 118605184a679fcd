"""``threadpool_map``: ``map`` with the function running in a pool of threads, for
functions that wait (object storage, HTTP, disk) or release the GIL.

Up to ``scheduled_tasks`` items are in the pool at once; results come out in the input's
order. Each item is submitted with its input's state and position right after it, so the
op's state is the one behind the last result it *yielded*: a resume submits the items
that were in flight again. It is per item, so the output does not depend on the number of
workers either.

The threads are daemon threads owned by the pass: closing the pass (the epoch ends, is
abandoned or fails) stops them without waiting for a call stuck in the user's function,
which ends on its own and touches nothing shared; the interpreter never waits for them.
"""

from __future__ import annotations

import collections
import os
import queue
import threading
from collections.abc import Callable, Hashable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar, overload

from conveyor.core.base import IterDataPipe
from conveyor.core.passes import Pass, PassContext, Position, State
from conveyor.core.skips import key_of, note_error
from conveyor.core.validation import check_int
from conveyor.core.worker_info import carried
from conveyor.errors import ConveyorError
from conveyor.pipes import columns

S = TypeVar("S")
T = TypeVar("T")


class _Threads:
    """``count`` daemon threads running submitted calls, started as the first calls come."""

    def __init__(self, count: int, name: str) -> None:
        self._count, self._name = count, name
        self._tasks: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._closed = False

    def submit(self, call: Callable[[], Any]) -> Future[Any]:
        future: Future[Any] = Future()
        self._tasks.put((future, call))
        if len(self._threads) < self._count:
            thread = threading.Thread(
                target=carried(self._serve), name=f"{self._name}-{len(self._threads)}", daemon=True
            )
            self._threads.append(thread)
            thread.start()
        return future

    def _serve(self) -> None:
        while (task := self._tasks.get()) is not None:
            future, call = task
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = call()
            except BaseException as error:  # handed to the consumer, which raises it
                future.set_exception(error)
            else:
                future.set_result(result)

    def close(self) -> None:
        """Stop every thread once its current call returns; calls not begun are dropped."""
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._tasks.put(None)


class ThreadPoolMapperPass(Pass):
    def __init__(self, pipe: ThreadPoolMapper, state: State | None, context: PassContext):
        super().__init__(pipe, context)
        self.source = context.open(pipe.source, state["source"] if state is not None else None)
        self._behind = self.source.state()  # the input's state after the last item yielded
        self._position: Position | None = None
        self.count = 0
        workers = min(pipe.max_workers or _default_workers(), pipe.scheduled_tasks)
        self._threads = _Threads(workers, "conveyor-threadpool-map")
        self._in_flight: collections.deque[tuple[Future[Any], State, Position | None]] = collections.deque()
        self.items = self._map(pipe)

    def _map(self, pipe: ThreadPoolMapper) -> Iterator[Any]:
        fn, input_col, output_col = pipe.fn, pipe.input_col, pipe.output_col
        source, in_flight, limit = self.source, self._in_flight, pipe.scheduled_tasks

        def call(item: Any) -> Callable[[], Any]:
            if input_col is None:
                return lambda: fn(item)
            return lambda: columns.apply(fn, item, input_col, output_col)

        items = source.items
        exhausted = False
        skips, rounds = self.context.skips, self.context.rounds
        known = skips.known_for(pipe) if skips else None
        try:
            while True:
                while not exhausted and len(in_flight) < limit:
                    item = next(items, _END)
                    if item is _END:
                        exhausted = True
                        break
                    state, position = source.state(), source.position()
                    if known and key_of(rounds, position, state) in known:
                        continue  # recorded as skipped before a resume: not called again
                    in_flight.append((self._threads.submit(call(item)), state, position))
                if not in_flight:
                    return
                future, behind, position = in_flight.popleft()
                try:
                    result = future.result()
                except Exception as err:
                    note_error(err, pipe)
                    if skips is None or isinstance(err, ConveyorError):
                        raise
                    skips.skip_at(err, pipe, key_of(rounds, position, behind), position)
                    continue
                self._behind, self._position = behind, position
                self.count += 1
                yield result
                del result, future  # the future holds the result too (see mapper.MapperPass)
        finally:  # ended, failed or closed: calls not begun are dropped, the threads stop
            self._stop()

    def state(self) -> State:
        return {"source": self._behind}

    def position(self) -> Position | None:
        return self._position

    def yielded(self) -> int:
        return self.count

    def inputs(self) -> list[Pass]:
        return [self.source]

    def _stop(self) -> None:
        for future, _, _ in self._in_flight:
            future.cancel()
        self._in_flight.clear()
        self._threads.close()

    def close(self) -> None:
        self._stop()  # also when the pass closes before its generator began
        super().close()


_END = object()


class ThreadPoolMapper(IterDataPipe):
    """Yields ``fn(item)`` in the input's order, computed by ``max_workers`` threads with
    up to ``scheduled_tasks`` items in flight (torchdata's arguments; ``input_col`` and
    ``output_col`` as ``map``'s). For functions that wait or release the GIL; errors
    from ``fn`` carry a note naming this pipe and raise in the input's order."""

    per_item = True
    keeps_order = True
    runs_threads = True
    pass_type = ThreadPoolMapperPass
    state_fields = {"source": dict}
    _params = ("fn", "input_col", "output_col", "scheduled_tasks", "max_workers")

    def __init__(
        self,
        source: IterDataPipe,
        fn: Callable[..., Any],
        input_col: columns.Column = None,
        output_col: columns.Column = None,
        scheduled_tasks: int = 128,
        max_workers: int | None = None,
    ):
        if not callable(fn):
            raise TypeError(f"threadpool_map() needs a callable, got {type(fn).__name__}")
        check_int("scheduled_tasks", scheduled_tasks, 1)
        check_int("max_workers", max_workers, 1, allow_none=True)
        self.source = source
        self.fn = fn
        self.input_col = input_col
        self.output_col = columns.check_columns(input_col, output_col)
        self.scheduled_tasks = scheduled_tasks
        self.max_workers = max_workers  # None: concurrent.futures' default, at most scheduled_tasks

    def __len__(self) -> int:
        return len(self.source)


@overload
def threadpool_map(
    self: IterDataPipe[T],
    fn: Callable[[T], S],
    input_col: None = None,
    output_col: None = None,
    scheduled_tasks: int = 128,
    max_workers: int | None = None,
) -> IterDataPipe[S]: ...
@overload
def threadpool_map(
    self: IterDataPipe[Any],
    fn: Callable[..., Any],
    input_col: Hashable | Sequence[Hashable] | None,
    output_col: Hashable | Sequence[Hashable] | None = None,
    scheduled_tasks: int = 128,
    max_workers: int | None = None,
) -> IterDataPipe[Any]: ...
@IterDataPipe.register_functional("threadpool_map", builds=ThreadPoolMapper)
def threadpool_map(
    self: IterDataPipe[Any],
    fn: Callable[..., Any],
    input_col: Hashable | Sequence[Hashable] | None = None,
    output_col: Hashable | Sequence[Hashable] | None = None,
    scheduled_tasks: int = 128,
    max_workers: int | None = None,
) -> IterDataPipe[Any]:
    """Applies ``fn`` to each item in a pool of threads, yielding the results in order.

    For functions that wait (object storage, HTTP, disk) or release the GIL. An error
    from ``fn`` carries a note naming this pipe, and is raised in the items' order.

    Args:
        fn: Called with each item (or its ``input_col``); what it returns is the new item.
        input_col: As ``map``'s.
        output_col: As ``map``'s.
        scheduled_tasks: How many items may be in the pool at once.
        max_workers: How many threads; None: as ``concurrent.futures`` picks.

    Returns:
        A pipe of the results, in the items' order.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> list(IterableWrapper(range(4)).threadpool_map(lambda x: x * 10, max_workers=2))
        [0, 10, 20, 30]
    """
    return ThreadPoolMapper(self, fn, input_col, output_col, scheduled_tasks, max_workers)


def _default_workers() -> int:
    """``concurrent.futures.ThreadPoolExecutor``'s default thread count (per pass, so a
    state does not depend on the machine that saved it)."""
    return min(32, (os.cpu_count() or 1) + 4)
