"""The arguments of :class:`conveyor.DataLoader`, checked and completed as torch's
``DataLoader`` does: the same ``ValueError`` for the same bad combination, the same
default samplers (torch's own classes), the same collate function.
"""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass
from typing import Any

from conveyor.core.torch_support import require_torch


@dataclass(frozen=True)
class LoaderArguments:
    """What a loader reads and how, once checked.

    ``iterable``: the dataset is an ``IterableDataset`` (each worker iterates it);
    otherwise ``index_source`` is what yields the dataset's keys (a batch sampler when
    batching automatically, else the sampler) and ``auto_collation`` says whether each
    of its items is a list of keys.
    """

    dataset: Any
    iterable: bool
    batch_size: int | None
    drop_last: bool
    sampler: Any
    batch_sampler: Any
    collate_fn: Any
    num_workers: int
    prefetch_factor: int | None
    timeout: float

    @property
    def auto_collation(self) -> bool:
        return self.batch_sampler is not None

    @property
    def index_source(self) -> Any:
        return self.batch_sampler if self.batch_sampler is not None else self.sampler


def resolve(
    dataset: Any,
    batch_size: int | None,
    shuffle: bool | None,
    sampler: Any,
    batch_sampler: Any,
    num_workers: int,
    collate_fn: Any,
    drop_last: bool,
    timeout: float,
    generator: Any,
    prefetch_factor: int | None,
    persistent_workers: bool,
) -> LoaderArguments:
    """Check the arguments in the order torch checks them and fill in its defaults."""
    torch = require_torch("conveyor.DataLoader")
    data = torch.utils.data
    if num_workers < 0:
        raise ValueError("num_workers option should be non-negative; use num_workers=0 to disable multiprocessing.")
    if timeout < 0:
        raise ValueError("timeout option should be non-negative")
    if num_workers == 0 and prefetch_factor is not None:
        raise ValueError(
            "prefetch_factor option could only be specified in multiprocessing: let num_workers > 0 "
            "to enable multiprocessing, otherwise set prefetch_factor to None."
        )
    if num_workers > 0 and prefetch_factor is None:
        prefetch_factor = 2
    elif prefetch_factor is not None and prefetch_factor < 0:
        raise ValueError("prefetch_factor option should be non-negative")
    if persistent_workers and num_workers == 0:
        raise ValueError("persistent_workers option needs num_workers > 0")

    iterable = isinstance(dataset, data.IterableDataset)
    if iterable:
        # A key has no meaning for a stream: samplers do not apply (torch's rule). A
        # datapipe graph takes shuffle as torch gives it: its shuffles turned on or off.
        if isinstance(dataset, data.IterDataPipe):
            if shuffle is not None:
                dataset = data.graph_settings.apply_shuffle_settings(dataset, shuffle=shuffle)
        elif shuffle not in {False, None}:
            raise ValueError(
                f"DataLoader with IterableDataset: expected unspecified shuffle option, but got shuffle={shuffle}"
            )
        if sampler is not None:
            raise ValueError(
                f"DataLoader with IterableDataset: expected unspecified sampler option, but got sampler={sampler}"
            )
        if batch_sampler is not None:
            raise ValueError(
                "DataLoader with IterableDataset: expected unspecified batch_sampler option, "
                f"but got batch_sampler={batch_sampler}"
            )
    else:
        shuffle = bool(shuffle)
    if sampler is not None and shuffle:
        raise ValueError("sampler option is mutually exclusive with shuffle")
    if batch_sampler is not None:
        if batch_size != 1 or shuffle or sampler is not None or drop_last:
            raise ValueError(
                "batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and drop_last"
            )
        batch_size, drop_last = None, False
    elif batch_size is None and drop_last:
        raise ValueError("batch_size=None option disables auto-batching and is mutually exclusive with drop_last")

    if not iterable:
        if sampler is None:
            sampler = data.RandomSampler(dataset, generator=generator) if shuffle else data.SequentialSampler(dataset)
        if batch_size is not None and batch_sampler is None:
            batch_sampler = data.BatchSampler(sampler, batch_size, drop_last)
    auto_collation = batch_sampler is not None or (iterable and batch_size is not None)
    if collate_fn is None:
        collate = data._utils.collate
        collate_fn = collate.default_collate if auto_collation else collate.default_convert
    return LoaderArguments(
        dataset=dataset,
        iterable=iterable,
        batch_size=batch_size,
        drop_last=drop_last,
        sampler=sampler,
        batch_sampler=batch_sampler,
        collate_fn=collate_fn,
        num_workers=num_workers,
        prefetch_factor=prefetch_factor,
        timeout=timeout,
    )


def start_method(context: Any) -> str | None:
    """A start method's name for torch's ``multiprocessing_context`` (a name or a context)."""
    if context is None or isinstance(context, str):
        return context
    if isinstance(context, multiprocessing.context.BaseContext):
        return context.get_start_method()
    raise TypeError(
        "multiprocessing_context option should specify a valid start method in "
        f"{multiprocessing.get_all_start_methods()!r}, or be a multiprocessing context object, but got {context!r}"
    )
