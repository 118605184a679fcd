"""Elastic resume under ``torchrun``: an epoch checkpointed by W ranks, merged with
``DistributedReadingService.merge_rank_states``, resumed by W' ranks (4 -> 2, 2 -> 3,
3 -> 1, and 3 -> 2 "nodes" x 2 ranks through two ``torchrun`` agents with the ``c10d``
rendezvous), gloo on 127.0.0.1.

What "every remaining item exactly once" means, checked exactly: the remaining items
are the epoch's items whose positions at the sharding point no old rank handed out (in
the uninterrupted single-process epoch, position ``p`` is its ``p``-th item). New rank
``j`` of ``W'`` gets the remaining positions ``p`` with ``p % W' == j``, in order; its
``fullsync`` then applies ``epoch_end`` to those shares: ``"pad"`` tops every rank up to
the longest share with repeats of its own last items (reported as padded), ``"drop"``
cuts every rank to the shortest share. So: items before the cut, plus every new rank's
items less its pads (``"pad"``), are the whole epoch once; under ``"drop"`` each new rank
reads the first ``min`` items of its share. Two resumes from one merged state read the
same items in the same order.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from elastic_job import pipeline

from conveyor import DataLoader2, DistributedReadingService
from distributed_helpers import free_port
from launches import torchrun
from pipeline_helpers import not_multiple_of_three

pytest.importorskip("torch.distributed")

pytestmark = pytest.mark.timeout(240)

SCRIPT = Path(__file__).resolve().with_name("elastic_job.py")
N, SEED, WINDOW = 60, 7, 4
#: A deadline for one torchrun; on overrun its whole process group is killed.
DEADLINE_S = 150


def launch(out: Path, nproc: int, job: list[str], nodes: int = 1) -> None:
    """Run the job on ``nproc`` ranks per node (``nodes`` torchrun agents meeting at a
    c10d rendezvous on 127.0.0.1); fail with every agent's output if one fails."""
    port = free_port()
    common = [
        "--nnodes",
        str(nodes),
        "--nproc-per-node",
        str(nproc),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        f"elastic-{port}",
        "--local-addr",
        "127.0.0.1",
        "--max-restarts",
        "0",
    ]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "lo",
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    command = [*torchrun(), *common, str(SCRIPT), "--out", str(out), "--items", str(N), "--seed", str(SEED), *job]
    agents = [
        subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
        )
        for _ in range(nodes)
    ]
    outputs = []
    try:
        for agent in agents:
            outputs.append(agent.communicate(timeout=DEADLINE_S)[0])
    finally:
        for agent in agents:
            if agent.poll() is None:  # overran: end the agent and every rank and worker it started
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait(10)
    failed = [agent.returncode for agent in agents if agent.returncode != 0]
    assert not failed, "\n---\n".join(outputs)


def reference(name: str) -> tuple[list[list[Any]], list[bool]]:
    """The uninterrupted epoch in one process, by position at the sharding point (the
    unfiltered items), and whether each position's item passes the filter."""
    with DataLoader2(pipeline("plain", N)) as loader:
        loader.seed(SEED)
        items = [list(item) for item in loader]
    keep = [name == "plain" or not_multiple_of_three(tuple(item)) for item in items]
    return items, keep


def merge(out: Path, epoch_end: str, cut: int, world: int) -> tuple[str, list[list[Any]], dict[str, Any]]:
    """Merge the ranks' states of one cut (given in a shuffled order): ``(its name, the
    items every rank read before the cut)``."""
    records = [json.loads((out / f"save-{epoch_end}-{cut}-rank{rank}.json").read_text()) for rank in range(world)]
    states = [record["state"] for record in records]
    random.Random(cut).shuffle(states)
    merged = DistributedReadingService.merge_rank_states(states)
    assert json.loads(json.dumps(merged)) == merged
    name = f"{epoch_end}-{cut}"
    (out / f"{name}.merged.json").write_text(json.dumps(merged))
    return name, [item for record in records for item in record["head"]], merged


