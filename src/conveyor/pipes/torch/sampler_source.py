"""``SamplerSource``: the keys a torch sampler (or batch sampler) yields, as a resumable
source pipe.

Two kinds of sampler resume differently.

* A *stateful* one keeps its own position, torchdata's way: its iterator (torchdata's
  ``RandomSampler``, ``BatchSampler``) or the sampler itself (``StatefulDistributedSampler``)
  has ``state_dict()``/``load_state_dict()``, and after loading a state the iteration goes
  on from there. A pass's state is ``{"sampler": <that state, as plain data>,
  "yielded": n}``, taken after each key; a resume loads it and reads on.
* Any other draws its order when its iteration begins: from its own ``generator`` (found
  on it, or on the sampler it wraps, as ``BatchSampler`` wraps one), else from torch's
  global RNG. A pass records that RNG's state right before the first key, so its state is
  ``{"rng": ..., "yielded": n}``; a resume sets the RNG back, draws the same order and
  skips the ``n`` keys already handed out. If the global RNG stands at that state when
  the resumed pass begins (a dataset's state set it back, say), the order is drawn from
  it, which advances it as the interrupted epoch's draw did; otherwise it is borrowed for
  the draw and the user's global RNG is set back as it was.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import re
import zlib
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from conveyor.core.base import IterDataPipe
from conveyor.core.passes import Pass, PassContext, State
from conveyor.core.pickling import copy_sharing
from conveyor.core.plain_state import decode, encode, keeps_state
from conveyor.core.torch_support import require_torch
from conveyor.core.validation import require_keys, require_non_negative
from conveyor.errors import StateError


def sampler_generator(sampler: Any) -> Any:
    """The ``torch.Generator`` a sampler draws from (on it or on a sampler or batch sampler
    it wraps), or None when it draws from torch's global RNG."""
    seen: set[int] = set()
    while sampler is not None and id(sampler) not in seen:
        seen.add(id(sampler))
        generator = getattr(sampler, "generator", None)
        if generator is not None:
            return generator
        # A batch sampler wraps a sampler; a sharding one (Accelerate's) wraps a batch sampler.
        inner = getattr(sampler, "sampler", None)
        sampler = inner if inner is not None else getattr(sampler, "batch_sampler", None)
    return None


_PACKED = "shuffled-zlib:"  # ':' is no base64 character: texts without it are plain base64
_LANES = 8


def encode_rng(state: Any) -> str:
    """A torch RNG state (a ``uint8`` tensor) as text: ``"shuffled-zlib:"`` and the base64
    of its bytes regrouped by their place in each 8-byte word, then zlib-compressed. A CPU
    generator's words are 32-bit values in 64-bit slots, so the regrouped high bytes are
    long zero runs, and a loader's state carries two such states at every step. The same
    state gives the same text."""
    return _encode_bytes(state.numpy().tobytes())


@functools.lru_cache(maxsize=8)
def _encode_bytes(raw: bytes) -> str:
    # A generator's state changes only when it draws, mostly once an epoch: a state taken
    # at every step encodes it once.
    whole = len(raw) // _LANES * _LANES
    lanes = np.frombuffer(raw, np.uint8, whole).reshape(-1, _LANES).T.tobytes() + raw[whole:]
    return _PACKED + base64.b64encode(zlib.compress(lanes, 1)).decode("ascii")


def rng_bytes(text: str) -> bytes:
    """The bytes of an RNG state written by :func:`encode_rng` (or as plain base64, as
    version 3 states hold them); ValueError when ``text`` is neither."""
    try:
        if not text.startswith(_PACKED):
            return base64.b64decode(text.encode("ascii"), validate=True)
        lanes = zlib.decompress(base64.b64decode(text[len(_PACKED) :].encode("ascii"), validate=True))
    except (zlib.error, ValueError, AttributeError) as error:  # binascii.Error and UnicodeEncodeError are ValueErrors
        raise ValueError(f"not the text of a torch RNG state: {error}") from None
    whole = len(lanes) // _LANES * _LANES
    return np.frombuffer(lanes, np.uint8, whole).reshape(_LANES, -1).T.tobytes() + lanes[whole:]


