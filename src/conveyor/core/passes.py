"""Passes: one iteration over a pipe graph, as objects of their own.

A pipe (:class:`~conveyor.core.base.IterDataPipe`) is a description: its arguments and
its inputs. Iterating it opens a *pass* (:class:`Pass`), which owns everything that
changes while items flow: positions, counters, buffers, threads. A pass opens one pass
per input, so passes form a tree shaped like the graph, and each pass's :meth:`Pass.state`
nests its inputs' states under its own: ``{"count": 3, "source": {"index": 7}}``. Two
passes over the same graph share nothing mutable, so an abandoned pass that a thread
still runs cannot disturb a new one, and a graph can be copied, pickled or read by
another thread while a pass runs.

A pass hands out items through :attr:`Pass.items`, a generator: a parent pass iterates
its input's generator directly (``for item in self.source``), which costs what nested
generators cost and no method call per item.

What a pass tree shares is its :class:`PassContext`: the rounds of the ``cycle`` ops
around it (random ops key their draws by them, so every round draws anew and a resumed
round draws what it drew), the passes that several of its passes read (a ``fork``'s hub:
the tree is then a graph of passes, but each such pass is reached through one reader
when the tree is walked), and, when statistics sample stacks, each stage's meter.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol

#: An item's position at the sharding point: the index there, followed by sub-indices
#: added by ops that expand one item into several (``flatmap``, ``unbatch``).
Position = tuple[int, ...]

#: A pass's state: plain JSON data, nested like the graph.
State = dict[str, Any]


class PipeToOpen(Protocol):
    """What a pass asks of the pipe it runs over (an
    :class:`~conveyor.core.base.IterDataPipe`, which builds on this module and so is not
    imported here: passes are the layer below pipes)."""

    @property
    def replayable(self) -> bool: ...

    @property
    def pass_type(self) -> Any: ...

    def _open(self, state: State | None, context: PassContext) -> Pass: ...

    def _state_inputs(self, key: str) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class PipeWithInput(PipeToOpen, Protocol):
    """A pipe with one input, ``source``: what a :class:`ThroughPass` runs over."""

    @property
    def source(self) -> Any: ...


class PassType(Protocol):
    """An op's pass class (:attr:`~conveyor.pipes.base.IterDataPipe.pass_type`): built as
    ``pass_type(pipe, state, context)``, its ``pipe`` the op's own class."""

    def __call__(self, pipe: Any, state: State | None, context: PassContext, /) -> Pass: ...


class Skips(Protocol):
    """What a per-item stage asks of ``DataLoader2(on_error="skip")``:
    :class:`conveyor.core.skips.SkipPolicy` (which builds on :class:`Pass`, so this
    module names only the methods the stages call)."""

    def known_for(self, pipe: Any) -> set[str] | None: ...

    def unseen(self, pipe: Any, source: Pass) -> Iterator[Any] | Pass: ...

    def skip(self, err: BaseException, pipe: Any, source: Pass) -> None: ...

    def skip_at(self, err: BaseException, pipe: Any, key: str, position: Position | None) -> None: ...


#: How a pass sees a torch datapipe in the graph: :func:`conveyor.core.foreign.as_pipe`,
#: which installs itself when :mod:`conveyor.pipes` is imported (so before any pass runs).
#: That view is a pipe, built on this module, so this module cannot import it.
_foreign_view: list[Callable[[Any], Any]] = []


def install_foreign_view(view: Callable[[Any], Any]) -> None:
    """Set how passes and state checks see a torch datapipe among a pipe's inputs."""
    _foreign_view[:] = [view]


def foreign_view(node: Any) -> Any:
    """``node`` (a torch datapipe in a conveyor graph) through conveyor's pipe API."""
    if not _foreign_view:
        raise TypeError(f"{node!r} is not a conveyor pipe, and no view of torch datapipes is installed")
    return _foreign_view[0](node)


