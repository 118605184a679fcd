"""The demo's dataset: image-like arrays with labels, in ``.npz`` shards, generated once.

Each class has its own colour cast over noise, so a tiny linear model can learn it in a
few epochs. A manifest, written last, records the parameters and file sizes: a later run
reuses the folder while they match and regenerates it (atomically, file by file) otherwise.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import numpy as np

from conveyor.errors import ConveyorError

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "conveyor-demo-dataset"
MANIFEST_VERSION = 2
#: Seed of the dataset's content (not of the loader): the same parameters give the same bytes.
DATA_SEED = 20240601
IMAGE_SHAPE = (3, 32, 32)
NUM_CLASSES = 10
#: How far each class's colour cast moves a pixel, against noise of +-NOISE.
CLASS_SHIFT, NOISE = 40, 80

_SHARD_NAME = re.compile(r"shard-\d{5}\.npz")


class DemoError(ConveyorError):
    """A problem with the demo's inputs (e.g. an unusable data directory), not a bug."""


def default_data_dir() -> Path:
    """The per-user cache folder (``$XDG_CACHE_HOME/conveyor/demo``, else ``~/.cache/...``),
    so repeated runs reuse one generated dataset."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "conveyor" / "demo"


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.npz"


def _expected_manifest(shards: int, items_per_shard: int) -> dict[str, Any]:
    return {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "data_seed": DATA_SEED,
        "shards": shards,
        "items_per_shard": items_per_shard,
        "image_shape": list(IMAGE_SHAPE),
        "num_classes": NUM_CLASSES,
        "files": [shard_name(i) for i in range(shards)],
    }


def _read_manifest(data_dir: Path) -> dict[str, Any] | None:
    try:
        with open(data_dir / MANIFEST, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def _is_reusable(data_dir: Path, expected: dict[str, Any]) -> bool:
    manifest = _read_manifest(data_dir)
    if manifest is None or manifest.get("sizes") is None:
        return False
    if {k: v for k, v in manifest.items() if k != "sizes"} != expected:
        return False
    sizes = manifest["sizes"]
    if not isinstance(sizes, dict):
        return False
    for name in expected["files"]:
        path = data_dir / name
        if not path.is_file() or path.stat().st_size != sizes.get(name):
            return False
    return {p.name for p in data_dir.glob("*.npz")} == set(expected["files"])  # the graph reads every *.npz


def _write_atomically(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """Write through a temporary file in the same folder, then rename it over ``path``:
    readers (and an interrupted run) never see a half-written file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "xb") as f:  # unlike mkstemp, honours the umask
            write(f)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _class_colours() -> np.ndarray:
    """One colour cast per class, (NUM_CLASSES, 3) in [-1, 1]: what the model must learn."""
    return np.random.default_rng([DATA_SEED, 1 << 20]).uniform(-1.0, 1.0, size=(NUM_CLASSES, 3))


def _save_arrays(file: IO[bytes], arrays: dict[str, Any]) -> None:
    np.savez(file, **arrays)


def _generate_shard(index: int, items_per_shard: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([DATA_SEED, index])
    labels = rng.integers(0, NUM_CLASSES, size=items_per_shard, dtype=np.int64)
    noise = rng.integers(-NOISE, NOISE + 1, size=(items_per_shard, *IMAGE_SHAPE), dtype=np.int16)
    cast = np.rint(_class_colours()[labels] * CLASS_SHIFT).astype(np.int16)[:, :, None, None]
    images = np.clip(128 + cast + noise, 0, 255).astype(np.uint8)
    return {
        "images": images,
        "labels": labels,
        "index": np.arange(index * items_per_shard, (index + 1) * items_per_shard, dtype=np.int64),
    }


def prepare_dataset(data_dir: Path, shards: int, items_per_shard: int) -> bool:
    """Make sure ``data_dir`` holds the dataset for these parameters; return whether it
    had to be (re)generated. Reuse is decided by the manifest, written last, so an
    interrupted generation is redone rather than trusted.
    """
    if shards < 1 or items_per_shard < 1:
        raise DemoError("shards and items_per_shard must be >= 1")
    data_dir = Path(data_dir)
    expected = _expected_manifest(shards, items_per_shard)
    if _is_reusable(data_dir, expected):
        return False
    if data_dir.exists() and not data_dir.is_dir():
        raise DemoError(f"data dir {str(data_dir)!r} exists and is not a directory")
    data_dir.mkdir(parents=True, exist_ok=True)
    # The graph reads every *.npz in the folder: refuse foreign ones, remove stale shards.
    foreign = sorted(p.name for p in data_dir.glob("*.npz") if not _SHARD_NAME.fullmatch(p.name))
    if foreign:
        raise DemoError(
            f"data dir {str(data_dir)!r} holds .npz files the demo did not write ({', '.join(foreign[:3])}"
            f"{', ...' if len(foreign) > 3 else ''}); use an empty or dedicated --data-dir"
        )
    (data_dir / MANIFEST).unlink(missing_ok=True)
    wanted = set(expected["files"])
    for stale in data_dir.glob("shard-*.npz"):
        if stale.name not in wanted:
            stale.unlink()
    sizes: dict[str, int] = {}
    for index, name in enumerate(expected["files"]):
        arrays = _generate_shard(index, items_per_shard)
        _write_atomically(data_dir / name, functools.partial(_save_arrays, arrays=arrays))
        sizes[name] = (data_dir / name).stat().st_size
    manifest = json.dumps({**expected, "sizes": sizes}, indent=2, sort_keys=True).encode()
    _write_atomically(data_dir / MANIFEST, lambda f: f.write(manifest))
    return True
