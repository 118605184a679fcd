"""One rank of ``test_elastic_resume.py``, launched by ``torchrun`` (gloo on 127.0.0.1).

``--phase save``: for each ``--epoch-end``, one loader reads the epoch and, after each of
``--cuts`` items, writes ``<out>/save-<epoch_end>-<cut>-rank<r>.json``: the items so far
and ``state_dict()``. ``--phase resume``: for each ``<out>/<name>.merged.json`` named by
``--merged``, a loader loads it and reads the rest of the epoch (for the first, a second
loader does it again); the rank writes ``<out>/resume-<name>-rank<r>.json``: the readings
and what its fullsync padded in each.

torch is imported inside ``main()``: spawned and forkserver workers import this file as
their ``__main__`` and need only the pipeline functions.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from conveyor import DataLoader2, DistributedReadingService, MultiProcessingReadingService, SequentialReadingService
from conveyor.pipes import IterableWrapper, IterDataPipe
from pipeline_helpers import jitter, not_multiple_of_three, tag


def pipeline(name: str, n: int) -> IterDataPipe:
    """A shared shuffle before the sharding point, per-item (random) ops after it."""
    pipe = IterableWrapper(range(n)).shuffle(buffer_size=8).sharding_filter().map(tag).random_map(jitter)
    return pipe.filter(not_multiple_of_three) if name == "filtered" else pipe


def service(workers: int | None, context: str, epoch_end: str, window: int) -> Any:
    distributed = DistributedReadingService(timeout=60, epoch_end=epoch_end, window=window)
    if workers is None:
        return distributed
    return SequentialReadingService(
        distributed, MultiProcessingReadingService(workers, multiprocessing_context=context)
    )


def distributed_part(loader: DataLoader2) -> DistributedReadingService:
    rs = loader.reading_service
    return rs.reading_services[0] if isinstance(rs, SequentialReadingService) else rs  # type: ignore[return-value]


def save(args: argparse.Namespace, rank: int) -> None:
    for epoch_end in args.epoch_end:
        with DataLoader2(
            pipeline(args.pipeline, args.items),
            reading_service=service(args.workers, args.context, epoch_end, args.window),
        ) as loader:
            loader.seed(args.seed)
            iterator = iter(loader)
            head: list[Any] = []
            for cut in sorted(args.cuts):
                while len(head) < cut:
                    head.append(next(iterator))
                record = {"head": head, "state": loader.state_dict()}
                Path(args.out, f"save-{epoch_end}-{cut}-rank{rank}.json").write_text(json.dumps(record))


def resume(args: argparse.Namespace, rank: int) -> None:
    for index, name in enumerate(args.merged):
        merged = json.loads(Path(args.out, f"{name}.merged.json").read_text())
        epoch_end = name.split("-")[0]
        readings, padded = [], []
        for _ in range(2 if index == 0 else 1):  # the first twice: the same items, in the same order
            with DataLoader2(
                pipeline(args.pipeline, args.items),
                reading_service=service(args.workers, args.context, epoch_end, args.window),
            ) as loader:
                loader.load_state_dict(merged)
                readings.append(list(loader))
                summary = distributed_part(loader).last_epoch_summary
                padded.append(summary.padded if summary is not None else None)
        record = {"rest": readings[0], "again": readings[1:], "padded": padded}
        Path(args.out, f"resume-{name}-rank{rank}.json").write_text(json.dumps(record))


def main() -> None:
    import torch.distributed as dist

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--phase", choices=("save", "resume"), required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--pipeline", choices=("plain", "filtered"), default="plain")
    parser.add_argument("--items", type=int, default=60)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--workers", type=lambda text: None if text == "none" else int(text), default=None)
    parser.add_argument("--context", default="fork")
    parser.add_argument("--epoch-end", nargs="+", default=["drop"])
    parser.add_argument("--window", type=int, default=4)
    parser.add_argument("--cuts", type=int, nargs="*", default=[])
    parser.add_argument("--merged", nargs="*", default=[])
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    try:
        (save if args.phase == "save" else resume)(args, rank)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    print(f"elastic_job: rank {rank} of {world_size} done (pid {os.getpid()})")


if __name__ == "__main__":
    main()
