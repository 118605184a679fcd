"""A pipeline's fingerprint is its identity in a saved state: it must not change when
conveyor moves a module, and states saved by earlier layouts must still load."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.core.earlier_fingerprints import fingerprint_before_layers
from conveyor.graph import fingerprint
from conveyor.pipes import IterableWrapper

STATES = Path(__file__).parent / "states"


def graph() -> Any:
    return IterableWrapper(range(30)).shuffle().sharding_filter().map(abs).batch(3)


def test_conveyors_ops_are_named_by_class_not_by_module() -> None:
    # Computed once; a change means every state saved before it is refused.
    assert fingerprint(graph()) == "a11487f212943811ef182f27ae030ab8"


def test_a_state_saved_before_the_layers_layout_resumes_exactly() -> None:
    """Saved by conveyor at 8b74c2e (modules such as conveyor.pipes.base, before core/):
    4 batches read, then the state, then the rest."""
    saved = json.loads((STATES / "dataloader2_before_layers.json").read_text())
    assert saved["state"]["fingerprint"] == fingerprint_before_layers(graph()) != fingerprint(graph())
    loader = DataLoader2(graph(), reading_service=MultiProcessingReadingService(num_workers=2))
    loader.load_state_dict(saved["state"])
    rest = [list(batch) for batch in loader]
    loader.shutdown()
    assert rest == saved["rest"]
    assert sorted(x for batch in saved["head"] + rest for x in batch) == list(range(30))
