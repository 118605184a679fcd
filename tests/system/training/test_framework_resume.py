"""Exact resume inside the trainers users run, driven as their users drive them: the
examples for Lightning (2-process DDP and 1 process), Accelerate and
``torch.distributed.checkpoint`` (``torchrun``, 2 ranks, gloo on 127.0.0.1) train, are
killed with SIGKILL mid-epoch, resumed and killed again right after an epoch's last step,
and resumed to the end. Every rank must train on exactly the batches the uninterrupted
run trained on after each checkpoint, and end with bit-identical weights."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from launches import launched, torchrun

pytest.importorskip("pytorch_lightning")
pytest.importorskip("accelerate")

pytestmark = pytest.mark.timeout(600)

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
# --standalone: each torchrun finds a free port for itself (tests run two at a time).
TORCHRUN = [*torchrun(), "--standalone", "--nproc-per-node", "2"]


def run(command: list[str], cwd: Path, killed: bool = False) -> None:
    """Run a launch in a session of its own; it must end by itself (or be killed, when
    ``killed``) within the deadline, and no process of it may be left behind."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    out = cwd / f"launch-{len(list(cwd.glob('launch-*')))}"
    with launched(command, out, env) as launch:
        launch.wait_until(lambda: launch.popen.poll() is not None, "its end")
        if killed:
            assert launch.popen.returncode != 0, "the run should have been killed"
        else:
            assert launch.popen.returncode == 0, launch.output()


def batches(out: Path, rank: int) -> list[list[int]]:
    return [json.loads(line)["items"] for line in (out / f"batches-rank{rank}.jsonl").read_text().splitlines()]


def check_chain(launch: Any, ranks: int, tmp_path: Path, mid: int, end: int) -> None:
    """Uninterrupted; then killed after step ``mid``, resumed and killed after step ``end``,
    resumed to the end: the same batches after each cut, the same weights."""
    reference, chained = tmp_path / "reference", tmp_path / "chained"
    run(launch(reference), tmp_path)
    run(launch(chained, kill_at=mid), tmp_path, killed=True)
    run(launch(chained, kill_at=end, resume=mid), tmp_path, killed=True)
    run(launch(chained, resume=end), tmp_path)
    for rank in range(ranks):
        expected, got = batches(reference, rank), batches(chained, rank)
        # What ran before each kill, then what each resume trained on.
        assert got[:mid] == expected[:mid]
        assert got[mid : mid + (end - mid)] == expected[mid:end], f"rank {rank} after step {mid}"
        assert got[end:] == expected[end:], f"rank {rank} after step {end}"
    assert (chained / "weights.json").read_text() == (reference / "weights.json").read_text()


def lightning_ddp(out: Path, kill_at: int | None = None, resume: int | None = None) -> list[str]:
    """A launch of the Lightning example: 2-process DDP, checkpoints every 2 steps."""
    command = [sys.executable, str(EXAMPLES / "lightning_resume.py"), "--out", str(out), "--devices", "2"]
    command += ["--generator", "per-rank", "--every", "2"]
    if kill_at is not None:
        command += ["--kill-at", str(kill_at)]
    if resume is not None:
        command += ["--resume", str(out / "checkpoints" / f"step={resume}.ckpt")]
    return command


def test_lightning_ddp_resumes_every_rank_exactly(tmp_path: Path) -> None:
    """conveyor.DataLoader sharded by Lightning's own DistributedSampler, a generator per rank."""
    check_chain(lightning_ddp, 2, tmp_path, mid=4, end=8)  # 8 steps an epoch on each of 2 ranks


def test_lightning_resumes_exactly_after_a_resume_from_an_epochs_last_step(tmp_path: Path) -> None:
    """Killed after epoch 0's last step (8), resumed and killed half-way through epoch 1
    (12), resumed to the end. Lightning never counts epoch 1 as started in the second
    launch, so it keeps step 12's loader state to itself in the third; the example's
    conveyor.LightningResume hands it over. (Without it, the third launch read epoch 1
    again from its start: steps 12-15 were steps 8-11.)"""
    check_chain(lightning_ddp, 2, tmp_path, mid=8, end=12)


