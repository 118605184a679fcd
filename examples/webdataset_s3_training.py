"""Training on WebDataset shards in S3, with a mid-epoch checkpoint and an exact resume. Run it as:

    .venv/bin/python examples/webdataset_s3_training.py [--endpoint URL] [--checkpoint-dir DIR]

Without ``--endpoint`` the job starts its own S3-protocol server (moto's, on 127.0.0.1 at a
free port) and stops it when it ends, after an error or Ctrl-C too; it prints the server's pid.
With it, the job uses the server at URL (credentials "testing"/"testing", as moto accepts)
and leaves its bucket there.

It writes 256 small synthetic JPEG images of four classes (a colour and a stripe pattern
each) as four WebDataset shards with the ``webdataset`` package's ``TarWriter``, straight
into ``s3://<bucket>/shard-000000.tar`` ... ``shard-000003.tar``. conveyor reads them back
from S3 in two worker processes: shards shuffled and shared out between the workers,
samples shuffled, JPEGs decoded, each image cropped at random (the crop drawn from a
generator conveyor keys by the sample, so a resumed run draws the same crops), batched and
collated to tensors. A small convolutional network learns the classes for two epochs.

Midway through the last epoch the job saves the loader's state (JSON) and the model's and
optimizer's (``torch.save``) under the checkpoint folder, then finishes the epoch, noting
each batch it trains on (sample keys and a hash of the pixels) and the final weights. A
fresh loader, model and optimizer then load the checkpoint and finish the same epoch: they
must see exactly the same batches and end with exactly the same weights. The verdict is
the line ``resume exact: yes`` or ``resume exact: NO`` (and the exit code is then 1).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import s3fs
import torch
from PIL import Image
from webdataset import TarWriter

from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.pipes import IterableWrapper, IterDataPipe

SHARDS, SAMPLES_PER_SHARD = 4, 64
IMAGE_SIZE, CROP_SIZE, BATCH_SIZE = 64, 48, 16
#: Each class is an RGB colour and whether its stripes are horizontal (0) or vertical (1).
CLASSES = (((200, 40, 40), 0), ((40, 170, 60), 1), ((50, 70, 210), 0), ((220, 200, 50), 1))
EPOCHS, CHECKPOINT_AFTER_BATCHES, SEED = 2, 6, 2026
SERVER_START_TIMEOUT_S, SERVER_STOP_TIMEOUT_S = 60.0, 10.0

Batch = tuple[list[str], torch.Tensor, torch.Tensor]  # sample keys, crops, labels
Fingerprint = tuple[list[str], str]  # sample keys, a hash of the crops' pixels
Weights = dict[str, torch.Tensor]


def say(line: str) -> None:
    """Write one line and flush it, so a caller reading the output sees it at once."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def storage_options(endpoint: str) -> dict[str, Any]:
    """s3fs's options for the server at ``endpoint``; conveyor passes them to fsspec only."""
    return {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-west-2"},
        "skip_instance_cache": True,
    }


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_until_up(url: str, server: subprocess.Popen[bytes]) -> None:
    """Return once the server answers at ``url``; raise if it exits or stays silent."""
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the S3 server exited with code {server.returncode} before it answered")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.1)
    raise RuntimeError(f"the S3 server did not answer at {url} within {SERVER_START_TIMEOUT_S:.0f} s")


