"""The state of a ``conveyor.DataLoader``: its schema, its checks, and the RNG draws an
epoch begins with.

A state is plain JSON-safe data::

    {"format": "conveyor.DataLoader", "version": 4, "num_workers": n,
     "epoch": <the inner DataLoader2's state of the epoch in progress> | None,
     "sampler": {"rng": <the RNG state the epoch's order was drawn from>, "yielded": k} | None,
     "base_seed": <the epoch's base seed> | None,
     "end": {"epoch": ..., "sampler": ..., "base_seed": ...} | None,
     "generator": <the loader's generator's state> | None,
     "sampler_generator": <the sampler's own generator's state> | None,
     "rng": <torch's global RNG state> | None,
     "rng_at_save": <a digest of torch's global RNG at state_dict(), mid-epoch> | None}

``epoch``/``sampler``/``base_seed`` say where the epoch in progress stands (``sampler`` is
topology-free: it resumes on any worker count). Between epochs, ``end`` is where the last
epoch ended, kept when the dataset's own state outlives the epoch (persistent workers, or
the main process): a resume replays that end, which reads nothing but sets each copy of
the dataset as it stood, and then begins the next epoch, as the uninterrupted loader
would. ``rng`` is torch's global RNG as it stood at ``state_dict()`` between epochs, when
the next epoch draws from it (its base seed without a ``generator``; a sampler without a
generator of its own): the resumed loader draws that epoch from it. ``rng_at_save`` says
where that RNG stood when a mid-epoch state was taken, for an epoch that drew from it: a
resumed epoch replays its start's draws unless the RNG stands there again (a trainer
that restores RNG states has those draws behind it already). Version 2 had no
``rng_at_save``; version 3 also added the sampler part's ``distributed`` record and an
elastic epoch's ``keys`` (:mod:`conveyor.torch_compat.elastic`). Version 4 writes RNG states
compressed (:func:`~conveyor.pipes.torch.sampler_source.encode_rng`); a version 3 state's plain
base64 is read as it is.
"""

from __future__ import annotations

from typing import Any

from conveyor.core.torch_support import require_torch
from conveyor.core.validation import check_plain_data, require_keys
from conveyor.errors import StateError
from conveyor.pipes.torch.sampler_source import decode_rng, encode_rng, same_rng

STATE_FORMAT = "conveyor.DataLoader"
STATE_VERSION = 4

_EPOCH_FIELDS = {"epoch": dict, "sampler": (dict, type(None)), "base_seed": int}


def check_state(state: Any) -> dict[str, Any]:
    """``state`` read as the current version; :class:`StateError` unless it has the shape
    of a DataLoader state."""
    check_plain_data(state, "DataLoader state")
    if type(state) is dict and state.get("version") == 2 and "rng_at_save" not in state:
        state = {**state, "version": 3, "rng_at_save": None}  # version 2: not noted
    if type(state) is dict and state.get("version") == 3:
        state = {**state, "version": STATE_VERSION}  # version 3: RNG states as plain base64, still read
    require_keys(
        state,
        {
            "format": str,
            "version": int,
            "num_workers": int,
            "epoch": (dict, type(None)),
            "sampler": (dict, type(None)),
            "base_seed": (int, type(None)),
            "end": (dict, type(None)),
            "generator": (str, type(None)),
            "sampler_generator": (str, type(None)),
            "rng": (str, type(None)),
            "rng_at_save": (str, type(None)),
        },
        "DataLoader state",
    )
    if state["format"] != STATE_FORMAT or state["version"] != STATE_VERSION:
        raise StateError(
            f"DataLoader state: expected format {STATE_FORMAT!r} version {STATE_VERSION}, "
            f"got {state['format']!r} version {state['version']}"
        )
    if (state["epoch"] is not None or state["sampler"] is not None) and state["base_seed"] is None:
        raise StateError("DataLoader state: an epoch in progress needs its 'base_seed'")
    if state["epoch"] is None and state["sampler"] is not None and "keys" not in state["sampler"]:
        raise StateError("DataLoader state: a 'sampler' position without an epoch in progress needs its 'keys'")
    if state["epoch"] is not None and state["end"] is not None:
        raise StateError("DataLoader state: 'end' (where the last epoch ended) is kept between epochs only")
    if state["end"] is not None:
        require_keys(state["end"], _EPOCH_FIELDS, "DataLoader state: 'end'")
    for key in ("generator", "sampler_generator", "rng"):
        if state[key] is not None:
            _check_rng_text(state[key], f"DataLoader state: {key!r}")
    return state


def _check_rng_text(text: str, where: str) -> None:
    try:
        decode_rng(text)
    except ValueError:
        raise StateError(f"{where} must be the text of a torch RNG state (base64)") from None


def draws_from_global_rng(generator: Any, sampler: Any, own: Any) -> bool:
    """Whether an epoch's first draws (the base seed from ``generator``, a map-style
    ``sampler``'s order, drawn from ``own``, its :func:`sampler_generator`) come from
    torch's global RNG."""
    if generator is None:
        return True
    if sampler is None or own is not None:
        return False
    torch = require_torch("conveyor.DataLoader")
    inner = getattr(sampler, "sampler", sampler)  # a BatchSampler's sampler
    return not isinstance(inner, torch.utils.data.SequentialSampler)


def global_rng_text() -> str:
    return encode_rng(require_torch("conveyor.DataLoader").get_rng_state())


def borrowed_rng(saved: str | None) -> Any:
    """A ``torch.Generator`` at ``saved`` to draw an epoch from in place of torch's global
    RNG, or None to draw from the global RNG itself: when nothing was saved, or when it
    stands at ``saved`` already (the user restored it), so that it advances as the
    uninterrupted loader's did."""
    if saved is None or same_rng(saved, require_torch("conveyor.DataLoader").get_rng_state()):
        return None
    generator = require_torch("conveyor.DataLoader").Generator()
    generator.set_state(decode_rng(saved))
    return generator


def draw_base_seed(generator: Any) -> int:
    """torch's draw of an epoch's base seed (from ``generator``, else the global RNG)."""
    torch = require_torch("conveyor.DataLoader")
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def redraw_epoch_start(generator: Any, sampler: Any) -> None:
    """Draw from torch's global RNG what the interrupted epoch drew from it as it began
    (its base seed; torch's ``RandomSampler`` without a generator, its order's seed),
    and drop it: the resumed epoch keeps the state's, but the global RNG advances as it
    did, so the epochs after it draw what the uninterrupted loader's drew when the
    caller seeds the same way. (A dataset whose state is restored in this process may
    set the RNG again as its epoch opens.)"""
    if generator is None:
        draw_base_seed(None)
    inner = getattr(sampler, "sampler", sampler)  # a BatchSampler's sampler
    random_sampler = require_torch("conveyor.DataLoader").utils.data.RandomSampler
    if type(inner) is random_sampler and inner.generator is None:
        draw_base_seed(None)  # RandomSampler's own draw of its order's seed
