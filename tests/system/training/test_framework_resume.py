"""Exact resume inside the trainers users run, driven as their users drive them: the
examples for Lightning (2-process DDP and 1 process), Accelerate and
``torch.distributed.checkpoint`` (``torchrun``, 2 ranks, gloo on 127.0.0.1) train, are
killed with SIGKILL after a checkpoint (mid-epoch, or right after an epoch's last step)
and resumed, killed again and resumed to the end. Every rank must train on exactly the
batches the uninterrupted run trained on after each checkpoint, and end with bit-identical
weights. A checkpoint of 2 ranks is also resumed on 1 and on 3, every item once.

Each launch costs seconds of imports on every rank, so no two launches make the same
save: where the uninterrupted run writes checkpoints as it goes (Lightning's; Accelerate's
and DCP's ``--save-every``), its checkpoint of a chain's first cut is the one the chain
resumes (a checkpoint is what its run had done when it wrote it, whatever the run did
next); the resumes on other world sizes start from a chain's checkpoint where one holds
the state they need."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from launches import launched, torchrun

# The trainers run in the launches alone: found, not imported (seconds of CPU in every
# pytest-xdist worker that collects this module).
pytestmark = [
    pytest.mark.timeout(600),
    *(
        pytest.mark.skipif(importlib.util.find_spec(name) is None, reason=f"{name} is not installed")
        for name in ("pytorch_lightning", "accelerate")
    ),
]

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


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


#: ``(the run's folder, a step) -> its checkpoint of that step``
Checkpoint = Callable[[Path, int], Path]


def check_chain(
    launch: Any,
    ranks: int,
    tmp_path: Path,
    cuts: tuple[int, ...],
    killed_save: Checkpoint,
    reference_save: Checkpoint | None = None,
) -> Path:
    """Uninterrupted; then killed after each step of ``cuts`` in turn, each launch resumed
    from the cut before, the last resumed to the end: the same batches after each cut, the
    same weights. With ``reference_save``, the uninterrupted run also saves at the first
    cut (``save_at``) and the first launch resumes its checkpoint; without, a run killed
    there makes it. Returns the folder of the run that saved at the first cut."""
    reference, chained = tmp_path / "reference", tmp_path / "chained"
    first, *later = cuts
    if reference_save is not None:
        run(launch(reference, save_at=first), tmp_path)
        saved, resume = reference, reference_save(reference, first)
    else:
        run(launch(reference), tmp_path)
        run(launch(chained, kill_at=first), tmp_path, killed=True)
        saved = tmp_path / "saved"
        shutil.copytree(chained, saved)  # the chain writes on into its folder
        resume = killed_save(chained, first)
    for cut in later:
        run(launch(chained, kill_at=cut, resume=resume), tmp_path, killed=True)
        resume = killed_save(chained, cut)
    run(launch(chained, resume=resume), tmp_path)
    start = first if reference_save is not None else 0  # the chain's first step
    for rank in range(ranks):
        expected, got = batches(reference, rank), batches(chained, rank)
        assert len(got) == len(expected) - start, f"rank {rank}: {len(got)} steps, not {len(expected) - start}"
        # What ran before the first kill (where the chain ran it), then what each resume trained on.
        bounds = sorted({start, *cuts, len(expected)})
        for low, high in itertools.pairwise(bounds):
            assert got[low - start : high - start] == expected[low:high], f"rank {rank}, steps {low} to {high}"
    assert (chained / "weights.json").read_text() == (reference / "weights.json").read_text()
    return saved


def lightning(
    out: Path, *options: str, kill_at: int | None = None, resume: Path | None = None, save_at: int | None = None
) -> list[str]:
    """A launch of the Lightning example into ``out``, which checkpoints every 2 steps
    (``save_at``, a step it must save at, is one of them) unless ``options`` say otherwise."""
    assert save_at is None or save_at % 2 == 0, save_at
    command = [sys.executable, str(EXAMPLES / "lightning_resume.py"), "--out", str(out), "--every", "2", *options]
    if kill_at is not None:
        command += ["--kill-at", str(kill_at)]
    if resume is not None:
        command += ["--resume", str(resume)]
    return command


def lightning_checkpoint(out: Path, step: int) -> Path:
    return out / "checkpoints" / f"step={step}.ckpt"


def test_lightning_ddp_resumes_every_rank_exactly_also_after_a_resume_from_an_epochs_last_step(
    tmp_path: Path,
) -> None:
    """conveyor.DataLoader sharded by Lightning's own DistributedSampler, a generator per
    rank, 8 steps an epoch on each of 2 ranks: resumed mid-epoch 0 (4) and killed after
    its last step (8), resumed and killed half-way through epoch 1 (12), resumed to the
    end. Lightning never counts epoch 1 as started in the launch resumed from step 8, so
    it keeps step 12's loader state to itself in the next; the example's
    conveyor.LightningResume hands it over. (Without it, the last launch read epoch 1
    again from its start: steps 12-15 were steps 8-11.)"""

    def launch(out: Path, **how: Any) -> list[str]:
        return lightning(out, "--devices", "2", "--generator", "per-rank", **how)

    check_chain(launch, 2, tmp_path, (4, 8, 12), lightning_checkpoint, reference_save=lightning_checkpoint)


def lightning_dataloader2(devices: int) -> Any:
    """Launches of the Lightning example reading a DataLoader2 through worker processes
    on ``devices`` processes (under DDP, sharded by a DistributedReadingService first)."""

    def launch(out: Path, **how: Any) -> list[str]:
        return lightning(out, "--loader", "dataloader2", "--devices", str(devices), **how)

    return launch


def test_lightning_resumes_a_dataloader2_exactly(tmp_path: Path) -> None:
    """Through worker processes on 1 process: resumed mid-epoch 0 (8), killed after its last step (16)."""
    launch = lightning_dataloader2(1)
    check_chain(launch, 1, tmp_path, (8, 16), lightning_checkpoint, reference_save=lightning_checkpoint)


def test_lightning_ddp_resumes_a_dataloader2_exactly_and_on_other_world_sizes(tmp_path: Path) -> None:
    """Under 2-process DDP (8 steps an epoch on each rank): resumed at 4, killed at 8,
    resumed to the end. And the uninterrupted run's step-2 checkpoint resumed on 1 and on
    3 processes."""
    launch = lightning_dataloader2(2)
    saved = check_chain(launch, 2, tmp_path, (4, 8), lightning_checkpoint, reference_save=lightning_checkpoint)
    lightning_on_other_world_sizes(saved, "dataloader2", tmp_path)


def test_lightning_resumes_a_two_rank_checkpoint_on_another_world_size(tmp_path: Path) -> None:
    """conveyor.DataLoader (sharded by Lightning's DistributedSampler, no generator):
    the step-2 checkpoint of a 2-process DDP run killed there, resumed on 1 and on 3."""
    saved = tmp_path / "saved"
    run(lightning(saved, "--devices", "2", kill_at=2), tmp_path, killed=True)
    lightning_on_other_world_sizes(saved, "dataloader", tmp_path)


def lightning_on_other_world_sizes(saved: Path, loader: str, tmp_path: Path) -> None:
    """Saved by 2-process DDP after 2 steps of 8; the rest of the epoch on 1 or 3 processes
    (DDP, so that DataLoader2's DistributedReadingService has a process group): every item
    once. (On 3 ranks a DataLoader2 shares what is left by whole positions, 4 more steps
    each, one more than the 5 Lightning counts for an epoch there before it loads the
    state: the example's LightningResume callback lets the epoch run to its end.)"""
    for world_size in (1, 3):
        out = resumable_copy(saved, world_size, steps=2)
        resume = ["--loader", loader, "--devices", str(world_size), "--strategy", "ddp", "--epochs", "1"]
        run(lightning(out, *resume, "--every", "100", resume=lightning_checkpoint(out, 2)), tmp_path)
        every_item_once(out)


def under_torchrun(example: str, loader: str, generator: str = "none") -> Any:
    """Launches of the Accelerate or DCP example under ``torchrun``, reading
    conveyor.DataLoader (sharded by Accelerate's BatchSamplerShard, or by torch's
    DistributedSampler) or a DataLoader2 (sharded by its DistributedReadingService).
    ``resume`` names the checkpoint to load (its own ``--kill-at`` save in ``OUT``, or
    any other); each saves every ``save_at`` steps."""

    def launch(
        out: Path, kill_at: int | None = None, resume: Path | None = None, ranks: int = 2, save_at: int | None = None
    ) -> list[str]:
        # --standalone: each torchrun finds a free port for itself (tests run two at a time).
        command = [*torchrun(), "--standalone", "--nproc-per-node", str(ranks), str(EXAMPLES / example)]
        command += ["--out", str(out), "--loader", loader, "--generator", generator]
        if kill_at is not None:
            command += ["--kill-at", str(kill_at)]
        if save_at is not None:
            command += ["--save-every", str(save_at)]
        if resume is not None and resume.parent != out:
            command += ["--resume-from", str(resume)]
        elif resume is not None:
            assert resume.name == ("checkpoint" if example == "dcp_resume.py" else "state"), resume
            command += ["--resume"]  # the example's own save in OUT
        return command

    return launch


def accelerate_state(out: Path, step: int) -> Path:
    return out / "state"  # the example's one save, of the step it was killed at


def dcp_killed_save(out: Path, step: int) -> Path:
    return out / "checkpoint"  # --kill-at's save, of the step it was killed at


def saved_every(out: Path, step: int) -> Path:
    return out / "checkpoints" / f"step-{step}"  # --save-every's (both examples)


@pytest.mark.parametrize("loader", ["dataloader", "dataloader2"])
def test_accelerate_resumes_every_process_exactly_and_on_three(tmp_path: Path, loader: str) -> None:
    """Resumed at 5, killed after its last step (8), resumed to the end; and the state of
    step 5 resumed by 3 processes that read the rest of its epoch, every item once."""
    launch = under_torchrun("accelerate_resume.py", loader)
    saved = check_chain(launch, 2, tmp_path, (5, 8), accelerate_state, reference_save=saved_every)
    finish_epoch_elsewhere(saved, tmp_path, launch, saved_every, (3,), steps=5)


def test_accelerate_resumes_a_two_process_checkpoint_on_another_world_size(tmp_path: Path) -> None:
    """conveyor.DataLoader with a generator per process: saved by 2 processes after 2
    steps, the rest of the epoch read by 1 process, and by 3, every item once."""
    saved = tmp_path / "saved"
    launch = under_torchrun("accelerate_resume.py", "dataloader", "per-rank")
    run(launch(saved, kill_at=2), tmp_path, killed=True)
    finish_epoch_elsewhere(saved, tmp_path, launch, accelerate_state, (1, 3), steps=2)


@pytest.mark.parametrize(("loader", "generator"), [("dataloader", "per-rank"), ("dataloader2", "none")])
def test_dcp_resumes_every_rank_exactly(tmp_path: Path, loader: str, generator: str) -> None:
    """Resumed mid-epoch 0 (3), killed after its last step (8), resumed to the end."""
    launch = under_torchrun("dcp_resume.py", loader, generator)
    check_chain(launch, 2, tmp_path, (3, 8), dcp_killed_save, reference_save=saved_every)


def test_dcp_resumes_a_two_rank_checkpoint_on_another_world_size(tmp_path: Path) -> None:
    """conveyor.DataLoader over torch's DistributedSampler: saved by 2 ranks after 2 steps
    each, the rest of the epoch is read by 1 rank, and by 3, every item once."""
    saved = tmp_path / "saved"
    launch = under_torchrun("dcp_resume.py", "dataloader")
    run(launch(saved, kill_at=2), tmp_path, killed=True)
    finish_epoch_elsewhere(saved, tmp_path, launch, dcp_killed_save, (1, 3), steps=2)


def finish_epoch_elsewhere(
    saved: Path, tmp_path: Path, launch: Any, checkpoint: Checkpoint, world_sizes: tuple[int, ...], steps: int
) -> None:
    """The state a 2-rank run saved after ``steps`` steps, resumed on each world size of
    ``world_sizes`` by a run that reads the rest of its epoch (``--finish-epoch``): every
    item once."""
    for world_size in world_sizes:
        out = resumable_copy(saved, world_size, steps)
        run([*launch(out, resume=checkpoint(out, steps), ranks=world_size), "--finish-epoch"], tmp_path)
        every_item_once(out)


def resumable_copy(saved: Path, world_size: int, steps: int) -> Path:
    """A copy of a run's folder for one resume from its checkpoint of step ``steps``: the
    resumes of one save on several world sizes each go on from the same state (the save is
    made once). Its logs keep the steps up to that checkpoint (the run that saved it may
    have trained on after it)."""
    out = saved.with_name(f"resumed-on-{world_size}")
    shutil.copytree(saved, out)
    (out / "weights.json").unlink(missing_ok=True)
    for log in out.glob("batches-rank*.jsonl"):
        lines = log.read_text().splitlines(keepends=True)
        assert len(lines) >= steps, f"{log.name}: {len(lines)} steps logged before a checkpoint of step {steps}"
        log.write_text("".join(lines[:steps]))
    return out


def every_item_once(out: Path) -> None:
    ranks = range(len(list(out.glob("batches-rank*.jsonl"))))
    items = [key for rank in ranks for batch in batches(out, rank) for key in batch]
    assert sorted(items) == list(range(64))