def stop(server: subprocess.Popen[bytes]) -> None:
    """End the server: politely first, then by force, waiting a bounded time for each."""
    server.terminate()
    try:
        server.wait(timeout=SERVER_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait(timeout=SERVER_STOP_TIMEOUT_S)


@contextmanager
def local_s3_server() -> Iterator[str]:
    """moto's S3-protocol server on 127.0.0.1 for the duration of the block; yields its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        say(f"S3 server: moto, pid {server.pid}, at {url}")
        wait_until_up(url, server)
        yield url
    finally:
        stop(server)
        say(f"S3 server: pid {server.pid} stopped")


def synthetic_jpeg(label: int, index: int) -> bytes:
    """A noisy image of class ``label``: its colour, with dark stripes 4 pixels wide across it."""
    rng = np.random.default_rng(index)
    colour, axis = CLASSES[label]
    pixels = np.asarray(colour, dtype=np.float32) + rng.normal(0.0, 25.0, (IMAGE_SIZE, IMAGE_SIZE, 3))
    stripes = (np.arange(IMAGE_SIZE) // 4 + rng.integers(2)) % 2 == 0
    pixels[stripes if axis == 0 else (slice(None), stripes)] *= 0.4
    encoded = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(encoded, format="JPEG", quality=90)
    return encoded.getvalue()


def shard_url(bucket: str, shard: int) -> str:
    """Shard number ``shard``'s URL, named as ``shard_expand`` spells the range in :func:`pipeline`."""
    return f"s3://{bucket}/shard-{shard:06d}.tar"


def write_shards(fs: s3fs.S3FileSystem, bucket: str) -> None:
    """The dataset as WebDataset shards in ``bucket``: samples ``{"jpg", "cls"}``, the
    classes taking turns, each shard written by ``TarWriter`` straight into its S3 object."""
    if not fs.exists(bucket):
        fs.mkdir(bucket)
    for shard in range(SHARDS):
        with fs.open(shard_url(bucket, shard), "wb") as target, TarWriter(target, mtime=0) as shard_writer:
            for index in range(shard * SAMPLES_PER_SHARD, (shard + 1) * SAMPLES_PER_SHARD):
                label = index % len(CLASSES)
                shard_writer.write({"__key__": f"sample{index:06d}", "jpg": synthetic_jpeg(label, index), "cls": label})
    say(f"wrote {SHARDS} shards of {SAMPLES_PER_SHARD} JPEG samples to s3://{bucket}/")


def random_crop(sample: dict[str, Any], rng: np.random.Generator) -> tuple[str, np.ndarray, int]:
    """``(key, crop, label)``: a ``CROP_SIZE`` square at a random place, channels first, in
    [0, 1]. ``rng`` comes from conveyor, keyed by the sample's place in the data."""
    image = sample[".jpg"]
    top, left = rng.integers(0, image.shape[0] - CROP_SIZE + 1), rng.integers(0, image.shape[1] - CROP_SIZE + 1)
    crop = image[top : top + CROP_SIZE, left : left + CROP_SIZE].transpose(2, 0, 1)
    return sample["__key__"], crop.astype(np.float32) / 255.0, sample[".cls"]


def pipeline(bucket: str, options: dict[str, Any]) -> IterDataPipe:
    """Batches ``(keys, crops, labels)`` of the shards in ``bucket``."""
    pattern = f"s3://{bucket}/shard-{{000000..{SHARDS - 1:06d}}}.tar"
    return (
        IterableWrapper([pattern])
        .shard_expand()
        .shuffle()  # the shard order: the same in every worker
        .sharding_filter()  # from here on each worker reads its own shards
        .open_files_by_fsspec(mode="rb", **options)
        .load_from_tar()
        .webdataset()
        .shuffle(buffer_size=2 * BATCH_SIZE)
        .decode_samples()
        .random_map(random_crop)
        .batch(BATCH_SIZE)
        .collate(to_tensor=True)
    )


def make_loader(bucket: str, options: dict[str, Any]) -> DataLoader2:
    """The pipeline run by two worker processes; the same call makes the resumed loader."""
    return DataLoader2(pipeline(bucket, options), reading_service=MultiProcessingReadingService(num_workers=2))


def make_model() -> torch.nn.Module:
    """Two small convolutions, pooled over the image: colour and stripe direction are enough."""
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, kernel_size=5, stride=2),
        torch.nn.ReLU(),
        torch.nn.Conv2d(8, 16, kernel_size=3, stride=2),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(16, len(CLASSES)),
    )


def make_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    """SGD with momentum, so the checkpoint has optimizer state (the momenta) to restore."""
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Batch) -> float:
    """One SGD step on ``batch``; returns its loss."""
    _, crops, labels = batch
    loss = torch.nn.functional.cross_entropy(model(crops), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def fingerprint(batch: Batch) -> Fingerprint:
    """What identifies a batch: its samples' keys and a hash of its pixels."""
    keys, crops, _ = batch
    return keys, hashlib.sha256(crops.numpy().tobytes()).hexdigest()


def save_checkpoint(
    folder: Path, loader: DataLoader2, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    """The loader's state as JSON (it is plain data), the model's and optimizer's with ``torch.save``."""
    (folder / "loader.json").write_text(json.dumps(loader.state_dict()))
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, folder / "model_and_optimizer.pt")


def load_checkpoint(
    folder: Path, loader: DataLoader2, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    """Put what :func:`save_checkpoint` saved into a fresh loader, model and optimizer."""
    loader.load_state_dict(json.loads((folder / "loader.json").read_text()))
    saved = torch.load(folder / "model_and_optimizer.pt")
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])


