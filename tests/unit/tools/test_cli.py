"""The ``conveyor`` command line, the demo behind it, and the in-process benchmark script
(run tiny, for its output format only: timings are never asserted)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conveyor.tools.cli import main
from conveyor.tools.demo import MANIFEST, DemoConfig, default_data_dir, epoch_label_orders, prepare_dataset

SMALL = ["--shards", "2", "--items-per-shard", "16", "--batch-size", "8", "--epochs", "2"]


def run_demo(capsys: pytest.CaptureFixture[str], data_dir: Path, *extra: str) -> tuple[int, str, str]:
    code = main(["demo", "--data-dir", str(data_dir), *SMALL, *extra])
    out, err = capsys.readouterr()
    return code, out, err


def epoch_lines(out: str) -> list[dict[str, str]]:
    lines = [line for line in out.splitlines() if line.startswith("epoch ")]
    return [dict(re.findall(r"(\S+)=(\S+)", line)) for line in lines]


def test_demo_reports_every_item_once_per_epoch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_demo(capsys, tmp_path / "data")
    assert code == 0, err
    epochs = epoch_lines(out)
    assert len(epochs) == 2
    for epoch in epochs:
        assert epoch["items"] == "32"
        assert epoch["distinct"] == "32"
        assert epoch["batches"] == "4"
    assert re.search(r"^total: epochs=2 items=64 batches=8 ", out, re.MULTILINE)
    assert "epoch 2/2" in err  # the progress bars go to stderr


def test_demo_reuses_the_dataset_while_the_manifest_matches(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    _, out, _ = run_demo(capsys, data)
    assert "generated" in out.splitlines()[0]
    shard = data / "shard-00000.npz"
    stamp = shard.stat().st_mtime_ns
    code, out, _ = run_demo(capsys, data)
    assert code == 0
    assert "reused" in out.splitlines()[0]
    assert shard.stat().st_mtime_ns == stamp
    assert sorted(p.name for p in data.iterdir()) == [MANIFEST, "shard-00000.npz", "shard-00001.npz"]


def test_demo_regenerates_when_parameters_change(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    run_demo(capsys, data, "--shards", "3")
    assert len(list(data.glob("*.npz"))) == 3
    code, out, _ = run_demo(capsys, data)  # back to 2 shards: the third one must go
    assert code == 0
    assert "generated" in out.splitlines()[0]
    assert sorted(p.name for p in data.glob("*.npz")) == ["shard-00000.npz", "shard-00001.npz"]
    assert all(e["items"] == "32" and e["distinct"] == "32" for e in epoch_lines(out))


def test_demo_regenerates_a_corrupt_dataset(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert prepare_dataset(data, 2, 16) is True
    (data / "shard-00001.npz").write_bytes(b"truncated")
    assert prepare_dataset(data, 2, 16) is True
    assert prepare_dataset(data, 2, 16) is False
    assert not list(data.glob("*.tmp"))


def test_demo_refuses_a_folder_with_foreign_npz_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "mine.npz").write_bytes(b"")
    code, _, err = run_demo(capsys, data)
    assert code == 1
    assert "mine.npz" in err
    assert (data / "mine.npz").exists()


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["nope"],
        ["demo", "--shards", "0"],
        ["demo", "--epochs", "x"],
        ["demo", "--batch-size", "-1"],
        ["demo", "--seed", str(1 << 64)],
        ["demo", "--unknown"],
    ],
)
def test_bad_arguments_exit_non_zero(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code not in (0, None)
    assert "error" in capsys.readouterr().err


def test_epoch_orders_differ_between_epochs_and_repeat_across_runs(tmp_path: Path) -> None:
    prepare_dataset(tmp_path, 2, 16)
    config = DemoConfig(data_dir=tmp_path, shards=2, items_per_shard=16, batch_size=8, epochs=3, seed=7)
    first, again = epoch_label_orders(config), epoch_label_orders(config)
    assert first == again
    assert len(first) == 3
    assert all(len(order) == 32 for order in first)
    assert all(sorted(order) == sorted(first[0]) for order in first)  # the same items, reordered
    assert first[0] != first[1] and first[1] != first[2] and first[0] != first[2]
    other_seed = epoch_label_orders(DemoConfig(**{**config.__dict__, "seed": 8}))
    assert other_seed != first


def test_progress_falls_back_to_text_without_tqdm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)  # makes `import tqdm` raise ImportError
    code, _, err = run_demo(capsys, tmp_path)
    assert code == 0
    assert "epoch 1/2: 32/32 items" in err
    assert "epoch 2/2: 32/32 items" in err


def test_no_progress_keeps_stderr_quiet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_demo(capsys, tmp_path, "--no-progress")
    assert code == 0
    assert err == ""


def test_default_data_dir_follows_xdg_cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_data_dir() == tmp_path / "conveyor" / "demo"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_data_dir() == Path.home() / ".cache" / "conveyor" / "demo"


def test_module_entry_point_exits_with_the_code(tmp_path: Path) -> None:
    # numpy's model: a fresh interpreter need not import torch to show the exit codes
    # (the default backend is run in this process, by the other tests).
    command = [sys.executable, "-m", "conveyor.tools.cli", "demo", "--data-dir", str(tmp_path), *SMALL, "--no-progress"]
    command += ["--backend", "numpy"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "distinct=32" in done.stdout
    bad = subprocess.run([*command, "--shards", "zero"], capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2
    assert "--shards" in bad.stderr


def test_an_extra_shard_is_not_reused_silently(tmp_path: Path) -> None:
    prepare_dataset(tmp_path, 2, 16)
    (tmp_path / "shard-00002.npz").write_bytes((tmp_path / "shard-00000.npz").read_bytes())
    assert prepare_dataset(tmp_path, 2, 16) is True  # regenerated: the extra shard would be read
    assert sorted(p.name for p in tmp_path.glob("*.npz")) == ["shard-00000.npz", "shard-00001.npz"]


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_demo_trains_checkpoints_and_resumes_exactly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], backend: str
) -> None:
    if backend == "torch":
        pytest.importorskip("torch")
    size = ["--shards", "4", "--items-per-shard", "64", "--batch-size", "16", "--epochs", "3"]
    code = main(["demo", "--data-dir", str(tmp_path / "data"), *size, "--backend", backend, "--no-progress"])
    out, err = capsys.readouterr()
    assert code == 0, err
    epochs = epoch_lines(out)
    assert [e["items"] for e in epochs] == ["256"] * 3
    assert float(epochs[-1]["loss"]) < float(epochs[0]["loss"])  # it learns
    assert f"model: {backend} softmax regression" in out
    assert re.search(r"^checkpoint: saved after batch \d+ of epoch 2 \(\d+ of 256 items\)", out, re.MULTILINE)
    saved = re.search(r"^resume: .*: (\d+) batches \(the uninterrupted run had (\d+) after", out, re.MULTILINE)
    assert saved and saved.group(1) == saved.group(2) and int(saved.group(1)) > 0
    assert "identical batches, final weights identical" in out
    assert "per-stage report, epoch 3/3:" in out and "bottleneck:" in out
    checkpoint = tmp_path / "data-checkpoint"
    assert (checkpoint / "loader_state.json").is_file()
    assert {p.name for p in (tmp_path / "data").iterdir()} == {MANIFEST, *(f"shard-0000{i}.npz" for i in range(4))}


def test_demo_checkpoint_goes_beside_a_relative_data_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    monkeypatch.chdir(data)
    code = main(["demo", "--data-dir", ".", *SMALL, "--backend", "numpy", "--no-progress"])
    assert code == 0, capsys.readouterr().err
    assert (tmp_path / "data-checkpoint" / "loader_state.json").is_file()
    assert main(["demo", "--data-dir", "/", *SMALL, "--no-progress"]) == 1  # refused before writing anything
    assert "--checkpoint-dir" in capsys.readouterr().err
