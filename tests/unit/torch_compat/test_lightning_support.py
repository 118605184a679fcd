"""conveyor.LightningResume in a real Lightning Trainer: a resumed epoch whose loader
is longer once its state is loaded runs to the loader's end, and nothing else changes.
(The whole job, DataLoader2 saved on 2 processes and resumed on 3, is in
tests/system/training/test_framework_resume.py.)

Lightning (and conveyor.LightningResume, which imports it) is imported by the tests, not
with the module: every pytest-xdist worker collects this module, and the import costs
seconds of CPU."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

STEPS = 5


class GrowsOnResume:
    """Batches ``0..STEPS-1``; a state loaded from step ``k`` goes on with ``k..STEPS``:
    one batch more, as an epoch resumed on more processes can be, and ``len()`` says so."""

    def __init__(self) -> None:
        self.start, self.length = 0, STEPS

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[Any]:
        for step in range(self.start, self.length):
            self.position = step + 1
            yield torch.full((1, 1), float(step))
        self.start, self.length = 0, STEPS

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.start, self.length = state["position"], STEPS + 1


@functools.cache
def recorder() -> Any:
    """The model: it records the batches it trained on."""
    import pytorch_lightning as pl

    class Recorder(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.seen: list[int] = []

        def train_dataloader(self) -> GrowsOnResume:
            return GrowsOnResume()

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            self.seen.append(int(batch.item()))
            return self.layer(batch).sum()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return Recorder


def fit(
    tmp_path: Path, callbacks: list[Any], resume: Path | None = None, without_ours: bool = False, **trainer_args: Any
) -> Any:
    import pytorch_lightning as pl

    from conveyor import LightningResume

    model = recorder()()
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=1,
        callbacks=callbacks,
        default_root_dir=tmp_path,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=resume is None,
        **trainer_args,
    )
    if without_ours:  # the one conveyor's entry point gave every Trainer, taken out
        trainer.callbacks = [callback for callback in trainer.callbacks if not isinstance(callback, LightningResume)]
    trainer.fit(model, ckpt_path=str(resume) if resume else None)
    return model


@pytest.fixture
def checkpoint_at_step_2(tmp_path: Path) -> Path:
    import pytorch_lightning as pl

    saver = pl.callbacks.ModelCheckpoint(
        dirpath=tmp_path / "ckpt", filename="{step}", every_n_train_steps=2, save_top_k=-1
    )
    fit(tmp_path, [saver])
    return tmp_path / "ckpt" / "step=2.ckpt"


@pytest.mark.timeout(120)
def test_a_resumed_epoch_longer_than_lightning_counted_runs_to_the_loaders_end(
    tmp_path: Path, checkpoint_at_step_2: Path
) -> None:
    from conveyor import LightningResume

    assert fit(tmp_path, [LightningResume()], checkpoint_at_step_2).seen == [2, 3, 4, 5]


@pytest.mark.timeout(120)
def test_without_it_lightning_ends_that_epoch_at_its_count(tmp_path: Path, checkpoint_at_step_2: Path) -> None:
    """What the callback is for: the batch past Lightning's count is never read."""
    assert fit(tmp_path, [], checkpoint_at_step_2, without_ours=True).seen == [2, 3, 4]


@pytest.mark.timeout(120)
def test_every_trainer_has_it_through_lightnings_entry_point(tmp_path: Path, checkpoint_at_step_2: Path) -> None:
    import pytorch_lightning as pl

    from conveyor import LightningResume

    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, default_root_dir=tmp_path)
    assert sum(isinstance(callback, LightningResume) for callback in trainer.callbacks) == 1
    assert fit(tmp_path, [], checkpoint_at_step_2).seen == [2, 3, 4, 5]  # no line of the user's


@pytest.mark.timeout(120)
def test_a_limit_the_user_set_stands(tmp_path: Path, checkpoint_at_step_2: Path) -> None:
    from conveyor import LightningResume

    seen = fit(tmp_path, [LightningResume()], checkpoint_at_step_2, limit_train_batches=4).seen
    assert seen == [2, 3]


@pytest.mark.timeout(120)
def test_a_run_that_does_not_resume_is_unchanged(tmp_path: Path) -> None:
    from conveyor import LightningResume

    assert fit(tmp_path, [LightningResume()]).seen == [0, 1, 2, 3, 4]
