"""Helpers of the documentation site's tests: build it once per test run, find its pages'
code examples.

The site is built once per run whatever the number of pytest-xdist workers: the first
test that needs it builds it under a file lock, into a folder named after what the build
reads (docs/, src/, benchmarks/ with its results, and the README), and the others reuse it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
#: Seconds the build may take; the suite runs it, so it stays short.
BUILD_TIMEOUT_S = 300

# The inputs of the build: a change to any of them makes a new build. The performance
# pages the build generates (docs/performance/results/) are its output, not its input.
_INPUT_ROOTS = (DOCS, ROOT / "src" / "conveyor", ROOT / "benchmarks")
_SKIP_PARTS = {"_build", "__pycache__", ".venvs", "results"}
#: The pages the build generates from the benchmarks' results.
GENERATED = DOCS / "performance" / "results"


def _inputs() -> Iterator[Path]:
    for root in _INPUT_ROOTS:
        for path in sorted(root.rglob("*")):
            parts = set(path.relative_to(root).parts)
            if path.is_file() and not parts & _SKIP_PARTS:
                yield path
    yield from sorted((ROOT / "benchmarks" / "results").rglob("*.json"))


def inputs_digest() -> str:
    digest = hashlib.sha256()
    for path in _inputs():
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def build_site(base: Path) -> Path:
    """The HTML site built from this tree, in a folder under ``base`` (shared by the
    processes of one test run); built with warnings as errors and nitpicky references.
    Raises ``AssertionError`` with Sphinx's output when the build fails; a build that
    failed or timed out is not tried again in the same run (each try can take minutes)."""
    out = base / f"docs-{inputs_digest()}"
    failed = out / "failed.txt"
    with open(base / "docs-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / "html" / "objects.inv").exists() and (out / "log.txt").exists():
            return out / "html"
        if failed.exists():  # one failed build per run: the other tests say so without another try
            raise AssertionError(failed.read_text())
        try:
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "sphinx",
                    "-W",
                    "--keep-going",
                    "-n",
                    "-E",
                    "-q",
                    "-b",
                    "html",
                    str(DOCS),
                    str(out / "html"),
                ],
                capture_output=True,
                text=True,
                timeout=BUILD_TIMEOUT_S,
                env={
                    **os.environ,
                    "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
                },
                cwd=ROOT,
            )
        except subprocess.TimeoutExpired:
            out.mkdir(parents=True, exist_ok=True)
            failed.write_text(f"sphinx-build took more than {BUILD_TIMEOUT_S} s (in an earlier test of this run)")
            raise
        if done.returncode != 0:
            out.mkdir(parents=True, exist_ok=True)
            failed.write_text(f"sphinx-build failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
            raise AssertionError(failed.read_text())
        (out / "log.txt").write_text(done.stdout + done.stderr)
    return out / "html"


def pages() -> list[Path]:
    """Every Markdown page of the site (and the README), for the examples' tests."""
    found = [
        path
        for path in sorted(DOCS.rglob("*.md"))
        if "_build" not in path.parts and path.name != "DESIGN.md" and GENERATED not in path.parents
    ]
    return [ROOT / "README.md", *found]


_FENCE = re.compile(r"^(?P<fence>`{3,})\s*(?:\{code-block\}\s*)?(?P<lang>[\w-]*)\s*$")


def python_blocks(text: str) -> list[str]:
    """The Python code blocks of a Markdown page (fenced ``python``, or a ``{code-block}
    python``), in order; each block's own options (``:caption:`` lines) left out."""
    blocks: list[str] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        match = _FENCE.match(lines[index])
        index += 1
        if not match:
            continue
        fence, lang = match.group("fence"), match.group("lang")
        body: list[str] = []
        while index < len(lines) and not lines[index].startswith(fence):
            body.append(lines[index])
            index += 1
        index += 1
        if lang in ("python", "py"):
            blocks.append("\n".join(line for line in body if not re.match(r"^:\w[\w-]*:", line)))
    return blocks


def included_scripts(text: str) -> list[Path]:
    """The files a page shows with ``{literalinclude}``, resolved from the page's folder."""
    return [Path(match) for match in re.findall(r"^`{3,}\{literalinclude\}\s+(\S+)", text, flags=re.M)]
