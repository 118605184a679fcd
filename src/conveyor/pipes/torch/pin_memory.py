"""``pin_memory``: copy tensors into page-locked memory so host-to-GPU copies can be async.

Pinning belongs to the process that feeds the GPU, so the op is not replicable: a
multiprocessing reading service keeps it (and what follows it) in the main process,
after the merge of the workers' outputs. Without torch, or without CUDA, it passes items
through unchanged; it never fails on an item it cannot pin.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from conveyor.core.base import IterDataPipe
from conveyor.core.passes import PassContext, State, ThroughPass
from conveyor.core.torch_support import loaded_torch

T = TypeVar("T")


class PinMemoryPass(ThroughPass):
    def __init__(self, pipe: PinMemory, state: State | None, context: PassContext):
        super().__init__(pipe, state, context)
        self.items = self._pin(pipe)

    def _pin(self, pipe: PinMemory) -> Iterator[Any]:
        pin = _pinner(pipe.device)
        if pin is None:
            yield from self.source
            return
        warned = False
        for item in self.source:
            try:
                pinned = pin(item)
            except Exception as err:
                if not warned:
                    warned = True
                    warnings.warn(
                        f"{pipe!r}: cannot pin an item ({type(err).__name__}: {err}); passing items unpinned",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                pinned = item
            yield pinned


class PinMemory(IterDataPipe):
    """Pins the tensors of each item (inside dicts, lists, tuples and namedtuples too) with
    torch's own pin-memory routine; other values are left as they are.

    A pass-through when torch is not loaded or ``torch.cuda.is_available()`` is False.
    If pinning an item fails (no usable device, an object whose ``pin_memory`` is not
    torch's), the item passes unpinned and one warning says why: pinning only speeds up
    copies, the data is the same either way.

    Args:
        source: The pipe whose items are pinned.
        device: the device to pin for (``None``: the current accelerator), as in torch.
    """

    per_item = True
    keeps_order = True
    replicable = False
    pass_type = PinMemoryPass
    state_fields = {"source": dict}

    _params = ("device",)

    def __init__(self, source: IterDataPipe, device: Any = None):
        if device is not None and not isinstance(device, str) and type(device).__name__ != "device":
            raise TypeError(f"pin_memory() takes a device name, a torch.device or None, got {type(device).__name__}")
        self.source = source
        self.device = device

    def __len__(self) -> int:
        return len(self.source)


@IterDataPipe.register_functional("pin_memory", builds=PinMemory)
def pin_memory(self: IterDataPipe[T], device: Any = None) -> IterDataPipe[T]:
    """Pins the tensors of each item (in dicts, lists, tuples too), for faster copies to a GPU.

    It passes items unchanged when torch is not loaded or no accelerator is available,
    and runs in the main process (it is not replicated into workers).

    Args:
        device: The device to pin for, as torch takes it; None: the current accelerator.

    Returns:
        A pipe of the same items, their tensors pinned.

    Example:
        >>> from conveyor.pipes import IterableWrapper
        >>> list(IterableWrapper([1, 2]).pin_memory())
        [1, 2]
    """
    return PinMemory(self, device)


def _pinner(device: Any) -> Callable[[Any], Any] | None:
    """The function that pins one item, or None when pinning cannot apply in this process."""
    torch = loaded_torch()
    if torch is None or not torch.cuda.is_available():
        return None
    from torch.utils.data._utils.pin_memory import pin_memory

    def pin(item: Any) -> Any:
        return pin_memory(item, device)

    return pin
