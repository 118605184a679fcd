"""Chaos resume: a 2-rank training job, checkpointing every 2 steps, is killed from outside
with SIGKILL at 5 moments drawn from a seeded RNG (one of them right after an epoch's last
step) and resumed each time from its newest complete checkpoint; it must train on exactly
the batches the uninterrupted run trained on, and end with bit-identical weights.

Two jobs: ``examples/lightning_resume.py`` (Lightning DDP on the CPU, ``conveyor.DataLoader``
sharded by Lightning's ``DistributedSampler``, a generator per rank) and
``examples/dcp_resume.py`` under ``torchrun`` (``torch.distributed.checkpoint``).

How the moments are made. A moment is "rank 0 has begun step ``T``" (its batch log has
the line of step ``T``), then a seeded pause of up to 1.5 steps, so that the kill lands
anywhere in a step, now and then in a checkpoint's write; or "the checkpoint of an epoch's
last step is complete", killed at once. The examples sleep ``--step-seconds`` in every
step, so that a watcher that polls files is not steps late on a loaded machine, and the run
is still going when its moment comes (no moment is in the last 8 steps); the launches no
one kills (the uninterrupted run, the last) do not sleep.

How a run is killed. Every launch gets a session of its own; the kill stops (SIGSTOP) its
process group, then every other process of the run (``torchrun`` starts each rank in a
session of its own, so a SIGKILL to the group alone would leave the ranks and their loader
workers running), then SIGKILLs them all, and waits until none is left.

How a resume picks its checkpoint. Each launch writes into a directory of its own, so no
launch overwrites a checkpoint that an earlier one wrote. Lightning writes a checkpoint to
a temporary file and moves it into place: atomic when ``TMPDIR`` is on the checkpoint's
filesystem (here: it points into the test's directory), a copy otherwise, which a kill can
cut short; so a Lightning checkpoint counts when it loads and names its own step. A DCP
checkpoint counts when it has the ``complete`` mark, which rank 0 makes after ``dcp.save``
and a barrier have returned. The resume takes the newest of all launches' checkpoints.

Each job is 7 launches (the uninterrupted run, 5 killed, the last) of 8-10 s each on an
idle machine: 1-2 minutes a job on a busy 2-core machine, up to 4 with two CPU hogs too.
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
import json
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from launches import launched, run_to_end, torchrun

torch = pytest.importorskip("torch")

# Lightning runs in the launches (and the checkpoints it loads): found, not imported
# (seconds of CPU in every pytest-xdist worker that collects this module).
pytestmark = [
    pytest.mark.timing,
    pytest.mark.timeout(1200),
    pytest.mark.skipif(
        importlib.util.find_spec("pytorch_lightning") is None, reason="pytorch_lightning is not installed"
    ),
]

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
SEED = 30
KILLS = 5
EPOCHS, STEPS_PER_EPOCH = 3, 8  # 64 items in batches of 4 on each of 2 ranks
STEPS = EPOCHS * STEPS_PER_EPOCH
EVERY = 2  # a checkpoint every 2 steps
STEP_S = 0.1  # --step-seconds
LATE_MARGIN = 8  # no moment in the last 8 steps: a late watcher still finds the run going
DEADLINE_S = 300  # for one launch to start, reach a moment, or end


# -- what the runs wrote --------------------------------------------------------------------


def records(out: Path, rank: int) -> list[dict[str, Any]]:
    """The batch log's complete lines (a kill may cut the last one short)."""
    try:
        text = (out / f"batches-rank{rank}.jsonl").read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.split("\n")[:-1]]


def last_step(out: Path) -> int:
    logged = records(out, 0)
    return logged[-1]["step"] if logged else -1


def began(out: Path, step: int) -> bool:
    return last_step(out) >= step


def checkpointed(checkpoints: Callable[[Path], dict[int, Path]], out: Path, step: int) -> bool:
    return max(checkpoints(out), default=-1) >= step


_loadable: set[Path] = set()


def lightning_checkpoints(out: Path) -> dict[int, Path]:
    """The complete checkpoints a Lightning launch wrote, by step: those that load, and say
    they are of the step their name says."""
    complete = {}
    for path in (out / "checkpoints").glob("step=*.ckpt"):
        step = int(path.stem.removeprefix("step="))
        if path not in _loadable:
            try:
                checkpoint = torch.load(path, map_location="cpu", weights_only=False)
            except Exception:  # cut short by the kill (or still being copied into place)
                continue
            if checkpoint.get("global_step") != step:
                continue
            _loadable.add(path)
        complete[step] = path
    return complete


def dcp_checkpoints(out: Path) -> dict[int, Path]:
    """The DCP checkpoints a launch wrote, by step, that rank 0 marked complete."""
    return {
        int(path.parent.name.removeprefix("step-")): path.parent
        for path in (out / "checkpoints").glob("step-*/complete")
    }


