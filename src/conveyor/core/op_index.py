"""Where each op lives: ``conveyor.pipes`` imports an op's module when the op is first
used, not when conveyor is imported.

Importing every op module up front cost every process of a loader memory it mostly never
used (their code, and the libraries they import), and a forked worker inherits all of
it: with the ops loaded on demand, the summed memory of a loader with two workers (1 MiB
arrays) went down by ~2.6 MiB. What stays eager is what the loaders themselves need.

Two ways in, both resolved through :data:`MODULES`:

- ``conveyor.pipes.Batcher`` (the package's ``__getattr__``, :func:`public_name`);
- ``pipe.batch(4)``: every functional name is an attribute of :class:`IterDataPipe` (or
  :class:`MapDataPipe`) from the start (:func:`install_stubs`), whose first reading
  imports the op's module, where the op registers its real method in its place.

The index is kept true by a test that imports every op module and compares what they
export and register with it.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

#: Op modules are named from here: ``pipes.batch``, ``pipes.io.archives``, ``core.sharding``.
PACKAGE = "conveyor"

#: For each op module: the public names ``conveyor.pipes`` exports from it, and the
#: functional names it registers on ``IterDataPipe``.
MODULES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "pipes.io.archives": (("TarArchiveLoader", "ZipArchiveLoader"), ("load_from_tar", "load_from_zip")),
    "pipes.io.compression": (
        ("Bz2FileLoader", "Decompressor", "XzFileLoader"),
        ("decompress", "extract", "load_from_bz2", "load_from_xz"),
    ),
    "pipes.batch": (("BatchMapper", "Batcher", "Unbatcher"), ("batch", "map_batches", "unbatch")),
    "pipes.branching": (("Branch", "Hub"), ()),
    "pipes.cache": (("InMemoryCacheHolder",), ("in_memory_cache",)),
    "pipes.collate": (("Collator", "default_collate"), ("collate",)),
    "pipes.combine": (("Concater", "Zipper", "ZipperLongest"), ("concat", "zip", "zip_longest")),
    "pipes.cycle": (("Cycler",), ("cycle",)),
    "pipes.io.disk_cache": (("EndOnDiskCacheHolder", "OnDiskCacheHolder"), ("end_caching", "on_disk_cache")),
    "core.dispatch": (("ShardingRoundRobinDispatcher",), ("sharding_round_robin_dispatch",)),
    "pipes.enumerate": (("Enumerator",), ("enumerate",)),
    "pipes.io.files": (("FileLister", "FileOpener", "LineReader"), ("list_files", "open_files", "readlines")),
    "pipes.filter": (("Filter",), ("filter",)),
    "pipes.flatmap": (("Expander", "FlatMapper", "Repeater"), ("flatmap", "repeat")),
    "pipes.io.fsspec_files": (
        ("FSSpecFileLister", "FSSpecFileOpener", "FSSpecSaver"),
        ("list_files_by_fsspec", "open_files_by_fsspec", "save_by_fsspec"),
    ),
    "pipes.fullsync": (("FullSync", "FullSyncSummary"), ("fullsync",)),
    "pipes.grouping": (("Grouper", "bucketbatch"), ("bucketbatch", "groupby")),
    "pipes.io.hash_check": (("HashChecker",), ("check_hash",)),
    "pipes.header": (("Header",), ("header",)),
    "pipes.io.hf_datasets": (("HuggingFaceDataset",), ()),
    "pipes.io.images": (("ImageDecoder", "SampleDecoder"), ("decode_image", "decode_samples")),
    "pipes.item_columns": (("Dropper", "Flattener", "Slicer"), ("drop", "flatten", "slice")),
    "pipes.iterable_wrapper": (("IterableWrapper",), ()),
    "pipes.key_zip": (("IterKeyZipper", "MapKeyZipper"), ("zip_with_iter", "zip_with_map")),
    "pipes.map_pipes": (("MapBatcher", "MapMapper", "MapShuffler", "MapToIterConverter", "SequenceWrapper"), ()),
    "pipes.mapper": (("Mapper",), ("map",)),
    "pipes.mux": (("Multiplexer", "MultiplexerLongest"), ("mux", "mux_longest")),
    "core.op_roles": (("RandomOp", "ShardingPoint"), ()),
    "pipes.io.parquet": (("ParquetLoader", "ParquetRowGroups", "load_parquet"), ("load_parquet",)),
    "pipes.torch.pin_memory": (("PinMemory",), ("pin_memory",)),
    "pipes.prefetch": (("Prefetcher",), ("prefetch",)),
    "pipes.random_map": (("InBatchShuffler", "RandomMapper"), ("in_batch_shuffle", "random_map")),
    "pipes.random_splits": (("RandomSplit", "random_split"), ("random_split",)),
    "pipes.sample_mux": (("SampleMultiplexer",), ()),
    "pipes.io.saver": (("Saver",), ("save_to_disk",)),
    "pipes.set_length": (("LengthSetter",), ("set_length",)),
    "core.sharding": (("ShardingFilter",), ("sharding_filter",)),
    "pipes.shuffle": (("Shuffler",), ("shuffle",)),
    "pipes.shuffled_flatmap": (("ShuffledFlatMapper",), ("shuffled_flatmap",)),
    "pipes.splitters": (
        ("Demultiplexer", "Forker", "RoundRobinDemultiplexer", "UnZipper"),
        ("demux", "fork", "round_robin_demux", "unzip"),
    ),
    "pipes.io.text_formats": (
        ("CSVDictParser", "CSVParser", "JsonLinesParser", "JsonParser", "ParagraphAggregator"),
        ("lines_to_paragraphs", "parse_csv", "parse_csv_as_dict", "parse_json_files", "parse_jsonl_files"),
    ),
    "pipes.threadpool_map": (("ThreadPoolMapper",), ("threadpool_map",)),
    "pipes.token_buckets": (("MaxTokenBucketizer",), ("max_token_bucketize",)),
    "pipes.torch.torch_sources": (("TorchDataPipe", "TorchIterableDataset", "TorchMapDataset", "from_torch"), ()),
    "pipes.io.webdataset": (("ShardExpander", "WebDataset"), ("shard_expand", "webdataset")),
}
#: The functional names registered on ``MapDataPipe``, by module.
MAP_FUNCTIONAL: dict[str, tuple[str, ...]] = {"pipes.map_pipes": ("batch", "map", "shuffle", "to_iter_datapipe")}

#: Public name -> its module.
PUBLIC: dict[str, str] = {name: module for module, (names, _) in MODULES.items() for name in names}


def _functional(modules: dict[str, tuple[str, ...]]) -> dict[str, str]:
    return {name: module for module, names in modules.items() for name in names}


#: Functional name -> its module, for ``IterDataPipe`` and for ``MapDataPipe``.
_BY_KIND: dict[str, dict[str, str]] = {
    "IterDataPipe": _functional({module: names for module, (_, names) in MODULES.items()}),
    "MapDataPipe": _functional(MAP_FUNCTIONAL),
}


def load(module: str) -> Any:
    """Import op module ``module`` (a name in :data:`MODULES`) and return it."""
    return importlib.import_module(f"{PACKAGE}.{module}")


def public_name(name: str) -> Any:
    """The package's ``__getattr__``: ``conveyor.pipes.<name>``, importing its module."""
    module = PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'conveyor.pipes' has no attribute {name!r}")
    return getattr(load(module), name)


