"""conveyor: composable, deterministic, exactly resumable data loading for PyTorch.

Build a graph of pipes (:mod:`conveyor.pipes`), hand it to a :class:`DataLoader2` with a
reading service, seed it, iterate, save ``state_dict()`` and resume exactly.
"""

from typing import Any

from conveyor import pipes
from conveyor.core.loader_schema import READING_SERVICE_STATE_KEY_NAME, SERIALIZED_DATAPIPE_KEY_NAME
from conveyor.core.plain_state import Stateful
from conveyor.core.random import SeedGenerator
from conveyor.core.shared_arrays import shared_empty, shared_empty_like
from conveyor.core.worker_info import WorkerInfo, get_worker_info
from conveyor.errors import PauseIteration, PrefetchTimeoutError
from conveyor.loader.adapters import Adapter, Shuffle
from conveyor.loader.dataloader2 import DataLoader2, DataLoader2Iterator
from conveyor.reading_service import (
    CheckpointableReadingServiceInterface,
    DistributedReadingService,
    InProcessReadingService,
    MultiProcessingReadingService,
    PrototypeMultiProcessingReadingService,
    ReadingServiceInterface,
    SequentialReadingService,
    TorchDataLoaderReadingService,
)

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # conveyor.DataLoader is a subclass of torch's DataLoader (trainers recognise it as
    # one), so it needs torch: imported on first use, the core stays numpy-only.
    if name == "DataLoader":
        from conveyor.torch_compat.dataloader import DataLoader

        return DataLoader
    if name == "LightningResume":  # a Lightning callback: imports Lightning
        from conveyor.torch_compat.lightning_support import LightningResume

        return LightningResume
    raise AttributeError(f"module 'conveyor' has no attribute {name!r}")


__all__ = [
    "READING_SERVICE_STATE_KEY_NAME",
    "SERIALIZED_DATAPIPE_KEY_NAME",
    "Adapter",
    "CheckpointableReadingServiceInterface",
    "DataLoader",
    "DataLoader2",
    "DataLoader2Iterator",
    "DistributedReadingService",
    "InProcessReadingService",
    "LightningResume",
    "MultiProcessingReadingService",
    "PauseIteration",
    "PrefetchTimeoutError",
    "PrototypeMultiProcessingReadingService",
    "ReadingServiceInterface",
    "SeedGenerator",
    "SequentialReadingService",
    "Shuffle",
    "Stateful",
    "TorchDataLoaderReadingService",
    "WorkerInfo",
    "get_worker_info",
    "pipes",
    "shared_empty",
    "shared_empty_like",
]
