"""Pipes: lazy, resumable graph nodes.

Every op's functional name (``pipe.map``, ``pipe.shuffle``, ...) is a method of
``IterDataPipe`` from the start, and every name below can be imported from here; an op's
module is imported when the op is first used (:mod:`conveyor.core.op_index`)."""

from typing import TYPE_CHECKING, Any

from conveyor.core import foreign  # noqa: F401  (installs how passes see a torch datapipe)
from conveyor.core.base import DataPipe, IterDataPipe, MapDataPipe
from conveyor.core.op_index import public_name

if TYPE_CHECKING:  # what the names below are, for type checkers (at run time: __getattr__)
    from conveyor.core.dispatch import ShardingRoundRobinDispatcher
    from conveyor.core.op_roles import RandomOp, ShardingPoint
    from conveyor.core.sharding import ShardingFilter
    from conveyor.pipes.batch import Batcher, BatchMapper, Unbatcher
    from conveyor.pipes.branching import Branch, Hub
    from conveyor.pipes.cache import InMemoryCacheHolder
    from conveyor.pipes.collate import Collator, default_collate
    from conveyor.pipes.combine import Concater, Zipper, ZipperLongest
    from conveyor.pipes.cycle import Cycler
    from conveyor.pipes.enumerate import Enumerator
    from conveyor.pipes.filter import Filter
    from conveyor.pipes.flatmap import Expander, FlatMapper, Repeater
    from conveyor.pipes.fullsync import FullSync, FullSyncSummary
    from conveyor.pipes.grouping import Grouper, bucketbatch
    from conveyor.pipes.header import Header
    from conveyor.pipes.io.archives import TarArchiveLoader, ZipArchiveLoader
    from conveyor.pipes.io.compression import Bz2FileLoader, Decompressor, XzFileLoader
    from conveyor.pipes.io.disk_cache import EndOnDiskCacheHolder, OnDiskCacheHolder
    from conveyor.pipes.io.files import FileLister, FileOpener, LineReader
    from conveyor.pipes.io.fsspec_files import FSSpecFileLister, FSSpecFileOpener, FSSpecSaver
    from conveyor.pipes.io.hash_check import HashChecker
    from conveyor.pipes.io.hf_datasets import HuggingFaceDataset
    from conveyor.pipes.io.images import ImageDecoder, SampleDecoder
    from conveyor.pipes.io.parquet import ParquetLoader, ParquetRowGroups, load_parquet
    from conveyor.pipes.io.saver import Saver
    from conveyor.pipes.io.text_formats import (
        CSVDictParser,
        CSVParser,
        JsonLinesParser,
        JsonParser,
        ParagraphAggregator,
    )
    from conveyor.pipes.io.webdataset import ShardExpander, WebDataset
    from conveyor.pipes.item_columns import Dropper, Flattener, Slicer
    from conveyor.pipes.iterable_wrapper import IterableWrapper
    from conveyor.pipes.key_zip import IterKeyZipper, MapKeyZipper
    from conveyor.pipes.map_pipes import (
        MapBatcher,
        MapMapper,
        MapShuffler,
        MapToIterConverter,
        SequenceWrapper,
    )
    from conveyor.pipes.mapper import Mapper
    from conveyor.pipes.mux import Multiplexer, MultiplexerLongest
    from conveyor.pipes.prefetch import Prefetcher
    from conveyor.pipes.random_map import InBatchShuffler, RandomMapper
    from conveyor.pipes.random_splits import RandomSplit, random_split
    from conveyor.pipes.sample_mux import SampleMultiplexer
    from conveyor.pipes.set_length import LengthSetter
    from conveyor.pipes.shuffle import Shuffler
    from conveyor.pipes.shuffled_flatmap import ShuffledFlatMapper
    from conveyor.pipes.splitters import Demultiplexer, Forker, RoundRobinDemultiplexer, UnZipper
    from conveyor.pipes.threadpool_map import ThreadPoolMapper
    from conveyor.pipes.token_buckets import MaxTokenBucketizer
    from conveyor.pipes.torch.pin_memory import PinMemory
    from conveyor.pipes.torch.torch_sources import TorchDataPipe, TorchIterableDataset, TorchMapDataset, from_torch

__all__ = [
    "BatchMapper",
    "Batcher",
    "Branch",
    "Bz2FileLoader",
    "CSVDictParser",
    "CSVParser",
    "Collator",
    "Concater",
    "Cycler",
    "DataPipe",
    "Decompressor",
    "Demultiplexer",
    "Dropper",
    "EndOnDiskCacheHolder",
    "Enumerator",
    "Expander",
    "FSSpecFileLister",
    "FSSpecFileOpener",
    "FSSpecSaver",
    "FileLister",
    "FileOpener",
    "Filter",
    "FlatMapper",
    "Flattener",
    "Forker",
    "FullSync",
    "FullSyncSummary",
    "Grouper",
    "HashChecker",
    "Header",
    "Hub",
    "HuggingFaceDataset",
    "ImageDecoder",
    "InBatchShuffler",
    "InMemoryCacheHolder",
    "IterDataPipe",
    "IterKeyZipper",
    "IterableWrapper",
    "JsonLinesParser",
    "JsonParser",
    "LengthSetter",
    "LineReader",
    "MapBatcher",
    "MapDataPipe",
    "MapKeyZipper",
    "MapMapper",
    "MapShuffler",
    "MapToIterConverter",
    "Mapper",
    "MaxTokenBucketizer",
    "Multiplexer",
    "MultiplexerLongest",
    "OnDiskCacheHolder",
    "ParagraphAggregator",
    "ParquetLoader",
    "ParquetRowGroups",
    "PinMemory",
    "Prefetcher",
    "RandomMapper",
    "RandomOp",
    "RandomSplit",
    "Repeater",
    "RoundRobinDemultiplexer",
    "SampleDecoder",
    "SampleMultiplexer",
    "Saver",
    "SequenceWrapper",
    "ShardExpander",
    "ShardingFilter",
    "ShardingPoint",
    "ShardingRoundRobinDispatcher",
    "ShuffledFlatMapper",
    "Shuffler",
    "Slicer",
    "TarArchiveLoader",
    "ThreadPoolMapper",
    "TorchDataPipe",
    "TorchIterableDataset",
    "TorchMapDataset",
    "UnZipper",
    "Unbatcher",
    "WebDataset",
    "XzFileLoader",
    "ZipArchiveLoader",
    "Zipper",
    "ZipperLongest",
    "bucketbatch",
    "default_collate",
    "from_torch",
    "load_parquet",
    "random_split",
]


def __getattr__(name: str) -> Any:
    return public_name(name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
