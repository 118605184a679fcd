"""A Lightning callback that lets an epoch resumed on more processes run to its end.

Lightning fixes how many steps the training epoch takes from ``len()`` of the train
loader *before* it hands the loader the checkpoint's state. An epoch saved on N
processes and resumed on more can need more steps than an epoch usually has there: a
``DataLoader2`` shares what is left of the epoch by whole positions (a batch made before
the sharding point is never split), so 2 of 8 steps taken on 2 processes leave 12
positions, 4 more steps on each of 3 processes where an epoch usually has 5. The loader's
``len()`` says so once the state is loaded (and it warns when it loads it); Lightning
would still end the epoch after 5 steps and leave the last positions unread.
:class:`ResumedEpochLength` gives Lightning the loader's length again when training
starts, after the state is loaded, so the resumed epoch runs to its end. Other epochs,
and runs that do not resume, are not touched.

Lightning keeps that count in four places of its fit loop, none of them public; the
callback names the Lightning version when they are not where it expects them.
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
        "conveyor.ResumedEpochLength is a callback for PyTorch Lightning: install "
        "`pytorch-lightning` (or `lightning`), e.g. `pip install 'conveyor[lightning]'`"
    )


class ResumedEpochLength(_callback_base()):  # type: ignore[misc]
    """Let a training epoch resumed on more processes take all the steps it needs.

    Add it to the ``Trainer``'s callbacks when a job may resume on more processes than it
    saved on. When training starts after a resume and the train loader's ``len()`` is
    above the steps Lightning fixed for the epoch (from ``len()`` before the state was
    loaded), the epoch takes the loader's length instead; otherwise nothing changes.

    Example:
        >>> import pytorch_lightning as pl
        >>> from conveyor import ResumedEpochLength
        >>> trainer = pl.Trainer(callbacks=[ResumedEpochLength()], logger=False, enable_progress_bar=False)
    """

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Raise the epoch's step count to the train loaders' lengths, after the resume.

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
                f"conveyor.ResumedEpochLength: this Lightning ({_lightning_version()}) keeps the epoch's "
                "step count where the callback does not look; a resumed epoch that needs more steps than "
                "an epoch usually has here may end early. Please report it with that version",
                RuntimeWarning,
                stacklevel=2,
            )
            return
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