def decode_rng(text: str) -> Any:
    torch = require_torch("resuming a sampler")
    return torch.frombuffer(bytearray(rng_bytes(text)), dtype=torch.uint8)


def same_rng(text: str, state: Any) -> bool:
    """Whether ``text`` holds the RNG state ``state`` (a ``uint8`` tensor), however it
    was written."""
    return rng_bytes(text) == state.numpy().tobytes()


def epoch_origin(sampler: Any) -> dict[str, Any]:
    """What an iteration of ``sampler`` starting now draws its order from: its generator's
    state, or torch's global RNG's, as text (``{"rng": ...}``, what a
    :class:`EpochStart` begins from). A fresh iteration draws the same order from
    it whether or not the sampler keeps a position of its own."""
    torch = require_torch("SamplerSource")
    generator = sampler_generator(sampler)
    return {"rng": encode_rng(generator.get_state() if generator is not None else torch.get_rng_state())}


_DIGEST = re.compile(r"[0-9a-f]{32}")


@functools.lru_cache(maxsize=8)
def origin_digest(rng: str) -> str:
    """A short name for an RNG state's text (what per-key states hold); an epoch asks for
    the same one at every key, so the last few are kept."""
    return hashlib.sha256(rng.encode("ascii")).hexdigest()[:32]


def _check_rng_text(rng: Any, where: str) -> None:
    try:
        rng_bytes(rng)
    except ValueError:
        raise StateError(f"{where}: 'rng' must be base64 text of a torch RNG state") from None


class EpochStart:
    """Where the next pass of a :class:`SamplerSource` begins, set by the loader that owns
    it before each epoch: ``None`` (afresh), or ``{"rng": <the RNG state the epoch's
    order was drawn from, in full>, "yielded": keys to skip}``. ``conveyor.DataLoader``
    keeps that RNG state in its own state, once; the passes' states hold its digest, so
    what travels with every key stays small."""

    def __init__(self) -> None:
        self.value: dict[str, Any] | None = None

    def set(self, start: Mapping[str, Any] | None) -> None:
        if start is not None:
            fields: dict[str, Any] = {"rng": str, "yielded": int}
            if "keys" in start:  # an elastic epoch's own keys, read in place of the sampler's
                fields["keys"] = list
            require_keys(start, fields, "the start of a sampler's epoch")
            require_non_negative(start, "yielded", "the start of a sampler's epoch")
            _check_rng_text(start["rng"], "the start of a sampler's epoch")
        self.value = dict(start) if start is not None else None


