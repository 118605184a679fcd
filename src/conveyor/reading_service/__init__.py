"""Reading services: how a ``DataLoader2`` runs its graph."""

from conveyor.reading_service.in_process import InProcessReadingService
from conveyor.reading_service.interface import (
    CheckpointableReadingServiceInterface,
    ReadingServiceInterface,
)
from conveyor.reading_service.multiprocessing import (
    MultiProcessingReadingService,
    PrototypeMultiProcessingReadingService,
)

__all__ = [
    "CheckpointableReadingServiceInterface",
    "InProcessReadingService",
    "MultiProcessingReadingService",
    "PrototypeMultiProcessingReadingService",
    "ReadingServiceInterface",
]