def train(bucket: str, options: dict[str, Any], checkpoints: Path) -> tuple[list[Fingerprint], Weights]:
    """Train for ``EPOCHS`` epochs, checkpointing midway through the last; returns the
    batches trained on after the checkpoint and the final weights."""
    torch.manual_seed(SEED)
    model = make_model()
    optimizer = make_optimizer(model)
    loader = make_loader(bucket, options)
    loader.seed(SEED)
    after_checkpoint: list[Fingerprint] = []
    try:
        for epoch in range(EPOCHS):
            last_epoch, losses = epoch == EPOCHS - 1, []
            for batch in loader:
                losses.append(train_step(model, optimizer, batch))
                if last_epoch and len(losses) == CHECKPOINT_AFTER_BATCHES:
                    save_checkpoint(checkpoints, loader, model, optimizer)
                    say(f"epoch {epoch}: checkpoint after batch {len(losses)} saved in {checkpoints}")
                elif last_epoch and len(losses) > CHECKPOINT_AFTER_BATCHES:
                    after_checkpoint.append(fingerprint(batch))
            say(f"epoch {epoch}: {len(losses)} batches, mean loss {np.mean(losses):.4f}")
    finally:
        loader.shutdown()
    return after_checkpoint, model.state_dict()


def resume(bucket: str, options: dict[str, Any], checkpoints: Path) -> tuple[list[Fingerprint], Weights]:
    """A fresh loader, model and optimizer from the checkpoint, trained to the end of its
    epoch; returns the batches trained on and the final weights."""
    model = make_model()
    optimizer = make_optimizer(model)
    loader = make_loader(bucket, options)
    load_checkpoint(checkpoints, loader, model, optimizer)
    try:
        replayed: list[Fingerprint] = []
        for batch in loader:
            train_step(model, optimizer, batch)
            replayed.append(fingerprint(batch))
    finally:
        loader.shutdown()
    say(f"resumed from the checkpoint: {len(replayed)} batches to the end of epoch {EPOCHS - 1}")
    return replayed, model.state_dict()


def same_weights(first: Weights, second: Weights) -> bool:
    """Whether two models' weights are equal to the last bit."""
    return first.keys() == second.keys() and all(torch.equal(first[name], second[name]) for name in first)


def run(endpoint: str, bucket: str, checkpoints: Path) -> bool:
    """The whole job against the server at ``endpoint``; whether the resume was exact."""
    options = storage_options(endpoint)
    write_shards(s3fs.S3FileSystem(**options), bucket)
    continued, final_weights = train(bucket, options, checkpoints)
    replayed, resumed_weights = resume(bucket, options, checkpoints)
    same_batches = replayed == continued
    say(f"same batches after the checkpoint: {'yes' if same_batches else 'NO'} ({len(continued)} in the first run)")
    exact = same_batches and same_weights(final_weights, resumed_weights)
    say(f"resume exact: {'yes' if exact else 'NO'}")
    return exact


def main() -> None:
    """Parse the arguments, run the job against the given server or one of its own, exit 1 unless exact."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", help="an S3-protocol server's URL (default: start moto's server here)")
    parser.add_argument("--bucket", default="conveyor-webdataset-example", help="the bucket to write the shards to")
    parser.add_argument(
        "--checkpoint-dir", type=Path, default=None, help="where to save the checkpoint (default: a temporary folder)"
    )
    args = parser.parse_args()
    torch.use_deterministic_algorithms(True)  # with the same batches, the same weights to the last bit
    torch.set_num_threads(1)
    server = local_s3_server() if args.endpoint is None else nullcontext(args.endpoint)
    scratch = tempfile.TemporaryDirectory(prefix="conveyor-example-") if args.checkpoint_dir is None else nullcontext()
    with server as endpoint, scratch as temporary:
        checkpoints = args.checkpoint_dir or Path(temporary)
        checkpoints.mkdir(parents=True, exist_ok=True)
        exact = run(endpoint, args.bucket, checkpoints)
    sys.exit(0 if exact else 1)


if __name__ == "__main__":
    main()
