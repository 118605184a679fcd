"""The suites' quick runs check what each run delivers, never its figures: a run of a
loader in this interpreter is forked from a zygote that imported torch once per test
session (``orchestrate.ZYGOTE``) instead of a fresh interpreter importing it again. A
test of the fresh process itself sets ``ZYGOTE`` back to ``None``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from conveyor.tools.bench.harness import orchestrate
from conveyor.tools.bench.harness.zygote import Zygote


@pytest.fixture(scope="session")
def zygote() -> Iterator[Zygote]:
    with Zygote() as made:
        yield made


@pytest.fixture(autouse=True)
def forked_runs(zygote: Zygote, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(orchestrate, "ZYGOTE", zygote)