class PassContext:
    """What every pass of one tree shares. Its fields do not change (a ``cycle`` derives a
    new context per round); :attr:`shared` is the tree's registry of shared passes.

    ``rounds`` are the rounds of the enclosing ``cycle`` ops, outermost first; ``meters``
    maps ``id(pipe)`` to the stage meter that counts its items (stack-sampling statistics
    only; the loader that meters keeps the pipes, and so their ids, alive).
    """

    __slots__ = ("meters", "retired", "rounds", "shared", "skips", "stats")

    def __init__(
        self,
        rounds: tuple[int, ...] = (),
        meters: dict[int, Any] | None = None,
        retired: dict[int, int] | None = None,
        stats: Any = None,
        shared: dict[tuple[int, tuple[int, ...]], Pass] | None = None,
        skips: Skips | None = None,
    ) -> None:
        self.rounds = rounds
        self.meters = meters
        #: When statistics are collected: items yielded by passes that ended early in the
        #: tree's life (a cycle's earlier rounds), by ``id(pipe)``.
        self.retired = retired
        #: The epoch's statistics (:class:`conveyor.observe.stats.EpochStats`), for a pass that
        #: pulls in a thread of its own (prefetch) and times its pulls there.
        self.stats = stats
        #: Passes that several passes of the tree read (a ``fork``'s hub), by ``(id(pipe),
        #: rounds)``: each round of a ``cycle`` reads its own.
        self.shared = {} if shared is None else shared
        #: ``DataLoader2(on_error="skip")``: what a per-item stage does with an item its
        #: function raised on (:mod:`conveyor.core.skips`); None: the error propagates.
        self.skips = skips

    def with_round(self, round_index: int) -> PassContext:
        """The context for the passes of one round of a ``cycle``."""
        return PassContext((*self.rounds, round_index), self.meters, self.retired, self.stats, self.shared, self.skips)

    def with_skips(self, skips: Skips | None) -> PassContext:
        """This context, with stages dropping the items they fail on per ``skips``."""
        return PassContext(self.rounds, self.meters, self.retired, self.stats, self.shared, skips)

    def shared_pass(self, pipe: PipeToOpen, make: Callable[[], Pass]) -> Pass:
        """The tree's one pass over ``pipe`` that several passes read, made by ``make()``
        the first time it is asked for."""
        key = (id(pipe), self.rounds)
        opened = self.shared.get(key)
        if opened is None:
            opened = self.shared[key] = make()
        return opened

    def retire(self, ended: Pass) -> None:
        """A pass replaced in its tree (a cycle's round, a concat's input): keep its items'
        count for statistics."""
        retired = self.retired
        if retired is None:
            return
        stack = [ended]
        while stack:
            opened = stack.pop()
            retired[id(opened.pipe)] = retired.get(id(opened.pipe), 0) + opened.yielded()
            stack.extend(opened.inputs())

    def open(self, pipe: PipeToOpen, state: State | None) -> Pass:
        """A new pass over ``pipe``, starting from ``state`` (None: from the beginning);
        the pass opened for it by a user-defined pipe's pass, when there is one."""
        bound = BINDINGS.take(pipe)
        if bound is not None:
            return bound
        if not hasattr(pipe, "_open"):  # a torch datapipe inside the graph
            pipe = foreign_view(pipe)
        opened = pipe._open(state, self)
        if self.meters is not None:
            meter = self.meters.get(id(pipe))
            if meter is not None:
                opened._own_items = opened.items
                opened.items = meter.count(opened.items)
        return opened


class Pass:
    """One pass over one pipe. Subclasses set :attr:`items` (a generator) in ``__init__``
    and implement :meth:`state`; the pass updates what it reports *before* yielding each
    item, so a state taken between two items is exact.
    """

    items: Iterator[Any]
    #: The pass's own generator, when a counting wrapper stands in front of it (stack-
    #: sampling statistics).
    _own_items: Iterator[Any] | None = None

    def __init__(self, pipe: PipeToOpen, context: PassContext) -> None:
        self.pipe = pipe
        self.context = context

    def __iter__(self) -> Iterator[Any]:
        return self.items

    def __next__(self) -> Any:
        return next(self.items)

    def state(self) -> State:
        """Where this pass is, right after the last item it yielded, as plain data."""
        raise NotImplementedError(f"{type(self).__name__} must implement state()")

    def position(self) -> Position | None:
        """The position at the sharding point of the item yielded last, if known. Random
        ops after the sharding point key their draws by it."""
        return None

    def yielded(self) -> int:
        """Items this pass has yielded (for statistics: exact, and counted without a cost
        per item where the pass knows it otherwise)."""
        return 0

    def inputs(self) -> list[Pass]:
        """The passes over this pipe's inputs (for walking a pass tree)."""
        return []

    def work_codes(self) -> tuple[Any, ...]:
        """Code objects in which this pass works outside its generator (statistics charge
        time spent in them to its stage)."""
        return ()

    def set_paused(self, paused: bool) -> None:
        """Stop (``True``) or restart background reading ahead, for a pass that does any
        (``prefetch``); the pass still yields when pulled. See :func:`pause_tree`."""

    def close(self) -> None:
        """End the pass now: its generator's ``finally`` blocks run, its inputs close."""
        close = getattr(self.items, "close", None)
        if close is not None:
            close()
        for upstream in self.inputs():
            upstream.close()

    def __repr__(self) -> str:
        return f"<pass over {self.pipe!r}>"


