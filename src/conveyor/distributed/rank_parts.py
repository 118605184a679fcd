"""Every rank's part of a loader state, in the one state each rank returns.

Trainers keep one copy of the loader's state: Lightning and Accelerate write global rank
0's, and ``torch.distributed.checkpoint`` keeps one copy of an entry that every rank
saves under the same key. A state that held only the calling rank's position would then
resume every rank from rank 0's, replaying rank 0's data everywhere. So in a
``torch.distributed`` job (of any size: one rank too, so that a job of one rank reads and
writes the shape a job of several does), a loader's ``state_dict()`` gathers every rank's
part and returns them all, the same on each rank::

    {"format": "conveyor.ranks", "version": 1, "world_size": W,
     "parts": [<rank 0's state as JSON text> | None, ..., <rank W-1's> | None]}

Each part is the state the loader would return alone, as JSON text: so the envelope has
one shape wherever the loader stands (``torch.distributed.checkpoint`` builds its load
template from a fresh loader's state and reads exactly the keys it finds there), and it
is still plain JSON. ``load_state_dict`` picks the loading rank's part; a part that is
missing (``None``) or a rank the state does not cover is a
:class:`~conveyor.errors.StateError`, never another rank's data.

The gather goes through the default process group's key-value store, which every wait
can bound: each rank writes its part under ``conveyor.state/<job>/<call>/<rank>`` and waits
for the others'. A rank that calls ``state_dict()`` alone (``if rank == 0: save(...)``) gets
its own part back after the timeout, with the others ``None`` and a warning that says how
to get them; it does not try again in that process, since its calls no longer pair with
the other ranks'.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import warnings
from typing import Any

from conveyor.core.validation import MAX_CHARS, check_plain_data, require_keys
from conveyor.errors import StateError

ENVELOPE_FORMAT = "conveyor.ranks"
ENVELOPE_VERSION = 1
#: How long a rank's ``state_dict()`` waits for the other ranks' parts by default.
DEFAULT_TIMEOUT_S = 30.0
_KEY = "conveyor.state"
_MAX_RANKS = 1 << 16

_calls = 0  # gathers begun in this process: the n-th call on each rank pairs with the n-th on the others
_unpaired = False  # a gather timed out: the calls no longer pair, so none is tried again


def world() -> tuple[int, int] | None:
    """``(rank, world_size)`` of the ``torch.distributed`` job this process is in (one rank
    included: a job resumed on one rank must read the same shape of state a job of several
    wrote); ``None`` outside one (torch is never imported for this)."""
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist.get_rank(), dist.get_world_size()


def is_envelope(state: Any) -> bool:
    return type(state) is dict and state.get("format") == ENVELOPE_FORMAT


def gather(part: dict[str, Any], who: str, timeout: float | None = None) -> dict[str, Any]:
    """``part`` (this rank's state) as a state holding every rank's part when this
    process is a rank of a ``torch.distributed`` job (one rank too), else ``part`` itself. ``who`` names the loader in
    warnings; ``timeout`` bounds the wait for the other ranks (seconds)."""
    place = world()
    if place is None:
        return part
    rank, size = place
    parts: list[str | None] = [None] * size
    parts[rank] = json.dumps(part, separators=(",", ":"))
    global _calls, _unpaired
    if size > 1 and not _unpaired:
        _calls += 1
        try:
            _exchange(parts, rank, _calls, timeout if timeout is not None else DEFAULT_TIMEOUT_S)
        except _Unanswered as missing:
            _unpaired = True
            warnings.warn(
                f"{who}.state_dict() on rank {rank}: rank(s) {missing.ranks} did not send their part within "
                f"{missing.timeout:g}s, so this state holds rank {rank}'s part alone and only rank {rank} can "
                "resume from it. Call state_dict() on every rank at the same step (each rank's call gathers "
                "every rank's part; save the result on one rank), as Lightning, Accelerate and "
                "torch.distributed.checkpoint do.",
                RuntimeWarning,
                stacklevel=3,
            )  # _exchange fills the others' parts only once all have come: they stay None
    return {"format": ENVELOPE_FORMAT, "version": ENVELOPE_VERSION, "world_size": size, "parts": parts}


class _Unanswered(Exception):
    def __init__(self, ranks: list[int], timeout: float) -> None:
        super().__init__(ranks, timeout)
        self.ranks, self.timeout = ranks, timeout


def _exchange(parts: list[str | None], rank: int, call: int, timeout: float) -> None:
    """Fill ``parts`` with the other ranks' parts of this call, through the store."""
    from torch.distributed import distributed_c10d

    store = distributed_c10d._get_default_store()
    # torchrun keeps its store across a job's restarts: keys name the incarnation too.
    incarnation = f"{os.environ.get('TORCHELASTIC_RUN_ID', '')}.{os.environ.get('TORCHELASTIC_RESTART_COUNT', '')}"
    prefix = f"{_KEY}/{incarnation}/{call}"
    own = parts[rank]
    assert own is not None  # this rank's part is in before the exchange
    store.set(f"{prefix}/{rank}", own)
    others = [other for other in range(len(parts)) if other != rank]
    try:
        store.wait([f"{prefix}/{other}" for other in others], datetime.timedelta(seconds=timeout))
    except RuntimeError as error:  # the store's timeout (DistStoreError is a RuntimeError)
        missing = [other for other in others if not store.check([f"{prefix}/{other}"])]
        if not missing:
            raise
        raise _Unanswered(missing, timeout) from error
    for other in others:
        parts[other] = store.get(f"{prefix}/{other}").decode("utf-8")
    if call > 1:
        # Every rank has written this call's part, so every rank has read the last call's.
        store.delete_key(f"{_KEY}/{incarnation}/{call - 1}/{rank}")


def own_part(state: Any, who: str, merge: Any = None) -> Any:
    """The state this rank loads from ``state``: ``state`` itself unless it holds every
    rank's part (:func:`gather`), else this rank's part. On another world size,
    ``merge(parts)`` (when given) makes one state every rank of the new job loads; without
    it that is a :class:`StateError`, as is a part the state does not hold."""
    if not is_envelope(state):
        return state
    where = f"{who} state"
    _check_envelope(state, where)
    saved = state["world_size"]
    parts = state["parts"]
    place = world()
    rank, size = place if place is not None else (0, 1)
    if size != saved:
        present = [index for index, part in enumerate(parts) if part is not None]
        if merge is None or len(present) != saved:
            held = "every rank's part" if len(present) == saved else f"the parts of rank(s) {present} only"
            raise StateError(
                f"{where}: saved by {saved} ranks, loaded on rank {rank} of {size}; it holds {held}, and this "
                "loader resumes on another world size only from every rank's part through a "
                "DistributedReadingService (elastic resume): resume it with the same world size"
            )
        return merge([_decode(parts[index], index, where) for index in present])
    if parts[rank] is None:
        present = [index for index, part in enumerate(parts) if part is not None]
        raise StateError(
            f"{where}: it holds no part for rank {rank} (only rank(s) {present}): it was saved by calling "
            f"state_dict() on those ranks alone, and resuming rank {rank} from another rank's part would replay "
            "that rank's data; save a state that every rank's state_dict() call made at the same step"
        )
    return _decode(parts[rank], rank, where)


def _check_envelope(state: dict[str, Any], where: str) -> None:
    """Raise :class:`StateError` unless ``state`` is a well-formed envelope of rank parts."""
    fields = {"format": str, "version": int, "world_size": int, "parts": list}
    require_keys(state, fields, where)
    if state["version"] != ENVELOPE_VERSION:
        raise StateError(f"{where}: ranks' envelope version {state['version']} is not {ENVELOPE_VERSION}")
    saved, parts = state["world_size"], state["parts"]
    if not 1 <= saved <= _MAX_RANKS or len(parts) != saved:
        raise StateError(f"{where}: 'parts' must hold world_size={saved} entries (1 to {_MAX_RANKS})")
    for rank, part in enumerate(parts):
        if part is not None and type(part) is not str:
            raise StateError(f"{where}: rank {rank}'s part must be JSON text or null")
        if part is not None and len(part) > MAX_CHARS:
            raise StateError(f"{where}: rank {rank}'s part is over {MAX_CHARS} characters")


def _decode(text: str, rank: int, where: str) -> Any:
    try:
        part = json.loads(text)
    except (ValueError, RecursionError):
        raise StateError(f"{where}: rank {rank}'s part is not JSON text") from None
    check_plain_data(part, f"{where}: rank {rank}'s part")
    return part


def each_part(states: list[Any]) -> list[Any]:
    """``states`` with each state that holds every rank's part replaced by the parts it
    holds; a part that several such states hold (each rank's copy holds them all) is kept
    once. Plain states stay as they are, duplicates included, for the merge to judge."""
    parts: list[Any] = []
    seen: set[str] = set()
    for index, state in enumerate(states):
        if not is_envelope(state):
            parts.append(state)
            continue
        where = f"state {index}"
        _check_envelope(state, where)
        for rank, text in enumerate(state["parts"]):
            if text is not None and text not in seen:
                seen.add(text)
                parts.append(_decode(text, rank, where))
    return parts


def warn_if_longer(who: str, steps: int, usual: int) -> None:
    """Warn when an epoch resumed on another world size needs ``steps`` (counting those
    its old ranks took before the checkpoint), more than the ``usual`` an epoch has on
    this world size: a trainer that fixes an epoch's steps from ``len()`` before it loads
    the state, as Lightning does, would end this one early and leave items unread."""
    if steps > usual:
        warnings.warn(
            f"{who}: this epoch, resumed on another world size, takes {steps} steps counting those taken "
            f"before the checkpoint, more than the {usual} of an epoch on this world size; a trainer that "
            "fixes an epoch's steps from len() before loading the state (Lightning does) ends it early and "
            "leaves items unread: under Lightning, conveyor.LightningResume (in every Trainer, unless "
            "Lightning's entry points are not read) prevents it; elsewhere, run the epoch until the "
            "loader stops rather than for a count of steps",
            RuntimeWarning,
            stacklevel=3,
        )
