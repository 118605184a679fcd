"""Adapters: whole-graph changes a user asks for when building a ``DataLoader2``."""

from __future__ import annotations

from abc import ABC, abstractmethod

from conveyor.graph import list_dps
from conveyor.pipes.base import DataPipe


class Adapter(ABC):
    """Takes the user's graph and returns the graph to load (changed in place or new)."""

    @abstractmethod
    def __call__(self, datapipe: DataPipe) -> DataPipe: ...


class Shuffle(Adapter):
    """Turns every shuffle in the graph on (``enable=True``) or off, e.g. for evaluation."""

    def __init__(self, enable: bool = True):
        self.enable = bool(enable)

    def __call__(self, datapipe: DataPipe) -> DataPipe:
        for node in list_dps(datapipe):
            set_shuffle = getattr(node, "set_shuffle", None)
            if callable(set_shuffle):
                set_shuffle(self.enable)
        return datapipe

    def __repr__(self) -> str:
        return f"Shuffle(enable={self.enable})"