class SamplerSourcePass(Pass):
    def __init__(self, pipe: SamplerSource, state: State | None, context: PassContext):
        super().__init__(pipe, context)
        self.count = 0
        start = pipe.start.value if pipe.start is not None else None
        if state is None or (state["rng"] is None and state["sampler"] is None):
            # Not begun (its origin is noted at the first key): where a loader resuming an
            # epoch begins it, if it says so, else afresh.
            state = None if start is None else {**start, "rng": origin_digest(start["rng"]), "sampler": None}
        self._resumed: State | None = state
        self._skip = 0  # keys to draw again and drop (samplers that keep no state)
        self._rng: str | None = None  # the origin's RNG state, in full (states hold its digest)
        if state is not None and state["rng"] is not None:
            if start is None or origin_digest(start["rng"]) != state["rng"]:
                raise StateError(
                    f"{pipe!r}: this state names the RNG state its epoch drew from by digest; resume it "
                    "through conveyor.DataLoader's state, which keeps that RNG state"
                )
            self._rng = start["rng"]
        self._keeper: Any = None  # what keeps the position: the iterator or the sampler
        # An epoch resumed on another number of ranks reads the keys it was given.
        self._keys: list[Any] | None = start.get("keys") if start is not None else None
        self.items = self._read(pipe.sampler)

    def _read(self, sampler: Any) -> Iterator[Any]:
        keys = self._open(sampler)
        skip = self._skip
        for _ in range(skip):
            if next(keys, _END) is _END:
                raise StateError(f"{self.pipe!r}: the sampler yielded {self.count} keys, fewer than the {skip} to skip")
            self.count += 1
        for key in keys:
            self.count += 1
            yield key

    def _open(self, sampler: Any) -> Iterator[Any]:
        """The sampler's iterator, positioned where the pass starts. Called at the first
        ``next()``, as the sampler would draw its order then."""
        resumed = self._resumed
        if resumed is not None:
            self.count = resumed["yielded"]
        if resumed is not None and resumed["sampler"] is not None:  # it keeps its own position
            saved = resumed["sampler"]
            if keeps_state(sampler):
                sampler.load_state_dict(decode(saved, repr(sampler)))
                self._keeper = sampler
                return iter(sampler)
            keys = iter(sampler)
            if not keeps_state(keys):
                raise StateError(f"{self.pipe!r}: the state holds the sampler's own position, but it keeps none now")
            keys.load_state_dict(decode(saved, repr(keys)))
            self._keeper = keys
            return keys
        if self._keys is not None:
            self._skip = resumed["yielded"] if resumed is not None else 0
            self.count = 0
            return iter(self._keys)
        torch = require_torch("SamplerSource")
        generator = sampler_generator(sampler)
        if resumed is None:
            self._rng = epoch_origin(sampler)["rng"]
            keys = iter(sampler)
        else:
            self._skip = resumed["yielded"]
            self.count = 0
            rng = decode_rng(self._rng)  # type: ignore[arg-type]
            if generator is not None:
                generator.set_state(rng)
                keys = iter(sampler)
            elif same_rng(self._rng, torch.get_rng_state()):  # type: ignore[arg-type]
                # The global RNG stands where the epoch drew its order (the dataset's state
                # just set it back, say): draw from it, as the interrupted epoch did.
                keys = _Primed(iter(sampler))
            else:  # the order comes from the global RNG: borrow it for the draw, then give it back
                users = torch.get_rng_state()
                torch.set_rng_state(rng)
                try:
                    keys = _Primed(iter(sampler))
                finally:
                    torch.set_rng_state(users)
        if keeps_state(sampler) or keeps_state(keys):
            self._keeper = sampler if keeps_state(sampler) else keys
            self._rng = None
        return keys

    def state(self) -> State:
        if self._keeper is not None:
            return {
                "rng": None,
                "sampler": encode(self._keeper.state_dict(), repr(self._keeper)),
                "yielded": self.count,
            }
        if self._rng is None:  # not begun: the RNG is noted at its first key
            return {"rng": None, "sampler": None, "yielded": 0}
        return {"rng": origin_digest(self._rng), "sampler": None, "yielded": max(self.count, self._skip)}

    def yielded(self) -> int:
        return self.count


class _Primed:
    """An iterator whose first item was drawn when it was made (inside a borrowed RNG)."""

    def __init__(self, keys: Iterator[Any]) -> None:
        self._keys = keys
        self._first = next(keys, _END)

    def __iter__(self) -> _Primed:
        return self

    def __next__(self) -> Any:
        first, self._first = self._first, _TAKEN
        if first is _TAKEN:
            return next(self._keys)
        if first is _END:
            raise StopIteration
        return first


_END = object()
_TAKEN = object()


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

    def __init__(self, sampler: Any, start: EpochStart | None = None) -> None:
        self.sampler = sampler
        #: Where the next pass begins (``None``: always afresh); its loader sets it before
        #: each epoch, and the copies of the graph in the loader's process share it.
        self.start = start

    def __len__(self) -> int:
        return len(self.sampler)

    def __deepcopy__(self, memo: dict[int, Any]) -> SamplerSource:
        # A loader's own copy of the graph reads the user's sampler itself: its generator
        # must advance as under torch, and only the main process reads it.
        return copy_sharing(self, memo, {"sampler", "start"})

    def check_own_state(self, state: Mapping[str, Any], where: str) -> None:
        rng = state["rng"]
        if rng is not None and state["sampler"] is not None:
            raise StateError(f"{where}: a state holds the sampler's RNG or its own position, not both")
        if rng is None and state["sampler"] is None and state["yielded"]:
            raise StateError(f"{where}: 'yielded' must be 0 before the sampler's first key")
        if rng is not None and not _DIGEST.fullmatch(rng):
            raise StateError(f"{where}: 'rng' must be the digest of an RNG state (32 hex digits)")
