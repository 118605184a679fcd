"""``SampleMultiplexer``: items drawn from several inputs at random, each input as often as
its weight says, until every input has ended (torchdata's op, same arguments).

Each draw comes from a generator keyed by the draw's number (and any enclosing
``cycle``'s round), so a pass draws the same sequence again for the same seed, and a
resume draws what the interrupted pass would have: its state is the inputs' states, the
draws made and which inputs had ended (an ended input leaves the draws, and the weights
of the others are scaled up).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from conveyor.core.base import IterDataPipe
from conveyor.core.op_roles import RandomOp
from conveyor.core.passes import Pass, PassContext, Position, State
from conveyor.core.random import PipeRandomness, SeedGenerator
from conveyor.errors import StateError
from conveyor.pipes.combine import check_inputs


class SampleMultiplexerPass(Pass):
    """``draws``: items drawn so far; ``ended``: the inputs found ended."""

    def __init__(self, pipe: SampleMultiplexer, state: State | None, context: PassContext):
        super().__init__(pipe, context)
        saved = state["sources"] if state is not None else [None] * len(pipe.sources)
        self.sources = [context.open(p, s) for p, s in zip(pipe.sources, saved, strict=True)]
        self.draws = state["draws"] if state is not None else 0
        self.ended = list(state["ended"]) if state is not None else [False] * len(pipe.sources)
        self._start = self.draws
        self._chosen: int | None = None
        self.items = self._sample(pipe.weights, pipe.randomness())

    def _sample(self, weights: tuple[float, ...], randomness: PipeRandomness) -> Iterator[Any]:
        rounds, ended = self.context.rounds, self.ended
        attempt = 0  # draws again for the same item, after finding an input ended
        while not all(ended):
            live = [i for i, gone in enumerate(ended) if not gone]
            total = sum(weights[i] for i in live)
            point = randomness.generator(*rounds, self.draws, attempt).random() * total
            chosen = live[-1]  # float rounding may leave the point past the last bound
            for i in live:
                point -= weights[i]
                if point < 0:
                    chosen = i
                    break
            try:
                item = next(self.sources[chosen].items)
            except StopIteration:
                ended[chosen] = True
                attempt += 1
                continue
            self.draws, self._chosen, attempt = self.draws + 1, chosen, 0
            yield item

    def state(self) -> State:
        return {"draws": self.draws, "ended": list(self.ended), "sources": [s.state() for s in self.sources]}

    def position(self) -> Position | None:
        return None  # which input an item came from depends on the draws, not on a position upstream

    def yielded(self) -> int:
        return self.draws - self._start

    def inputs(self) -> list[Pass]:
        return list(self.sources)


class SampleMultiplexer(IterDataPipe, RandomOp):
    """Items from the inputs (the keys of ``pipes_to_weights_dict``), each draw picking an
    input with probability proportional to its weight among those not ended. With
    ``seed``, every pass draws the same sequence; without, the loader's seeds decide
    (a new sequence each epoch), as for ``shuffle``.

    Args:
        pipes_to_weights_dict: ``{pipe: weight}``: the inputs and their positive weights.
        seed: Draw the same sequence every pass; None: the loader's seeds decide, new each epoch.
    """

    pass_type = SampleMultiplexerPass
    state_fields = {"draws": int, "ended": list, "sources": list}
    _params = ("weights", "seed")

    def __init__(self, pipes_to_weights_dict: Mapping[IterDataPipe, float], seed: int | None = None):
        if not isinstance(pipes_to_weights_dict, Mapping) or not pipes_to_weights_dict:
            raise ValueError("SampleMultiplexer needs a non-empty dict of {pipe: weight}")
        weights = []
        for pipe, weight in pipes_to_weights_dict.items():
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
                raise ValueError(f"SampleMultiplexer: weights must be positive numbers, got {weight!r} for {pipe!r}")
            weights.append(float(weight))
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise TypeError(f"SampleMultiplexer: seed must be an int or None, got {type(seed).__name__}")
        self.sources = check_inputs("SampleMultiplexer", tuple(pipes_to_weights_dict))
        self.weights = tuple(weights)
        self.seed = seed

    def randomness(self) -> PipeRandomness:
        if self.seed is not None:
            return SeedGenerator(self.seed).pipe_randomness(0, keyed_by_position=False)
        return super().randomness()

    def __len__(self) -> int:
        return sum(len(source) for source in self.sources)

    def check_own_state(self, state: Mapping[str, Any], where: str) -> None:
        ended = state["ended"]
        if len(ended) != len(self.sources) or not all(type(flag) is bool for flag in ended):
            raise StateError(f"{where}: 'ended' must be {len(self.sources)} booleans, one per input")
        if state["draws"] < 0:
            raise StateError(f"{where}: 'draws' must be >= 0")
