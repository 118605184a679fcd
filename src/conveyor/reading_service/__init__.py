"""Reading services: how a ``DataLoader2`` runs its graph."""

from conveyor.reading_service.distributed import DistributedReadingService
from conveyor.reading_service.in_process import InProcessReadingService
from conveyor.reading_service.interface import (
    CheckpointableReadingServiceInterface,
    ReadingServiceInterface,
)
from conveyor.reading_service.multiprocessing import (
    MultiProcessingReadingService,
    PrototypeMultiProcessingReadingService,
)
from conveyor.reading_service.sequential import SequentialReadingService
from conveyor.reading_service.torch_dataloader import TorchDataLoaderReadingService

__all__ = [
    "CheckpointableReadingServiceInterface",
    "DistributedReadingService",
    "InProcessReadingService",
    "MultiProcessingReadingService",
    "PrototypeMultiProcessingReadingService",
    "ReadingServiceInterface",
    "SequentialReadingService",
    "TorchDataLoaderReadingService",
]