def check_resumed(out: Path, name: str, before: list[list[Any]], new_world: int, pipe: str) -> None:
    epoch_end = name.split("-")[0]
    items, keep = reference(pipe)
    position = {json.dumps(item): p for p, item in enumerate(items)}
    seen = {position[json.dumps(item)] for item in before}
    assert len(seen) == len(before)  # no item twice before the cut
    shares = [
        [items[p] for p in range(N) if p % new_world == j and p not in seen and keep[p]] for j in range(new_world)
    ]
    records = [json.loads((out / f"resume-{name}-rank{j}.json").read_text()) for j in range(new_world)]
    longest, shortest = max(map(len, shares)), min(map(len, shares))
    real: list[list[Any]] = []
    for j, (share, record) in enumerate(zip(shares, records, strict=True)):
        rest = record["rest"]
        assert all(again == rest for again in record["again"]), f"rank {j}: a second resume read other items"
        if epoch_end == "pad":
            assert rest[: len(share)] == share, f"rank {j}"
            assert len(rest) == longest and set(record["padded"]) == {longest - len(share)}, f"rank {j}"
            real += rest[: len(share)]
        else:
            assert rest == share[:shortest], f"rank {j}"
            real += rest
    epoch = [item for item, kept in zip(items, keep, strict=True) if kept]
    if epoch_end == "pad":
        assert sorted(before + real) == sorted(epoch)  # every item of the epoch once
    else:
        dropped = [item for share in shares for item in share[shortest:]]
        assert sorted(before + real + dropped) == sorted(epoch)


def elastic_case(
    tmp_path: Path,
    world: int,
    new_world: int,
    pipe: str,
    save_with: tuple[str, str],
    resume_with: tuple[str, str],
    cuts: dict[str, list[int]],
    new_nodes: int = 1,
) -> None:
    """Save on ``world`` ranks (workers, start method), merge each cut, resume on
    ``new_world`` ranks (over ``new_nodes`` agents), check every cut exactly."""
    out = tmp_path
    all_cuts = sorted({cut for chosen in cuts.values() for cut in chosen})
    launch(
        out,
        world,
        ["--phase", "save", "--pipeline", pipe, "--workers", save_with[0], "--context", save_with[1],
         "--window", str(WINDOW), "--epoch-end", *cuts, "--cuts", *map(str, all_cuts)],
    )  # fmt: skip
    merged, runs = {}, []  # the first merged state is resumed twice: the same items in the same order
    for epoch_end, chosen in cuts.items():
        for cut in chosen:
            name, before, state = merge(out, epoch_end, cut, world)
            merged[name] = before
            runs += state["reading_service"]["elastic"]["handed_out"]["runs"]
    if pipe == "filtered":  # the ranks' paces differ: some positions above the frontier were handed out
        assert runs
    launch(
        out,
        new_world // new_nodes,
        ["--phase", "resume", "--pipeline", pipe, "--workers", resume_with[0], "--context", resume_with[1],
         "--window", str(WINDOW), "--merged", *merged],
        nodes=new_nodes,
    )  # fmt: skip
    for name, before in merged.items():
        check_resumed(out, name, before, new_world, pipe)


def test_four_ranks_resume_on_two(tmp_path: Path) -> None:
    """4 ranks x 2 forked workers -> 2 ranks x 1 spawned worker; cuts in the first window,
    mid-epoch and near its end."""
    elastic_case(tmp_path, 4, 2, "plain", ("2", "fork"), ("1", "spawn"), {"drop": [1, 11], "pad": [6]})


def test_two_ranks_resume_on_three(tmp_path: Path) -> None:
    """2 ranks in-process (filtered items) -> 3 ranks x 2 forkserver workers."""
    elastic_case(tmp_path, 2, 3, "filtered", ("none", "fork"), ("2", "forkserver"), {"drop": [9], "pad": [3, 13]})


def test_three_ranks_resume_on_one(tmp_path: Path) -> None:
    """3 ranks x 1 spawned worker -> 1 rank in-process."""
    elastic_case(tmp_path, 3, 1, "plain", ("1", "spawn"), ("0", "fork"), {"drop": [4, 19], "pad": [15]})


def test_three_ranks_resume_on_two_nodes_of_two(tmp_path: Path) -> None:
    """3 ranks (1 forked worker each) -> two torchrun agents of 2 ranks (filtered items)."""
    elastic_case(tmp_path, 3, 4, "filtered", ("1", "fork"), ("1", "fork"), {"drop": [5], "pad": [8]}, new_nodes=2)