@pytest.mark.parametrize("devices", [1, 2])
def test_lightning_resumes_a_dataloader2_exactly(tmp_path: Path, devices: int) -> None:
    """Through worker processes; under 2-process DDP, sharded by a DistributedReadingService first."""

    def launch(out: Path, kill_at: int | None = None, resume: int | None = None) -> list[str]:
        command = [sys.executable, str(EXAMPLES / "lightning_resume.py"), "--out", str(out)]
        command += ["--loader", "dataloader2", "--devices", str(devices)]
        if kill_at is not None:
            command += ["--kill-at", str(kill_at)]
        if resume is not None:
            command += ["--resume", str(out / "checkpoints" / f"step={resume}.ckpt")]
        return command

    steps = 16 // devices  # an epoch on each rank
    check_chain(launch, devices, tmp_path, mid=steps // 2, end=steps)


@pytest.mark.parametrize("loader", ["dataloader", "dataloader2"])
def test_accelerate_resumes_every_process_exactly(tmp_path: Path, loader: str) -> None:
    """conveyor.DataLoader through prepare(); a DataLoader2 through register_for_checkpointing."""

    def launch(out: Path, kill_at: int | None = None, resume: int | None = None) -> list[str]:
        command = [*TORCHRUN, str(EXAMPLES / "accelerate_resume.py"), "--out", str(out), "--loader", loader]
        if kill_at is not None:
            command += ["--kill-at", str(kill_at)]
        if resume is not None:
            command += ["--resume"]
        return command

    check_chain(launch, 2, tmp_path, mid=5, end=8)


@pytest.mark.parametrize("loader", ["dataloader", "dataloader2"])
def test_dcp_resumes_every_rank_exactly(tmp_path: Path, loader: str) -> None:
    def launch(out: Path, kill_at: int | None = None, resume: int | None = None) -> list[str]:
        command = [*TORCHRUN, str(EXAMPLES / "dcp_resume.py"), "--out", str(out), "--loader", loader]
        command += ["--generator", "per-rank"] if loader == "dataloader" else []
        if kill_at is not None:
            command += ["--kill-at", str(kill_at)]
        if resume is not None:
            command += ["--resume"]
        return command

    check_chain(launch, 2, tmp_path, mid=3, end=8)


def test_dcp_resumes_a_two_rank_checkpoint_on_another_world_size(tmp_path: Path) -> None:
    """conveyor.DataLoader over torch's DistributedSampler: saved by 2 ranks after 2 steps
    each, the rest of the epoch is read by 1 rank, and by 3, every item once."""
    saved = tmp_path / "saved"
    run([*TORCHRUN, str(EXAMPLES / "dcp_resume.py"), "--out", str(saved), "--kill-at", "2"], tmp_path, killed=True)
    for world_size in (1, 3):
        out = resumable_copy(saved, world_size)
        again = [*torchrun(), "--standalone", "--nproc-per-node", str(world_size)]
        run([*again, str(EXAMPLES / "dcp_resume.py"), "--out", str(out), "--resume", "--finish-epoch"], tmp_path)
        every_item_once(out)


def resumable_copy(saved: Path, world_size: int) -> Path:
    """A copy of a killed run's folder for one resume: the resumes of one save on several
    world sizes each go on from the same state (the save is made once)."""
    out = saved.with_name(f"resumed-on-{world_size}")
    shutil.copytree(saved, out)
    return out


def every_item_once(out: Path) -> None:
    ranks = range(len(list(out.glob("batches-rank*.jsonl"))))
    items = [key for rank in ranks for batch in batches(out, rank) for key in batch]
    assert sorted(items) == list(range(64))


@pytest.mark.parametrize(("loader", "world_sizes"), [("dataloader", (1, 3)), ("dataloader2", (1, 3))])
def test_lightning_resumes_a_two_rank_checkpoint_on_another_world_size(
    tmp_path: Path, loader: str, world_sizes: tuple[int, ...]
) -> None:
    """Saved by 2-process DDP after 2 steps of 8; the rest of the epoch on 1 or 3 processes
    (DDP, so that DataLoader2's DistributedReadingService has a process group): every item
    once. (On 3 ranks a DataLoader2 shares what is left by whole positions, 4 more steps
    each, one more than the 5 Lightning counts for an epoch there before it loads the
    state: the example's LightningResume callback lets the epoch run to its end.)"""
    saved = tmp_path / "saved"
    script = [sys.executable, str(EXAMPLES / "lightning_resume.py"), "--loader", loader]
    run([*script, "--out", str(saved), "--devices", "2", "--every", "2", "--kill-at", "2"], tmp_path, killed=True)
    for world_size in world_sizes:
        out = resumable_copy(saved, world_size)
        resume = ["--devices", str(world_size), "--strategy", "ddp", "--epochs", "1", "--every", "100"]
        run([*script, "--out", str(out), *resume, "--resume", str(out / "checkpoints" / "step=2.ckpt")], tmp_path)
        every_item_once(out)


@pytest.mark.parametrize(
    ("loader", "generator", "world_sizes"),
    [("dataloader", "per-rank", (1, 3)), ("dataloader", "none", (3,)), ("dataloader2", "none", (3,))],
)
def test_accelerate_resumes_a_two_process_checkpoint_on_another_world_size(
    tmp_path: Path, loader: str, generator: str, world_sizes: tuple[int, ...]
) -> None:
    """Saved by 2 processes after 2 steps; the rest of the epoch read by 1 or 3 processes,
    every item once (conveyor.DataLoader sharded by Accelerate's BatchSamplerShard, or a
    DataLoader2 by its DistributedReadingService)."""
    saved = tmp_path / "saved"
    script = [str(EXAMPLES / "accelerate_resume.py"), "--loader", loader, "--generator", generator]
    run([*TORCHRUN, *script, "--out", str(saved), "--kill-at", "2"], tmp_path, killed=True)
    for world_size in world_sizes:
        out = resumable_copy(saved, world_size)
        again = [*torchrun(), "--standalone", "--nproc-per-node", str(world_size)]
        run([*again, *script, "--out", str(out), "--resume", "--finish-epoch"], tmp_path)
        every_item_once(out)
