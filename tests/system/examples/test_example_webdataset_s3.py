"""examples/webdataset_s3_training.py runs as its docstring says: WebDataset shards written to
an S3-protocol server, read back by conveyor, a model trained, a mid-epoch checkpoint
resumed exactly, and the server it started gone when it ends."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
import s3fs
import torch

from s3_server import s3_endpoint, s3_options  # noqa: F401 - the fixture

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "webdataset_s3_training.py"
RUN_TIMEOUT_S = 150
EPOCH_LINE = re.compile(r"^epoch (\d): 16 batches, mean loss (\d+\.\d+)$", re.MULTILINE)
SERVER_LINE = re.compile(r"^S3 server: moto, pid (\d+), at http://127\.0\.0\.1:\d+$", re.MULTILINE)


@contextmanager
def example_run(*arguments: str) -> Iterator[subprocess.CompletedProcess[str]]:
    """The example run to its end, in a session of its own: whatever of it is still there
    when the block ends (its server, its workers) is killed, however the test went."""
    process = subprocess.Popen(
        [sys.executable, str(EXAMPLE), *arguments],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        try:
            stdout, stderr = process.communicate(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            pytest.fail(f"the example did not end within {RUN_TIMEOUT_S} s:\n{stdout}{stderr}")
        yield subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    finally:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)


def running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def check_training_and_resume(done: subprocess.CompletedProcess[str]) -> None:
    """It ran without error, learnt something, and its resume was exact."""
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    losses = [float(loss) for _, loss in EPOCH_LINE.findall(done.stdout)]
    assert len(losses) == 2, output
    assert losses[1] < losses[0], output
    lines = done.stdout.splitlines()
    assert "same batches after the checkpoint: yes (10 in the first run)" in lines, output
    assert "resume exact: yes" in lines, output


def check_checkpoint(folder: Path) -> None:
    """The checkpoint is where the example was told to put it, in the formats it promises."""
    assert json.loads((folder / "loader.json").read_text())
    saved = torch.load(folder / "model_and_optimizer.pt")
    assert set(saved) == {"model", "optimizer"}


@pytest.mark.timeout(180)
def test_the_example_with_a_server_of_its_own_resumes_exactly_and_stops_it(tmp_path: Path) -> None:
    with example_run("--checkpoint-dir", str(tmp_path)) as done:
        check_training_and_resume(done)
        check_checkpoint(tmp_path)
        started = SERVER_LINE.search(done.stdout)
        assert started is not None, done.stdout
        server = int(started.group(1))
        assert f"S3 server: pid {server} stopped" in done.stdout.splitlines(), done.stdout
        assert not running(server), f"the example's S3 server (pid {server}) outlived it"


@pytest.mark.timeout(180)
def test_the_example_with_a_given_endpoint_writes_its_shards_there(s3_endpoint: str, tmp_path: Path) -> None:  # noqa: F811
    bucket = "example-webdataset-s3"
    with example_run("--endpoint", s3_endpoint, "--bucket", bucket, "--checkpoint-dir", str(tmp_path)) as done:
        check_training_and_resume(done)
        assert SERVER_LINE.search(done.stdout) is None, done.stdout  # it started no server of its own
    shards = s3fs.S3FileSystem(**s3_options(s3_endpoint)).ls(bucket)
    assert shards == [f"{bucket}/shard-{shard:06d}.tar" for shard in range(4)]
