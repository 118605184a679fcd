"""Exact resume under Hugging Face Accelerate: train, save_state, get killed, load_state.

A tiny regression model trains for two epochs on 64 items (``batch_size=4``, 2 loader
workers) with an ``Accelerator``, on one process or several (``torchrun
--nproc-per-node 2``, gloo on the CPU). ``accelerator.prepare()`` keeps the
``conveyor.DataLoader`` as it is and shards it by process, as it shards torch's;
``save_state``/``load_state`` save and load its state (every process's part) with no
extra line. ``--kill-at N`` saves the state after step ``N`` and kills every process
with SIGKILL; ``--resume`` loads the latest state and trains on. Each process appends
the batches it trained on to ``OUT/batches-rank{r}.jsonl``; the final weights go to
``OUT/weights.json``.

    torchrun --nproc-per-node 2 examples/accelerate_resume.py --out run-a
    torchrun --nproc-per-node 2 examples/accelerate_resume.py --out run-b --kill-at 8
    torchrun --nproc-per-node 2 examples/accelerate_resume.py --out run-b --resume

``--save-every N`` also saves after every ``N``-th step, into ``OUT/checkpoints/step-{step}``;
``--resume-from DIR`` loads such a state (any ``save_state`` folder with its
``progress.json``) instead of ``OUT/state``.

    torchrun --nproc-per-node 2 examples/accelerate_resume.py --out run-c --save-every 4
    torchrun --nproc-per-node 2 examples/accelerate_resume.py --out run-d --resume-from run-c/checkpoints/step-4

``--finish-epoch`` with ``--resume`` reads only the rest of the saved epoch (no training)
and stops: run on another number of processes (``--nproc-per-node 1`` or ``3``), the new
processes share every item the old job had not handed out, once.

``--loader dataloader2`` reads a ``DataLoader2`` over a pipe graph instead (sharded by
process with a ``DistributedReadingService`` in front of its worker processes), which
``prepare()`` does not take: ``accelerator.register_for_checkpointing(loader)`` is the one
line that puts it into ``save_state``/``load_state``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration, set_seed
from numbered_data import BATCH, ITEMS, WORKERS, Numbers, numbers_pipe_loader

from conveyor import DataLoader


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--generator", choices=["none", "shared", "per-rank"], default="none")
    parser.add_argument("--loader", choices=["dataloader", "dataloader2"], default="dataloader")
    parser.add_argument("--kill-at", type=int, default=None, help="save after this step, then SIGKILL")
    parser.add_argument("--resume", action="store_true", help="load the state saved in OUT/state and go on")
    parser.add_argument("--save-every", type=int, default=None, help="save OUT/checkpoints/step-N every N steps")
    parser.add_argument("--resume-from", type=Path, default=None, help="load this saved state and go on")
    parser.add_argument(
        "--finish-epoch", action="store_true", help="after a resume, read the rest of its epoch only, then stop"
    )
    args = parser.parse_args(argv)
    accelerator = Accelerator(cpu=True, project_config=ProjectConfiguration(project_dir=str(args.out)))
    args.out.mkdir(parents=True, exist_ok=True)
    set_seed(7)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = None
    if args.generator != "none":
        seed = 1234 + (accelerator.process_index if args.generator == "per-rank" else 0)
        generator = torch.Generator().manual_seed(seed)
    if args.loader == "dataloader2":
        loader: Any = numbers_pipe_loader(distributed=torch.distributed.is_initialized(), seed=11)
        model, optimizer = accelerator.prepare(model, optimizer)
        accelerator.register_for_checkpointing(loader)  # the one line a DataLoader2 needs
    else:
        loader = DataLoader(Numbers(), batch_size=BATCH, shuffle=True, num_workers=WORKERS, generator=generator)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    step = 0
    resume_from = args.resume_from or (args.out / "state" if args.resume else None)
    if resume_from is not None:
        accelerator.load_state(str(resume_from))
        step = json.loads((resume_from / "progress.json").read_text())["step"]
    log = args.out / f"batches-rank{accelerator.process_index}.jsonl"
    steps_per_epoch = len(loader)
    if args.finish_epoch:  # on another number of processes, say: the rest of the saved epoch, shared by them
        for x, _ in loader:
            with open(log, "a") as out:
                out.write(json.dumps({"step": step, "items": x.flatten().int().tolist()}) + "\n")
            step += 1
        args.epochs = 0
    while step < args.epochs * steps_per_epoch:
        for x, y in loader:
            with open(log, "a") as out:
                out.write(json.dumps({"step": step, "items": x.flatten().int().tolist()}) + "\n")
            loss = torch.nn.functional.mse_loss(model(x / ITEMS), y / ITEMS)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            if args.save_every and step % args.save_every == 0:
                save(accelerator, args.out / "checkpoints" / f"step-{step}", step)
            if step == args.kill_at:
                save(accelerator, args.out / "state", step)
                os.kill(os.getpid(), signal.SIGKILL)
    loader.shutdown()
    if accelerator.is_main_process:
        weights = {name: value.tolist() for name, value in accelerator.unwrap_model(model).state_dict().items()}
        (args.out / "weights.json").write_text(json.dumps(weights))
    accelerator.end_training()


def save(accelerator: Accelerator, path: Path, step: int) -> Any:
    accelerator.save_state(str(path))  # every process calls it: the loader's state holds every part
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (path / "progress.json").write_text(json.dumps({"step": step}))
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
