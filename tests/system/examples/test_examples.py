"""The examples in examples/ run as documented and say what they promise."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from launches import torchrun

pytest.importorskip("torch.distributed")

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


@pytest.mark.timeout(240)
def test_distributed_training_under_torchrun(tmp_path):
    done = subprocess.run(
        [
            *torchrun(),
            "--standalone",
            "--nproc-per-node",
            "2",
            str(EXAMPLES / "distributed_training.py"),
            "--checkpoint-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=200,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    for rank in (0, 1):
        epochs = [line for line in lines if re.match(rf"rank {rank}/2: epoch \d: 12 batches", line)]
        assert len(epochs) == 2, done.stdout  # 13 and 12 batches of data: both ranks stop at 12
        assert f"rank {rank}/2: resumed after batch 5: 7 batches, exact" in lines, done.stdout
        assert (tmp_path / f"loader_rank{rank}.json").exists()
    assert "fullsync: epoch 0 ended on rank 0/2 after 12 items; dropped 1 item read ahead" in done.stderr
