"""Adapters: whole-graph changes a user asks for when building a ``DataLoader2``."""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod

from conveyor.core.base import DataPipe
from conveyor.core.graph import list_dps


class Adapter(ABC):
    """Takes the user's graph and returns the graph to load (changed in place or new)."""

    @abstractmethod
    def __call__(self, datapipe: DataPipe) -> DataPipe: ...


class Shuffle(Adapter):
    """Turns every shuffle in the graph on or off, as torchdata's adapter does.

    ``enable=True`` turns them all on, and when the graph has none, warns and appends a
    ``shuffle()`` (default buffer) at its end; ``False`` turns them all off (e.g. for
    evaluation); ``None`` leaves the graph as it is.

    Args:
        enable: True: turn every shuffle on (appending one if the graph has none); False: off; None:
            leave the graph as it is.
    """

    def __init__(self, enable: bool | None = True):
        self.enable = None if enable is None else bool(enable)

    def __call__(self, datapipe: DataPipe) -> DataPipe:
        if self.enable is None:
            return datapipe
        shufflers = [node for node in list_dps(datapipe) if callable(getattr(node, "set_shuffle", None))]
        if not shufflers and self.enable:
            warnings.warn(
                f"Shuffle(True) was given, but the graph ending in {type(datapipe).__name__} has no shuffle: "
                "appending one at its end with the default buffer size, which may be too small for your "
                "data; add .shuffle(buffer_size=...) where it belongs to choose",
                UserWarning,
                stacklevel=3,
            )
            return datapipe.shuffle()  # type: ignore[attr-defined]
        for node in shufflers:
            node.set_shuffle(self.enable)  # type: ignore[attr-defined]
        return datapipe

    def __repr__(self) -> str:
        return f"Shuffle(enable={self.enable})"
