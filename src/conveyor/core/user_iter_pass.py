"""Passes over pipes that implement ``__iter__`` themselves, written the torch way: a
user's op iterates its input inside its own ``__iter__``. :class:`UserIterPass` opens the
inputs' passes and binds them (:data:`conveyor.core.passes.BINDINGS`), so the pipe's ``iter(self.source)``
gets the pass the enclosing tree opened and its state stays part of the tree's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from conveyor.core.passes import BINDINGS, Pass, PassContext, PipeToOpen, Position, State
from conveyor.errors import ResumeError


class UserIterPass(Pass):
    """A pass over a pipe that implements ``__iter__`` itself (a user's op, written as for
    torchdata). Its inputs' passes are opened here and handed to the pipe's own
    ``iter(self.source)`` calls; its state is theirs plus the items it yielded
    (``{"inputs": [...], "yielded": n}``). An op resumes from its inputs' states, exactly
    when it treats items one by one and keeps nothing between them; a source (no input)
    resumes by replaying: a fresh ``__iter__`` past the ``n`` items it had yielded, when
    the pipe is :attr:`~conveyor.core.base.IterDataPipe.replayable`. A torch datapipe in
    the graph (:mod:`conveyor.core.foreign`) replays too, with its inputs reopened where
    its pass began (their states then, in its state): it may keep items between inputs.
    """

    def __init__(self, pipe: PipeToOpen, state: State | None, context: PassContext) -> None:
        super().__init__(pipe, context)
        upstream = pipe._state_inputs("inputs")
        saved = state["inputs"] if state is not None else [None] * len(upstream)
        self._inputs = [context.open(p, s) for p, s in zip(upstream, saved, strict=True)]
        for opened in self._inputs:
            if not getattr(opened.pipe, "foreign", False):  # a torch datapipe reads its own input itself
                BINDINGS.bind(opened)
        if pipe.pass_type is not None:  # a subclass of an op: its __iter__ may call the op's
            BINDINGS.bind_context(pipe, context)
        self.count = state["yielded"] if state is not None else 0
        # A torch datapipe in the graph may keep items between inputs (a shuffle): it is
        # replayed from where its pass began, past the items it had yielded.
        self._replays = not self._inputs or getattr(pipe, "foreign", False)
        self._began = [opened.state() for opened in self._inputs] if self._replays else None
        replay = self.count if self._replays else 0
        if replay and not pipe.replayable:
            raise ResumeError(
                f"{pipe!r} is a source that does not replay (replayable = False), so a state taken after its "
                f"item {replay} cannot be resumed; resume from a state taken between epochs"
            )
        self.items = self._run(replay)

    def _run(self, replay: int) -> Iterator[Any]:
        items = type(self.pipe).__iter__(self.pipe)
        for skipped in range(replay):
            try:
                next(items)
            except StopIteration:
                raise ResumeError(
                    f"{self.pipe!r} yielded {skipped} items when replayed to resume after its item {replay}: "
                    "a source that implements __iter__ itself must yield the same items each time "
                    "(or set replayable = False)"
                ) from None
        for item in items:
            self.count += 1
            yield item

    def yielded(self) -> int:
        return self.count

    def state(self) -> State:
        began = self._began
        return {
            "inputs": began if began is not None else [opened.state() for opened in self._inputs],
            "yielded": self.count,
        }

    def position(self) -> Position | None:
        return self._inputs[0].position() if self._inputs else None

    def inputs(self) -> list[Pass]:
        return list(self._inputs)

    def close(self) -> None:
        for opened in self._inputs:
            BINDINGS.discard(opened)
        super().close()
