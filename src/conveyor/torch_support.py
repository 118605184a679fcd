"""Optional torch: import it only where a feature needs it, with an error that says what to install.

``import conveyor`` never imports torch. Features built on torch call :func:`require_torch`
when they are used (not when they are imported), so their names can be exported from the
core package and still fail clearly on a machine without torch.
"""

from __future__ import annotations

import sys
from types import ModuleType

from conveyor.errors import MissingDependencyError

INSTALL_HINT = "pip install 'conveyor[torch]'"


def require_torch(feature: str) -> ModuleType:
    """The ``torch`` module, or :class:`MissingDependencyError` naming ``feature`` and the extra."""
    try:
        import torch
    except ImportError as err:
        raise MissingDependencyError(f"{feature} needs torch, which is not installed: {INSTALL_HINT}") from err
    return torch


def loaded_torch() -> ModuleType | None:
    """``torch`` if this process has imported it already, else None (never imports it).

    An object can only be a torch tensor or dataset once torch is imported, so type checks
    against torch classes can skip the (slow) import when it has not happened.
    """
    return sys.modules.get("torch")
