"""One rank of ``test_rank_reads.py``, launched by ``torchrun``: reads WebDataset tar shards
and Parquet files through 2 worker processes, with files reached by URL through a local
filesystem that logs every read (``counted://``), and writes what it delivered.

Each process (the rank and its workers) logs its reads to ``<out>/reads-<rank>-<pid>.log``
as ``path offset bytes`` lines; the rank writes its items to ``<out>/items-<rank>.json``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
from pathlib import Path
from typing import Any

import fsspec
import torch.distributed as dist
from fsspec.implementations.local import LocalFileSystem

from conveyor import DataLoader2, DistributedReadingService, MultiProcessingReadingService, SequentialReadingService
from conveyor.pipes import IterableWrapper, IterDataPipe

LOG_DIR = os.environ.get("RANK_READS_OUT", ".")


def log_read(path: str, offset: int, count: int) -> None:
    """One line in this process's log (a forked worker writes its own)."""
    with open(os.path.join(LOG_DIR, f"reads-{os.environ['RANK']}-{os.getpid()}.log"), "a") as log:
        log.write(f"{path} {offset} {count}\n")


class CountedFile(io.RawIOBase):
    """A local file that logs each read: where it began and how many bytes it returned."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self._path = path
        self._file = open(path, "rb", buffering=0)  # noqa: SIM115 - closed by close()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        offset = self._file.tell()
        count = self._file.readinto(buffer) or 0
        if count:
            log_read(self._path, offset, count)
        return count

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def close(self) -> None:
        self._file.close()
        super().close()


class CountedFileSystem(LocalFileSystem):
    """``counted:///abs/path``: the local file, its reads logged."""

    protocol = "counted"

    @classmethod
    def _strip_protocol(cls, path: Any) -> str:
        text = str(path)
        return super()._strip_protocol(text[len("counted://") :] if text.startswith("counted://") else text)

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if mode != "rb":
            raise ValueError(f"counted:// is read-only, got mode {mode!r}")
        return CountedFile(self._strip_protocol(path))


fsspec.register_implementation("counted", CountedFileSystem, clobber=True)


def sample_key(sample: dict[str, Any]) -> str:
    return str(sample["__key__"])


def row_id(row: dict[str, Any]) -> int:
    return int(row["id"])


def pipelines(data: Path) -> dict[str, IterDataPipe]:
    shards = sorted(f"counted://{path}" for path in (data / "shards").glob("*.tar"))
    tables = sorted(f"counted://{path}" for path in (data / "tables").glob("*.parquet"))
    return {
        "webdataset": IterableWrapper(shards)
        .sharding_filter()
        .open_files_by_fsspec(mode="rb")
        .load_from_tar()
        .webdataset()
        .map(sample_key),
        "parquet": IterableWrapper(tables).load_parquet(columns=["id", "payload"]).map(row_id),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    items: dict[str, list[Any]] = {}
    for name, pipe in pipelines(args.data).items():
        service = SequentialReadingService(
            DistributedReadingService(timeout=60),
            MultiProcessingReadingService(num_workers=2, multiprocessing_context="fork"),
        )
        loader = DataLoader2(pipe, reading_service=service)
        try:
            items[name] = list(loader)
        finally:
            loader.shutdown()
    Path(LOG_DIR, f"items-{dist.get_rank()}.json").write_text(json.dumps(items))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
