"""Optional torch: import it only where a feature needs it, with an error that says what to install.

``import conveyor`` never imports torch. Features built on torch call :func:`require_torch`
when they are used (not when they are imported), so their names can be exported from the
core package and still fail clearly on a machine without torch.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

from conveyor.errors import MissingDependencyError

INSTALL_HINT = "pip install 'conveyor[torch]'"


def require_torch(feature: str) -> ModuleType:
    """The ``torch`` module, or :class:`MissingDependencyError` naming ``feature`` and the extra."""
    try:
        import torch
    except ImportError as err:
        raise MissingDependencyError(f"{feature} needs torch, which is not installed: {INSTALL_HINT}") from err
    _register_pending(torch)
    return torch


#: conveyor's pipe classes waiting to be registered with torch, with the name of the torch
#: class each becomes a virtual subclass of (``IterDataPipe`` or ``MapDataPipe``).
_pending: list[tuple[type, str]] = []


def register_iterable_dataset(cls: type, torch_class: str = "IterDataPipe") -> None:
    """Make ``cls`` a virtual subclass of ``torch.utils.data.<torch_class>`` (an ABC;
    ``IterDataPipe`` is an ``IterableDataset``, ``MapDataPipe`` a ``Dataset``), so torch's
    ``DataLoader`` and its graph tools (``graph_settings.apply_sharding``, ``traverse_dps``)
    take conveyor's pipes as they take torch's: now if torch is imported, else when conveyor
    itself imports it. torch stays an optional dependency. When torch comes after conveyor,
    the first pipe made after it registers (:func:`register_pending`)."""
    _pending.append((cls, torch_class))
    register_pending()


def register_pending() -> None:
    """Register the classes still waiting, if torch has been imported meanwhile (by
    anyone). Pipes call it when they are made, so a pipe made after ``import torch`` is a
    torch datapipe whatever the order of the imports; costs a list check once done."""
    if _pending:
        torch = loaded_torch()
        if torch is not None:
            _register_pending(torch)


def _torch_data(torch: ModuleType) -> ModuleType | None:
    """``torch.utils.data``, or None while torch is still being imported (it comes later)."""
    return getattr(getattr(torch, "utils", None), "data", None)


def _register_pending(torch: ModuleType) -> None:
    data = _torch_data(torch)
    if data is None or not hasattr(data, "MapDataPipe"):
        return
    while _pending:
        cls, torch_class = _pending.pop()
        getattr(data, torch_class).register(cls)


def torch_pickling_hook(kind: str, hook: str) -> Any:
    """The hook torch's graph traversal has set on its ``IterDataPipe`` or ``MapDataPipe``
    class (``kind``) while it pickles a graph to find each node's inputs
    (``"reduce_ex_hook"`` or ``"getstate_hook"``), else None; never imports torch.

    ``torch.utils.data.graph.traverse_dps`` finds a node's inputs by pickling it with
    these hooks set: conveyor's pipes call them as torch's do, so torch's graph tools walk
    conveyor graphs (and ``graph_settings.apply_sharding`` reaches their sharding points).
    """
    module = sys.modules.get("torch.utils.data.datapipes.datapipe")
    if module is None:
        return None
    return getattr(getattr(module, kind, None), hook, None)


def torch_worker_info() -> object | None:
    """torch's ``get_worker_info()`` (``id``, ``num_workers``, ``seed``) inside a worker of
    torch's ``DataLoader``, else None; never imports torch."""
    torch = loaded_torch()
    data = _torch_data(torch) if torch is not None else None
    return data.get_worker_info() if data is not None else None


def loaded_torch() -> ModuleType | None:
    """``torch`` if this process has imported it already, else None (never imports it).

    An object can only be a torch tensor or dataset once torch is imported, so type checks
    against torch classes can skip the (slow) import when it has not happened.
    """
    return sys.modules.get("torch")


def is_torch_datapipe(value: Any) -> bool:
    """Whether ``value`` is a torch ``IterDataPipe`` or ``MapDataPipe`` (conveyor's pipes are
    too, once registered); never imports torch."""
    module = sys.modules.get("torch.utils.data.datapipes.datapipe")
    return module is not None and isinstance(value, (module.IterDataPipe, module.MapDataPipe))


def is_torch_iter_datapipe(value: Any) -> bool:
    """Whether ``value`` is a torch ``IterDataPipe``; never imports torch."""
    module = sys.modules.get("torch.utils.data.datapipes.datapipe")
    return module is not None and isinstance(value, module.IterDataPipe)