def load_owner(kind: type, name: str) -> None:
    """Import the module of conveyor's op registered as ``name`` on ``kind`` (an
    ``IterDataPipe`` or ``MapDataPipe``, or a subclass: they share its registry), unless
    it is imported or being imported: a user's op registered under a name of ours then
    meets ours, as if every op were loaded."""
    table = next((_BY_KIND[base.__name__] for base in kind.__mro__ if base.__name__ in _BY_KIND), {})
    module = table.get(name)
    if module is not None and f"{PACKAGE}.{module}" not in sys.modules:
        load(module)


def install_stubs(kind: type) -> None:
    """Give ``kind`` an attribute for each of its functional names whose module is not
    loaded yet (:class:`NotLoaded`): read, it loads the module, whose op then registers
    its real method in its place."""
    for name, module in _BY_KIND[kind.__name__].items():
        if name not in kind.__dict__:
            setattr(kind, name, NotLoaded(kind, name, module))


class NotLoaded:
    """A functional method whose op's module is not imported yet. Reading it (``pipe.map``,
    ``IterDataPipe.map``, ``help()``, ``inspect.signature``) imports the module, which
    registers the op's method in this one's place, and gives that method: so the method,
    its signature and its docstring are the op's from the first look on."""

    def __init__(self, kind: type, name: str, module: str) -> None:
        self.kind = kind
        self.module = module
        self.__name__ = name
        self.__qualname__ = f"{kind.__name__}.{name}"
        self.__doc__ = f"``{name}``: conveyor's op from :mod:`{PACKAGE}.{module}` (imported when first read)."

    def __get__(self, pipe: Any, owner: type | None = None) -> Any:
        load(self.module)
        method = self.kind.__dict__.get(self.__name__)
        if method is self or method is None:
            raise ImportError(f"{PACKAGE}.{self.module} did not register {self.__qualname__}(); the op index is wrong")
        return method.__get__(pipe, owner)

    def __repr__(self) -> str:
        return f"<{self.__qualname__}, in {PACKAGE}.{self.module} (not imported yet)>"
