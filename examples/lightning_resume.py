"""Exact resume inside PyTorch Lightning: train, checkpoint, get killed, resume.

A tiny regression model trains for two epochs on 64 items (``batch_size=4``, 2 loader
workers), on one process or as 2-process DDP on the CPU (gloo). ``ModelCheckpoint`` saves
every few steps; ``--kill-at N`` kills every process with SIGKILL as step ``N + 1``
begins (after step ``N``'s checkpoint, so at an epoch's last step too), and
``--resume CKPT`` goes on from a checkpoint. Each rank appends the batches it trained on to
``OUT/batches-rank{r}.jsonl``; the final weights go to ``OUT/weights.json``. Run it
uninterrupted, then killed and resumed: the resumed run trains on exactly the batches
the uninterrupted one trained on after that checkpoint, and ends with the same weights.
``--step-seconds S`` sleeps ``S`` seconds in every training step, so that a test can kill
the run from outside at a step of its choosing.

    python examples/lightning_resume.py --out run-a
    python examples/lightning_resume.py --out run-b --kill-at 16       # an epoch's last step
    python examples/lightning_resume.py --out run-b --resume run-b/checkpoints/step=16.ckpt

``--loader dataloader`` (the default) is ``conveyor.DataLoader``, which Lightning shards
with its own ``DistributedSampler`` as it shards torch's; ``--loader dataloader2`` is a
``DataLoader2`` over a pipe graph, through worker processes, sharded by rank with a
``DistributedReadingService`` under DDP. The loaders' ``state_dict()`` goes into
Lightning's checkpoint, and every rank's part is in the copy rank 0 writes. Nothing
conveyor-specific is needed: installing conveyor gives every ``Trainer`` the
``conveyor.LightningResume`` callback (through Lightning's entry point for external
callbacks), which hands a loader the state Lightning leaves unloaded after an earlier resume
from an epoch's last step, and lets an epoch resumed on more processes run to its end.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from numbered_data import BATCH, ITEMS, WORKERS, Numbers, numbers_pipe_loader
from pytorch_lightning.callbacks import ModelCheckpoint

from conveyor import DataLoader


class Regression(pl.LightningModule):
    def __init__(self, out: Path, loader: str, generator: str, step_seconds: float = 0.0) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.out, self.loader_kind, self.generator_kind = out, loader, generator
        self.step_seconds = step_seconds

    def train_dataloader(self) -> Any:
        if self.loader_kind == "dataloader2":
            return numbers_pipe_loader(distributed=torch.distributed.is_initialized())
        generator = None
        if self.generator_kind != "none":
            seed = 1234 + (self.global_rank if self.generator_kind == "per-rank" else 0)
            generator = torch.Generator().manual_seed(seed)
        return DataLoader(Numbers(), batch_size=BATCH, shuffle=True, num_workers=WORKERS, generator=generator)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        record = {"epoch": self.current_epoch, "step": self.global_step, "items": x.flatten().int().tolist()}
        with open(self.out / f"batches-rank{self.global_rank}.jsonl", "a") as log:
            log.write(json.dumps(record) + "\n")
        if self.step_seconds:
            time.sleep(self.step_seconds)
        return torch.nn.functional.mse_loss(self.layer(x / ITEMS), y / ITEMS)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class KillAt(pl.Callback):
    """SIGKILL every process as step ``step + 1`` begins: the checkpoint of step ``step``
    is on disk, and nothing after it ran."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument(
        "--strategy", default=None, help="Lightning's strategy (default: ddp for several devices, else auto)"
    )
    parser.add_argument("--loader", choices=["dataloader", "dataloader2"], default="dataloader")
    parser.add_argument("--generator", choices=["none", "shared", "per-rank"], default="none")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--every", type=int, default=4, help="checkpoint every N steps")
    parser.add_argument("--kill-at", type=int, default=None)
    parser.add_argument("--resume", type=Path, default=None)
    parser.add_argument("--step-seconds", type=float, default=0.0, help="sleep this long in every step")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    pl.seed_everything(7, workers=True)
    checkpoints = ModelCheckpoint(
        dirpath=args.out / "checkpoints", filename="{step}", every_n_train_steps=args.every, save_top_k=-1
    )
    callbacks: list[pl.Callback] = [checkpoints]
    if args.kill_at is not None:
        callbacks.append(KillAt(args.kill_at))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy=args.strategy or ("ddp" if args.devices > 1 else "auto"),
        max_epochs=args.epochs,
        callbacks=callbacks,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    model = Regression(args.out, args.loader, args.generator, args.step_seconds)
    trainer.fit(model, ckpt_path=str(args.resume) if args.resume else None)
    if trainer.global_rank == 0:
        weights = {name: value.tolist() for name, value in model.state_dict().items()}
        (args.out / "weights.json").write_text(json.dumps(weights))


if __name__ == "__main__":
    main()
