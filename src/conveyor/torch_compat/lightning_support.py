"""A Lightning callback for what a resume needs that Lightning does not do on its own.

Two gaps in how Lightning (2.x) resumes a train loader, each a silent wrong resume:

1. **The state that is never handed back.** Lightning gives the loader its saved state
   only when its progress counters say an epoch was under way. A run resumed from a
   checkpoint of an epoch's last step never counts the next epoch as started, so a
   checkpoint saved later in that epoch says no epoch was under way: resumed from it,
   Lightning keeps the loader's state to itself, and the loader reads the epoch again
   from its start. :class:`LightningResume` hands the loaders the states Lightning left
   unloaded, when training starts; the loader then goes on where it stopped.
2. **The epoch counted before the state is loaded.** Lightning fixes how many steps the
   epoch takes from ``len()`` before it loads the state. A ``DataLoader2`` resumed on more
   processes shares what is left of the epoch by whole positions (a batch made before the
   sharding point is never split), so 2 of 8 steps taken on 2 processes leave 4 more on
   each of 3 processes, where an epoch usually has 5: Lightning would end it after 5 and
   leave the last positions unread. The callback gives Lightning the loader's length again
   once the state is loaded.

Lightning keeps both in private attributes of its fit loop; the callback names the
Lightning version when they are not where it expects them. Installing conveyor registers
the callback with Lightning (its external-callback entry points, :func:`trainer_callbacks`),
so every ``Trainer`` has it without a line of the user's.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any


def _callback_base() -> type:
    """Lightning's ``Callback``, from ``pytorch_lightning`` or else ``lightning.pytorch``
    (both call a callback's hooks by name, so either base serves either trainer)."""
    for name in ("pytorch_lightning", "lightning.pytorch"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        base: type = module.Callback
        return base
    raise ImportError(
        "conveyor.LightningResume is a callback for PyTorch Lightning: install "
        "`pytorch-lightning` (or `lightning`), e.g. `pip install 'conveyor[lightning]'`"
    )


class LightningResume(_callback_base()):  # type: ignore[misc]
    """Resume conveyor's loaders exactly under Lightning: give them the states Lightning
    left unloaded, and an epoch resumed on more processes all the steps it needs.

    Every ``Trainer`` has one (conveyor registers it with Lightning); adding it by hand is
    only needed where entry points are not read. When training starts after a resume, a train
    loader whose saved state Lightning did not hand back (its progress counters said no
    epoch was under way, as after an earlier resume from an epoch's last step) gets it,
    and goes on where it stopped; and when a loader's ``len()`` is then above the steps
    Lightning fixed for the epoch (from ``len()`` before the state was loaded), the epoch
    takes the loader's length. Otherwise nothing changes.

    Example:
        >>> import pytorch_lightning as pl
        >>> from conveyor import LightningResume
        >>> trainer = pl.Trainer(callbacks=[LightningResume()], logger=False, enable_progress_bar=False)
    """

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Hand the train loaders the states Lightning left unloaded, then raise the
        epoch's step count to their lengths.

        Args:
            trainer: the ``Trainer`` that is fitting.
            pl_module: the ``LightningModule`` it fits (unused).
        """
        loop = trainer.fit_loop
        combined = getattr(loop, "_combined_loader", None)
        fetcher = getattr(loop, "_data_fetcher", None)
        iterator = getattr(combined, "_iterator", None)
        if combined is None or fetcher is None or iterator is None or not hasattr(iterator, "limits"):
            warnings.warn(
                f"conveyor.LightningResume: this Lightning ({_lightning_version()}) keeps its loaders' "
                "states and the epoch's step count where the callback does not look; a resume may then "
                "read an epoch again or end it early. Please report it with that version",
                RuntimeWarning,
                stacklevel=2,
            )
            return
        pending = getattr(loop, "_combined_loader_states_to_load", None)
        if pending:  # a checkpoint's loader states that Lightning did not load (see the module)
            combined._load_state_dicts(pending)
            loop._combined_loader_states_to_load = []
            iter(fetcher)  # the loaders' iterators again, from the states now loaded
            iterator = combined._iterator
        if not _limits_are_lengths(trainer.limit_train_batches):
            return  # the user cut the epoch short on purpose: their count stands
        lengths = [_length(loader) for loader in combined.flattened]
        limits = combined.limits or [float("inf")] * len(lengths)
        if all(length is None or length <= limit for length, limit in zip(lengths, limits, strict=True)):
            return
        combined.limits = [
            limit if length is None else max(length, limit) for length, limit in zip(lengths, limits, strict=True)
        ]
        iterator.limits = combined.limits
        loop.max_batches = len(combined)
        fetcher.length = loop.max_batches


def _limits_are_lengths(limit_train_batches: Any) -> bool:
    """Whether Lightning took each loader's whole length as its limit: ``limit_train_batches``
    is the fraction 1.0 (its default), not an int count or a smaller fraction."""
    return limit_train_batches is None or (isinstance(limit_train_batches, float) and limit_train_batches == 1.0)


def trainer_callbacks() -> list[Any]:
    """What Lightning adds to every ``Trainer`` from conveyor's entry points
    (``pytorch_lightning.callbacks_factory`` and ``lightning.pytorch.callbacks_factory`` in
    pyproject.toml): a :class:`LightningResume`. One the user adds too finds nothing left
    to do: the first hands the states back and raises the count."""
    return [LightningResume()]


def _length(loader: Any) -> int | None:
    try:
        return len(loader)
    except TypeError:  # an iterable without a length: Lightning counted it as endless
        return None


def _lightning_version() -> str:
    for name in ("pytorch_lightning", "lightning"):
        try:
            module = __import__(name)
        except ImportError:
            continue
        return f"{name} {getattr(module, '__version__', '?')}"
    return "unknown"
