"""Elastic resume: a job of 2 ranks saves mid-epoch; one process finishes the epoch.

Run it as it is (``python elastic_resume.py``): it starts the 2 ranks itself, on this
machine, with ``torch.multiprocessing`` and gloo.
(Functions in the pipeline are named by their module in the state's fingerprint, so
the ranks and the resuming process must import them from the same module: ``str``
here.) Under ``torchrun`` each rank runs
``save()`` the same way after ``dist.init_process_group("gloo")``.
"""

import json
import os
import socket
import sys
import tempfile
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

from conveyor import DataLoader2, DistributedReadingService
from conveyor.pipes import IterableWrapper

ITEMS = 40


def pipeline():
    # A shared shuffle before the sharding point, per-item ops after it: such a pipeline
    # resumes on any number of ranks and workers.
    return IterableWrapper(range(ITEMS)).shuffle(buffer_size=8).sharding_filter().map(str)


def save(rank: int, world_size: int, port: int, folder: str) -> None:
    """One rank of the first job: read 6 items, save the state, stop (a preemption)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    loader = DataLoader2(pipeline(), reading_service=DistributedReadingService(timeout=60))
    loader.seed(7)
    batches = iter(loader)
    seen = [next(batches) for _ in range(6)]
    state = loader.state_dict()  # every rank calls it at the same step: each gets every rank's part
    Path(folder, f"seen-{rank}.json").write_text(json.dumps(seen))
    if rank == 0:
        Path(folder, "loader.json").write_text(json.dumps(state))
    loader.shutdown()
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


if __name__ == "__main__":
    folder = tempfile.mkdtemp()
    mp.start_processes(save, args=(2, free_port(), folder), nprocs=2, start_method="fork")

    # The new "job" is one process without torch.distributed: merge the ranks' parts and
    # read what is left of the epoch.
    state = json.loads(Path(folder, "loader.json").read_text())
    merged = DistributedReadingService.merge_rank_states([state])
    resumed = DataLoader2(pipeline())
    resumed.load_state_dict(merged)
    rest = list(resumed)
    resumed.shutdown()

    seen = [item for rank in (0, 1) for item in json.loads(Path(folder, f"seen-{rank}.json").read_text())]
    print(f"the 2 ranks read {len(seen)} items; the resumed process read the other {len(rest)}")
    assert sorted(seen + rest, key=int) == [str(x) for x in range(ITEMS)], "every item once"
    sys.exit(0)
