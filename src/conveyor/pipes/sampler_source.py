"""``SamplerSource``: the keys a torch sampler (or batch sampler) yields, as a resumable
source pipe.

A sampler draws its order when its iteration begins: from its own ``generator`` (found
on it, or on the sampler it wraps, as ``BatchSampler`` wraps one), else from torch's
global RNG; a stateful sampler (torchdata's, with ``state_dict()``) also from its own
state. A pass records both right before the sampler's first key, so its state is
``{"rng": ..., "sampler": ..., "yielded": n}``; a resume sets them back, draws the same
order and skips the ``n`` keys already handed out. The user's global RNG is set back as
it was once the order is drawn.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Iterator, Mapping
from typing import Any

from conveyor.errors import StateError
from conveyor.pipes.base import IterDataPipe
from conveyor.pipes.passes import Pass, PassContext, State
from conveyor.plain_state import decode, encode
from conveyor.torch_support import require_torch


def sampler_generator(sampler: Any) -> Any:
    """The ``torch.Generator`` a sampler draws from (on it or on a sampler it wraps), or
    None when it draws from torch's global RNG."""
    seen: set[int] = set()
    while sampler is not None and id(sampler) not in seen:
        seen.add(id(sampler))
        generator = getattr(sampler, "generator", None)
        if generator is not None:
            return generator
        sampler = getattr(sampler, "sampler", None)
    return None


def encode_rng(state: Any) -> str:
    """A torch RNG state (a ``uint8`` tensor) as text."""
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def decode_rng(text: str) -> Any:
    torch = require_torch("resuming a sampler")
    raw = base64.b64decode(text.encode("ascii"), validate=True)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


def stateful_sampler(sampler: Any) -> Any:
    """The first object on the chain ``sampler``, ``sampler.sampler``, ... that keeps its
    own state (``state_dict()``/``load_state_dict()``, torchdata's stateful samplers), or None."""
    seen: set[int] = set()
    while sampler is not None and id(sampler) not in seen:
        seen.add(id(sampler))
        if callable(getattr(sampler, "state_dict", None)) and callable(getattr(sampler, "load_state_dict", None)):
            return sampler
        sampler = getattr(sampler, "sampler", None)
    return None


def epoch_origin(sampler: Any) -> dict[str, Any]:
    """What an iteration of ``sampler`` starting now draws its order from: the state of
    its RNG (its generator, or torch's global one) and, for a stateful sampler, its own
    state, as plain data."""
    torch = require_torch("SamplerSource")
    generator = sampler_generator(sampler)
    stateful = stateful_sampler(sampler)
    return {
        "rng": encode_rng(generator.get_state() if generator is not None else torch.get_rng_state()),
        "sampler": encode(stateful.state_dict(), repr(stateful)) if stateful is not None else None,
    }


class SamplerSourcePass(Pass):
    def __init__(self, pipe: SamplerSource, state: State | None, context: PassContext):
        super().__init__(pipe, context)
        self.count = 0
        if state is None:
            state = pipe.start  # where a loader resuming on another worker count begins
        self._skip = state["yielded"] if state is not None else 0
        self._origin: dict[str, Any] | None = (
            {"rng": state["rng"], "sampler": state["sampler"]}
            if state is not None and state["rng"] is not None
            else None
        )
        self.items = self._read(pipe.sampler)

    def _read(self, sampler: Any) -> Iterator[Any]:
        first, keys = self._first(sampler)
        skip = self._skip
        if first is _END:
            if skip:
                raise StateError(f"{self.pipe!r}: the sampler yielded no keys, fewer than the {skip} to skip")
            return
        self.count = 1
        if skip == 0:
            yield first
        else:
            for _ in range(skip - 1):
                if next(keys, _END) is _END:
                    raise StateError(
                        f"{self.pipe!r}: the sampler yielded {self.count} keys, fewer than the {skip} to skip"
                    )
                self.count += 1
        for key in keys:
            self.count += 1
            yield key

    def _first(self, sampler: Any) -> tuple[Any, Iterator[Any]]:
        """The sampler's first key and its iterator: a fresh epoch notes where its order is
        drawn from; a resumed one draws it from there again (the user's global RNG is given
        back afterwards)."""
        if self._origin is None:
            self._origin = epoch_origin(sampler)
            keys = iter(sampler)
            return next(keys, _END), keys
        torch = require_torch("SamplerSource")
        generator = sampler_generator(sampler)
        stateful = stateful_sampler(sampler)
        if stateful is not None and self._origin["sampler"] is not None:
            stateful.load_state_dict(decode(self._origin["sampler"], repr(stateful)))
        rng = decode_rng(self._origin["rng"])
        if generator is not None:
            generator.set_state(rng)
            keys = iter(sampler)
            return next(keys, _END), keys
        users = torch.get_rng_state()
        torch.set_rng_state(rng)
        try:
            keys = iter(sampler)
            return next(keys, _END), keys
        finally:
            torch.set_rng_state(users)

    def state(self) -> State:
        origin = self._origin or {"rng": None, "sampler": None}
        return {"rng": origin["rng"], "sampler": origin["sampler"], "yielded": max(self.count, self._skip)}

    def yielded(self) -> int:
        return max(0, self.count - self._skip)


_END = object()


class SamplerSource(IterDataPipe):
    """The keys of ``sampler`` (indices, or lists of them from a batch sampler), one pass
    per iteration of the sampler; resumable mid-epoch (see the module)."""

    pass_type = SamplerSourcePass
    state_fields = {
        "rng": (str, type(None)),
        "sampler": (dict, list, str, int, float, bool, type(None)),
        "yielded": int,
    }
    _params = ("sampler",)

    def __init__(self, sampler: Any, start: Mapping[str, Any] | None = None) -> None:
        self.sampler = sampler
        #: A state to begin fresh passes from (``None``: the sampler's start): how
        #: ``conveyor.DataLoader`` resumes an epoch on another number of workers.
        self.start = dict(start) if start is not None else None
        if start is not None:
            self.check_state(self.start)

    def __len__(self) -> int:
        return len(self.sampler)

    def __deepcopy__(self, memo: dict[int, Any]) -> SamplerSource:
        # A loader's own copy of the graph reads the user's sampler itself: its generator
        # must advance as under torch, and only the main process reads it.
        clone = object.__new__(type(self))
        memo[id(self)] = clone
        for name, value in self.__dict__.items():
            if name not in self._runtime:
                clone.__dict__[name] = value if name == "sampler" else copy.deepcopy(value, memo)
        return clone

    def check_own_state(self, state: Mapping[str, Any], where: str) -> None:
        rng = state["rng"]
        if rng is not None:
            try:
                base64.b64decode(rng.encode("ascii"), validate=True)
            except (ValueError, UnicodeEncodeError):
                raise StateError(f"{where}: 'rng' must be base64 text of a torch RNG state") from None
