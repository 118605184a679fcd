"""Exact resume with ``torch.distributed.checkpoint`` (DCP) in a plain ``torchrun`` job.

Each rank trains a tiny regression model with DDP on its share of 64 items
(``batch_size=4``, 2 loader workers), for two epochs. The loader goes into DCP's state
dict as it is, beside the model and the optimizer: DCP calls its ``state_dict()`` on every
rank (each rank's call gathers every rank's part, so the one copy DCP keeps resumes all
of them) and, on load, builds its template from a fresh loader's ``state_dict()``, which
starts nothing. ``--kill-at N`` saves after step ``N`` and kills every rank with SIGKILL;
``--resume`` loads the checkpoint and trains on. Each rank appends the batches it trained
on to ``OUT/batches-rank{r}.jsonl``; rank 0 writes the final weights to
``OUT/weights.json``.

    torchrun --nproc-per-node 2 examples/dcp_resume.py --out run-a
    torchrun --nproc-per-node 2 examples/dcp_resume.py --out run-b --kill-at 8
    torchrun --nproc-per-node 2 examples/dcp_resume.py --out run-b --resume

``--save-every N`` also saves after every ``N``-th step, into ``OUT/checkpoints/step-{step}``,
and rank 0 then marks it complete with an empty file ``complete`` in it (after ``dcp.save``
and a barrier have returned on every rank: a run killed mid-save leaves no mark);
``--resume-from DIR`` loads such a checkpoint (any DCP checkpoint) instead of
``OUT/checkpoint``. ``--step-seconds S`` sleeps ``S`` seconds in every step, so that a test
can kill the job from outside at a step of its choosing.

    torchrun --nproc-per-node 2 examples/dcp_resume.py --out run-c --save-every 2
    torchrun --nproc-per-node 2 examples/dcp_resume.py --out run-d --resume-from run-c/checkpoints/step-6

``--finish-epoch`` with a resume reads only the rest of the saved epoch (no training) and
stops: run on another number of ranks (``--nproc-per-node 1`` or ``3``), the new ranks share
every item the old job had not handed out, once.

``--loader dataloader`` (the default) is ``conveyor.DataLoader`` with torch's
``DistributedSampler``, as a DDP script shards torch's loader; ``--loader dataloader2`` is
a ``DataLoader2`` sharded by a ``DistributedReadingService`` in front of worker processes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from numbered_data import BATCH, ITEMS, WORKERS, Numbers, numbers_pipe_loader
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel

from conveyor import DataLoader


def make_loader(kind: str, generator: str) -> tuple[Any, Any]:
    """``(the loader, the sampler whose epoch the loop sets, if any)``."""
    if kind == "dataloader2":
        return numbers_pipe_loader(distributed=True, seed=11), None
    sampler = torch.utils.data.DistributedSampler(Numbers(), shuffle=True, seed=11)
    rng = None
    if generator != "none":
        rng = torch.Generator().manual_seed(1234 + (dist.get_rank() if generator == "per-rank" else 0))
    loader = DataLoader(Numbers(), batch_size=BATCH, sampler=sampler, num_workers=WORKERS, generator=rng)
    return loader, sampler


def save(path: Path, model: Any, optimizer: Any, loader: Any, step: int, epoch: int) -> None:
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {
        "model": model_state,
        "optimizer": optimizer_state,
        "loader": loader,
        "step": torch.tensor(step),
        "epoch": torch.tensor(epoch),
    }
    dcp.save(state, checkpoint_id=str(path))
    dist.barrier()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--loader", choices=["dataloader", "dataloader2"], default="dataloader")
    parser.add_argument("--generator", choices=["none", "shared", "per-rank"], default="none")
    parser.add_argument("--kill-at", type=int, default=None, help="save after this step, then SIGKILL")
    parser.add_argument("--resume", action="store_true", help="load OUT/checkpoint and go on")
    parser.add_argument("--save-every", type=int, default=None, help="save OUT/checkpoints/step-N every N steps")
    parser.add_argument("--resume-from", type=Path, default=None, help="load this checkpoint and go on")
    parser.add_argument("--step-seconds", type=float, default=0.0, help="sleep this long in every step")
    parser.add_argument(
        "--finish-epoch", action="store_true", help="after a resume, read the rest of its epoch only, then stop"
    )
    args = parser.parse_args(argv)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(7)
    model = DistributedDataParallel(torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader, sampler = make_loader(args.loader, args.generator)
    step = epoch = 0
    resume_from = args.resume_from or (args.out / "checkpoint" if args.resume else None)
    if resume_from is not None:
        model_state, optimizer_state = get_state_dict(model, optimizer)
        state = {
            "model": model_state,
            "optimizer": optimizer_state,
            "loader": loader,
            "step": torch.tensor(0),
            "epoch": torch.tensor(0),
        }
        dcp.load(state, checkpoint_id=str(resume_from))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
        step, epoch = int(state["step"]), int(state["epoch"])
    steps_per_epoch = len(loader)
    log = args.out / f"batches-rank{rank}.jsonl"
    if args.finish_epoch:  # on another world size, say: the rest of the saved epoch, shared by these ranks
        if sampler is not None:
            sampler.set_epoch(epoch)
        for x, _ in loader:
            with open(log, "a") as out:
                out.write(json.dumps({"step": step, "items": x.flatten().int().tolist()}) + "\n")
            step += 1
        args.epochs = 0
    while step < args.epochs * steps_per_epoch:
        if sampler is not None:
            sampler.set_epoch(step // steps_per_epoch)
        for x, y in loader:
            with open(log, "a") as out:
                out.write(json.dumps({"step": step, "items": x.flatten().int().tolist()}) + "\n")
            if args.step_seconds:
                time.sleep(args.step_seconds)
            loss = torch.nn.functional.mse_loss(model(x / ITEMS), y / ITEMS)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            if args.save_every and step % args.save_every == 0:
                path = args.out / "checkpoints" / f"step-{step}"
                if rank == 0:  # a mark from an earlier run into this OUT is not this save's
                    (path / "complete").unlink(missing_ok=True)
                save(path, model, optimizer, loader, step, (step - 1) // steps_per_epoch)
                if rank == 0:
                    (path / "complete").touch()
            if step == args.kill_at:
                save(args.out / "checkpoint", model, optimizer, loader, step, (step - 1) // steps_per_epoch)
                os.kill(os.getpid(), signal.SIGKILL)
    if rank == 0:
        weights = {name: value.tolist() for name, value in model.module.state_dict().items()}
        (args.out / "weights.json").write_text(json.dumps(weights))
    loader.shutdown()
    # DDP's reducer must go before the process group: released after it, its gloo group's
    # destructor waits for a thread that waits for the interpreter lock (a hang at exit).
    del model, optimizer
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