def check_batches(reference: Path, out: Path, start: int) -> None:
    """Every batch that a launch resumed at step ``start`` logged is the uninterrupted run's."""
    for rank in range(2):
        expected = records(reference, rank)
        assert len(expected) == STEPS
        got = records(out, rank)
        assert len(got) <= STEPS - start, f"{out.name}, rank {rank}: more steps than the training has"
        for offset, record in enumerate(got):
            assert record == expected[start + offset], (
                f"{out.name} (resumed at step {start}), rank {rank}: its batch {offset} (step {start + offset})"
                f" differs from the uninterrupted run's:\n{record}\n{expected[start + offset]}"
            )


# -- the chaos ------------------------------------------------------------------------------


@dataclass
class Moment:
    step: int
    kind: str  # "step": rank 0 has begun step `step`; "checkpoint": step `step`'s is complete
    pause: float  # seconds between that and the kill

    def __str__(self) -> str:
        if self.kind == "checkpoint":
            return f"when the checkpoint of step {self.step} (an epoch's last) is complete"
        return f"{self.pause:.3f} s after rank 0 began step {self.step}"


def kill_moments(seed: int) -> list[Moment]:
    """5 moments in step order, 2 steps apart at least (each resume gets past its
    checkpoint), none in the last ``LATE_MARGIN`` steps; one right after an epoch's end."""
    rng = random.Random(seed)
    epoch_end = STEPS_PER_EPOCH * rng.randint(1, EPOCHS - 1)
    candidates = [step for step in range(1, STEPS - LATE_MARGIN + 1) if abs(step - epoch_end) >= 2]
    while True:
        steps = sorted([*rng.sample(candidates, KILLS - 1), epoch_end])
        if all(later - earlier >= 2 for earlier, later in itertools.pairwise(steps)):
            break
    return [
        Moment(step, "checkpoint", 0.0) if step == epoch_end else Moment(step, "step", rng.uniform(0, 1.5 * STEP_S))
        for step in steps
    ]


def chaos(
    tmp_path: Path,
    command: Callable[[Path, Path | None, bool], list[str]],
    checkpoints: Callable[[Path], dict[int, Path]],
) -> None:
    (tmp_path / "tmp").mkdir()
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "lo",
        "TMPDIR": str(tmp_path / "tmp"),  # what a killed run leaves there stays in the test's directory
    }
    reference = tmp_path / "reference"
    run_to_end(command(reference, None, False), reference, env)

    moments = kill_moments(SEED)
    launches: list[Path] = []
    resume: tuple[int, Path] | None = None  # the newest complete checkpoint: its step and path
    for number, moment in enumerate(moments):
        out = tmp_path / f"launch-{number}"
        start = resume[0] if resume else 0
        launches.append(out)
        with launched(command(out, resume[1] if resume else None, True), out, env) as launch:
            if moment.kind == "checkpoint":
                # A launch resumed past the epoch's end (a late kill before) is killed at its first checkpoint.
                reached = functools.partial(checkpointed, checkpoints, out, moment.step)
            else:
                reached = functools.partial(began, out, moment.step)
            launch.wait_until(reached, f"moment: {moment}")
            time.sleep(moment.pause)
            launch.kill()
        written = {step: path for launch_out in launches for step, path in checkpoints(launch_out).items()}
        resume = max(written.items()) if written else None
        # What happened, shown with a failure (and by -s or -rP).
        print(f"{out.name} from step {start}, killed {moment} (rank 0 logged step {last_step(out)})")
        print(f"  newest complete checkpoint: {resume[1] if resume else None}")
        check_batches(reference, out, start)
    out = tmp_path / "launch-end"
    start = resume[0] if resume else 0
    print(f"{out.name} from step {start}, to the end")
    run_to_end(command(out, resume[1] if resume else None, False), out, env)
    for rank in range(2):
        assert len(records(out, rank)) == STEPS - start, f"rank {rank}: the last launch stopped short"
    check_batches(reference, out, start)
    assert (out / "weights.json").read_text() == (reference / "weights.json").read_text()


def test_lightning_ddp_killed_at_random_moments_resumes_exactly(tmp_path: Path) -> None:
    def command(out: Path, resume: Path | None, paced: bool) -> list[str]:
        launch = [sys.executable, str(EXAMPLES / "lightning_resume.py"), "--out", str(out), "--devices", "2"]
        launch += ["--generator", "per-rank", "--every", str(EVERY), "--epochs", str(EPOCHS)]
        launch += ["--step-seconds", str(STEP_S)] if paced else []
        return launch + (["--resume", str(resume)] if resume else [])

    chaos(tmp_path, command, lightning_checkpoints)


def test_torchrun_dcp_killed_at_random_moments_resumes_exactly(tmp_path: Path) -> None:
    def command(out: Path, resume: Path | None, paced: bool) -> list[str]:
        launch = [*torchrun(), "--standalone", "--nproc-per-node", "2", str(EXAMPLES / "dcp_resume.py")]
        launch += ["--out", str(out), "--generator", "per-rank", "--save-every", str(EVERY), "--epochs", str(EPOCHS)]
        launch += ["--step-seconds", str(STEP_S)] if paced else []
        return launch + (["--resume-from", str(resume)] if resume else [])

    chaos(tmp_path, command, dcp_checkpoints)
