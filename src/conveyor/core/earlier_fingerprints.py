"""Graph fingerprints as earlier conveyor versions computed them, so that their states
still load (:func:`conveyor.loader.state.check_loader_state` accepts either).

Up to the layers-as-folders layout, a fingerprint named each op by the module its class
was defined in; that layout moved 21 of those modules (and renamed one, whose name hid
its op), and a later split took compressed files out of the archives' module.
:func:`fingerprint_before_layers` names each op as that version did: the module it was
in then.
"""

from __future__ import annotations

from conveyor.core.base import DataPipe
from conveyor.core.graph import fingerprint_naming

#: Where the modules that define conveyor's ops were before the layers-as-folders layout.
_MODULE_BEFORE_LAYERS = {
    "conveyor.core.base": "conveyor.pipes.base",
    "conveyor.core.dispatch": "conveyor.pipes.dispatch",
    "conveyor.core.foreign": "conveyor.pipes.foreign",
    "conveyor.core.sharding": "conveyor.pipes.sharding",
    "conveyor.pipes.io.archives": "conveyor.pipes.archives",
    "conveyor.pipes.io.compression": "conveyor.pipes.archives",
    "conveyor.pipes.io.disk_cache": "conveyor.pipes.disk_cache",
    "conveyor.pipes.io.files": "conveyor.pipes.files",
    "conveyor.pipes.io.fsspec_files": "conveyor.pipes.fsspec_files",
    "conveyor.pipes.io.hash_check": "conveyor.pipes.hash_check",
    "conveyor.pipes.io.hf_datasets": "conveyor.pipes.hf_datasets",
    "conveyor.pipes.io.images": "conveyor.pipes.images",
    "conveyor.pipes.io.parquet": "conveyor.pipes.parquet",
    "conveyor.pipes.io.saver": "conveyor.pipes.saver",
    "conveyor.pipes.io.text_formats": "conveyor.pipes.text_formats",
    "conveyor.pipes.io.webdataset": "conveyor.pipes.webdataset",
    "conveyor.pipes.random_splits": "conveyor.pipes.random_split",
    "conveyor.pipes.torch.fetching": "conveyor.pipes.fetching",
    "conveyor.pipes.torch.pin_memory": "conveyor.pipes.pin_memory",
    "conveyor.pipes.torch.sampler_source": "conveyor.pipes.sampler_source",
    "conveyor.pipes.torch.torch_iterable": "conveyor.pipes.torch_iterable",
    "conveyor.pipes.torch.torch_sources": "conveyor.pipes.torch_sources",
    "conveyor.workers.parent.merged_output": "conveyor.workers.merged_output",
}


def fingerprint_before_layers(pipe: DataPipe) -> str:
    """``pipe``'s fingerprint as conveyor computed it before the layers-as-folders layout."""
    return fingerprint_naming(pipe, lambda cls: _MODULE_BEFORE_LAYERS.get(cls.__module__, cls.__module__))
