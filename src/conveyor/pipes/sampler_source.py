"""``SamplerSource``: the keys a torch sampler (or batch sampler) yields, as a resumable
source pipe.

A sampler draws its order when its iteration begins: from its own ``generator`` (found
on it, or on the sampler it wraps, as ``BatchSampler`` wraps one), else from torch's
global RNG. A pass records that RNG's state right before the sampler's first key, so
its state is ``{"rng": <that state>, "yielded": n}``; a resume sets the RNG back to it,
draws the same order and skips the ``n`` keys already handed out. The user's global RNG
is set back as it was once the order is drawn.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Iterator, Mapping
from typing import Any

from conveyor.errors import StateError
from conveyor.pipes.base import IterDataPipe
from conveyor.pipes.passes import Pass, PassContext, State
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


class SamplerSourcePass(Pass):
    def __init__(self, pipe: SamplerSource, state: State | None, context: PassContext):
        super().__init__(pipe, context)
        self.count = 0
        if state is None:
            state = pipe.start  # where a loader resuming on another worker count begins
        self._skip = state["yielded"] if state is not None else 0
        self._rng: str | None = state["rng"] if state is not None else None
        self.items = self._read(pipe.sampler)

    def _read(self, sampler: Any) -> Iterator[Any]:
        torch = require_torch("SamplerSource")
        generator = sampler_generator(sampler)
        keys = iter(sampler)
        if self._rng is None:  # a fresh epoch: note where the order is drawn from
            self._rng = encode_rng(generator.get_state() if generator is not None else torch.get_rng_state())
            first = next(keys, _END)
        elif generator is not None:
            generator.set_state(decode_rng(self._rng))
            first = next(keys, _END)
        else:  # the order comes from the global RNG: borrow it for the draw, then give it back
            users = torch.get_rng_state()
            torch.set_rng_state(decode_rng(self._rng))
            try:
                first = next(keys, _END)
            finally:
                torch.set_rng_state(users)
        skip = self._skip
        if first is _END:
            if skip:
                raise StateError(f"{self.pipe!r}: the sampler yielded no keys, fewer than the {skip} to skip")
            return
        if skip == 0:
            self.count = 1
            yield first
        else:
            self.count = 1
            for _ in range(skip - 1):
                if next(keys, _END) is _END:
                    raise StateError(
                        f"{self.pipe!r}: the sampler yielded {self.count} keys, fewer than the {skip} to skip"
                    )
                self.count += 1
        for key in keys:
            self.count += 1
            yield key

    def state(self) -> State:
        return {"rng": self._rng, "yielded": max(self.count, self._skip)}

    def yielded(self) -> int:
        return max(0, self.count - self._skip)


_END = object()


class SamplerSource(IterDataPipe):
    """The keys of ``sampler`` (indices, or lists of them from a batch sampler), one pass
    per iteration of the sampler; resumable mid-epoch (see the module)."""

    pass_type = SamplerSourcePass
    state_fields = {"rng": (str, type(None)), "yielded": int}
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