def pause_tree(root: Pass | None, paused: bool) -> None:
    """:meth:`Pass.set_paused` on ``root`` and every pass under it: while paused, nothing in
    the tree reads ahead in the background (``next()`` still works: it reads on demand)."""
    stack = [root] if root is not None else []
    while stack:
        opened = stack.pop()
        opened.set_paused(paused)
        stack.extend(opened.inputs())


class ThroughPass(Pass):
    """A pass with one input, opened from ``state["source"]``; its state is its own part
    (:meth:`own_state`) plus ``"source"``, and positions are its input's."""

    def __init__(self, pipe: PipeWithInput, state: State | None, context: PassContext) -> None:
        super().__init__(pipe, context)
        self.source = context.open(pipe.source, None if state is None else state["source"])

    #: Items dropped for errors under ``DataLoader2(on_error="skip")`` (not yielded).
    skipped = 0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A worker takes the state after every item: a pass with no state of its own
        # (most per-item ops) gives its input's alone, without calling own_state() and
        # merging, which would cost every item of a worker's loop. A subclass's own
        # state() is left as it is.
        if cls.state in _DERIVED_STATES:
            has_own = cls.own_state is not ThroughPass.own_state
            cls.state = ThroughPass.state if has_own else ThroughPass._state_of_source  # type: ignore[method-assign]

    def own_state(self) -> State:
        return {}

    def state(self) -> State:
        return {**self.own_state(), "source": self.source.state()}

    def _state_of_source(self) -> State:
        return {"source": self.source.state()}

    def position(self) -> Position | None:
        return self.source.position()

    def yielded(self) -> int:
        return self.source.yielded() - self.skipped  # one item out per item in, unless the op says otherwise

    def inputs(self) -> list[Pass]:
        return [self.source]


#: The states :class:`ThroughPass` derives from ``own_state()``, as opposed to a subclass's own.
_DERIVED_STATES = (ThroughPass.state, ThroughPass._state_of_source)


# --- pipes that implement __iter__ themselves (their pass: core/user_iter_pass.py) ----


class _Bindings:
    """Input passes waiting for a user-defined pipe's ``iter(self.source)``, by pipe.

    A pipe written the torch way iterates its input inside its own ``__iter__``; that call
    must get the pass the enclosing tree opened for the input (so its state is part of
    the tree's), not a pass of its own. The latest binding of a pipe wins. A subclass of
    an op that extends the op's ``__iter__`` (``super().__iter__()``) gets the op's own
    pass, in the context of the subclass's pass (:meth:`context_for`).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[int, list[Pass]] = {}
        self._contexts: dict[int, PassContext] = {}

    def bind_context(self, pipe: Any, context: PassContext) -> None:
        with self._lock:
            self._contexts[id(pipe)] = context

    def context_for(self, pipe: Any) -> PassContext:
        with self._lock:
            return self._contexts.pop(id(pipe), None) or PassContext()

    def bind(self, opened: Pass) -> None:
        with self._lock:
            self._waiting.setdefault(id(opened.pipe), []).append(opened)

    def take(self, pipe: Any) -> Pass | None:
        with self._lock:
            waiting = self._waiting.get(id(pipe))
            if not waiting:
                return None
            opened = waiting.pop()
            if not waiting:
                del self._waiting[id(pipe)]
            return opened

    def discard(self, opened: Pass) -> None:
        with self._lock:
            waiting = self._waiting.get(id(opened.pipe))
            if waiting and opened in waiting:
                waiting.remove(opened)
                if not waiting:
                    del self._waiting[id(opened.pipe)]


BINDINGS = _Bindings()
