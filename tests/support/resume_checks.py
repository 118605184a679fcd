"""Exact resume at every cut: the check each op's tests run on its pipelines."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from conveyor import DataLoader2


def json_state(dl: DataLoader2) -> dict[str, Any]:
    return json.loads(json.dumps(dl.state_dict()))


def check_resume_at_every_cut(make: Callable[[], Any], seed: int, cut_epochs: tuple[int, ...]) -> None:
    """For each epoch in ``cut_epochs`` and every cut in it: save there and resume a fresh
    loader over ``make()`` from the JSON state; it must read the state back unchanged,
    finish that epoch as the uninterrupted loader did, then give the next one (at once,
    for a state taken after the epoch's last item)."""
    uninterrupted = DataLoader2(make())
    uninterrupted.seed(seed)
    full = [list(uninterrupted) for _ in range(max(cut_epochs) + 2)]
    for epoch in cut_epochs:
        for cut in range(len(full[epoch]) + 1):
            a = DataLoader2(make())
            a.seed(seed)
            for _ in range(epoch):
                list(a)
            it = iter(a)
            first = [next(it) for _ in range(cut)]
            state = json_state(a)
            a.shutdown()
            b = DataLoader2(make())
            b.load_state_dict(state)
            assert json_state(b) == state
            if cut < len(full[epoch]):
                assert first + list(b) == full[epoch], f"epoch {epoch}, cut {cut}"
            # After the epoch's last item, the first iter() is already the next epoch.
            assert list(b) == full[epoch + 1], f"epoch {epoch}, cut {cut}"
            b.shutdown()
