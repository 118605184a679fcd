"""mypy passes on ``src/`` and on ``tests/typing/`` (the item types users get), with the
settings of ``[tool.mypy]`` in pyproject.toml.

Type checkers read ``conveyor/pipes/base.pyi`` in place of ``base.py`` (the stub adds the
functional methods, see ``tests/support/fluent_stub.py``), so ``base.py`` itself is checked in a
second run of its own. mypy's cache lives in the temporary folder, one per checkout and
mypy version: a run after a small edit takes seconds; the first, which reads torch's
types, tens of seconds.
"""

from __future__ import annotations

import hashlib
import inspect
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import pytest

from conveyor.pipes import IterDataPipe

try:
    import mypy.version as mypy
except ImportError:  # not a reason to skip: the check would silently stop running
    raise ImportError("mypy is in the dev extra: pip install -e '.[dev]'") from None

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[2]
#: The module the stub stands for: where the pipe classes are defined.
BASE = Path(inspect.getfile(IterDataPipe))


def cache_dir(kind: str) -> Path:
    key = hashlib.sha256(f"{ROOT}|{mypy.__version__}|{sys.version}".encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"conveyor-mypy-{key}-{kind}"


def run_mypy(*args: str, kind: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(cache_dir(kind)), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )


def base_check_config() -> str:
    """pyproject.toml's ``[tool.mypy]`` as a mypy.ini, for one module: imports followed
    silently, torch not at all."""
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    lines = ["[mypy]"]
    for key, value in settings.items():
        if key not in ("files", "overrides"):
            lines.append(f"{key} = {', '.join(value) if isinstance(value, list) else str(value).lower()}")
    lines.append("follow_imports = silent")
    for override in settings.get("overrides", []):
        lines.append(f"[mypy-{','.join(override['module'])}]")
        lines += [f"{key} = {str(value).lower()}" for key, value in override.items() if key != "module"]
    lines += ["[mypy-torch,torch.*]", "follow_imports = skip"]
    return "\n".join(lines) + "\n"


def test_mypy_passes_on_the_sources_and_the_typing_tests():
    done = run_mypy(kind="all")  # the files of [tool.mypy]: src and tests/typing
    assert done.returncode == 0, done.stdout[-8000:] + done.stderr[-2000:]
    assert "Success: no issues found" in done.stdout
    checked = int(done.stdout.rsplit("in ", 1)[1].split()[0])
    assert checked > 150  # the whole package and the typing tests, not a subset


def test_mypy_passes_on_the_module_the_stub_stands_for(tmp_path: Path):
    """``base.py``'s own code, with the project's settings; the modules it imports are
    the run above's to report (and torch, which ``base.py`` does not use, is not read)."""
    assert BASE.with_suffix(".pyi").exists()
    config = tmp_path / "mypy.ini"
    config.write_text(base_check_config())
    done = run_mypy("--config-file", str(config), str(BASE.relative_to(ROOT)), kind="base")
    assert done.returncode == 0, done.stdout[-8000:] + done.stderr[-2000:]
    assert "Success: no issues found in 1 source file" in done.stdout
