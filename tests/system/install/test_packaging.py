"""Building the project warns of nothing of its own making: the licence is an SPDX
expression with its file (``project.license`` as a table is deprecated by setuptools and
refused from 2027-02-18), and the wheel's metadata says so. The wheel is typed: it
carries ``py.typed`` and the stubs (PEP 561)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[3]


def test_the_wheel_builds_without_deprecation_and_carries_its_licence(tmp_path: Path) -> None:
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} here; the build needs >=77 (pyproject.toml)")
    # From a copy of what the build reads: the build writes egg-info beside the sources.
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, tree / name)
    shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    # This interpreter's setuptools, not a download: seconds, and no network.
    pip = [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", "--no-cache-dir"]
    done = subprocess.run(
        [*pip, "--disable-pip-version-check", "--wheel-dir", str(tmp_path / "dist"), str(tree)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    deprecations = [line for line in output.splitlines() if re.search(r"deprecat", line, re.IGNORECASE)]
    assert not deprecations, "\n".join(deprecations)

    (wheel,) = (tmp_path / "dist").glob("conveyor-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        headers = archive.read(metadata).decode().split("\n\n", 1)[0].splitlines()
        assert "License-Expression: BSD-3-Clause" in headers
        assert "License-File: LICENSE" in headers
        assert not [h for h in headers if h.startswith("License:")]  # the old free-text field
        (licence,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        assert archive.read(licence).decode().startswith("BSD 3-Clause License")
        # Typed (PEP 561): the marker, and each stub beside its module, as in the sources.
        assert "conveyor/py.typed" in names
        stubs = sorted(str(p.relative_to(ROOT / "src")) for p in (ROOT / "src" / "conveyor").rglob("*.pyi"))
        assert stubs and all(stub in names and stub.removesuffix("i") in names for stub in stubs), stubs
