"""The core needs numpy alone: in a fresh virtual environment holding only numpy, conveyor
imports, runs a pipeline through worker processes, imports no optional package, and each
optional feature says which extra brings what it needs."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
import venv
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.timeout(420)

ROOT = Path(__file__).resolve().parents[3]
OPTIONAL = ("torch", "fsspec", "s3fs", "pyarrow", "PIL", "datasets", "zstandard", "cloudpickle", "webdataset", "tqdm")


def test_the_declared_dependencies_are_numpy_alone() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert [dependency.split(">")[0].split("=")[0] for dependency in project["dependencies"]] == ["numpy"]


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment with numpy (this one's version) and nothing else, not even
    pip: this interpreter's pip installs into it (``--python``), which spares the
    environment pip's own install."""
    where = tmp_path_factory.mktemp("bare-venv")
    venv.EnvBuilder(with_pip=False).create(where)
    python = where / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--disable-pip-version-check"]
    subprocess.run(
        [*pip, f"numpy=={np.__version__}"],
        check=True,
        capture_output=True,
        timeout=360,
    )
    return python


def test_the_core_runs_with_numpy_alone(bare_python: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        from conveyor import DataLoader2, MultiProcessingReadingService
        from conveyor.errors import MissingDependencyError
        from conveyor.pipes import IterableWrapper

        def double(x):
            return 2 * x

        loader = DataLoader2(
            IterableWrapper(range(20)).shuffle().sharding_filter().map(double),
            reading_service=MultiProcessingReadingService(num_workers=2),
        )
        loader.seed(1)
        assert sorted(loader) == [2 * i for i in range(20)]
        loader.shutdown()
        print("optional imported:", sorted(m for m in {OPTIONAL!r} if m in sys.modules))
        for needs in (
            lambda: list(IterableWrapper(["t.parquet"]).load_parquet()),
            lambda: list(IterableWrapper([("i.jpg", b"")]).decode_image()),
            lambda: list(IterableWrapper(["memory://f"]).open_files_by_fsspec()),
            lambda: list(IterableWrapper([1]).collate(to_tensor=True)),
        ):
            try:
                needs()
            except MissingDependencyError as err:
                print("needs:", err)
        """
    )
    done = subprocess.run(
        [str(bare_python), "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "optional imported: []" in lines
    needs = [line for line in lines if line.startswith("needs:")]
    for extra in ("parquet", "images", "fsspec", "torch"):
        assert any(f"conveyor[{extra}]" in line for line in needs), (extra, needs)
