"""RNG states as text in a ``conveyor.DataLoader`` state: compact (a state taken at every
step carries them), exact, and version 3's plain base64 still read."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conveyor import DataLoader
from conveyor.errors import StateError
from conveyor.pipes.torch.sampler_source import decode_rng, encode_rng, origin_digest, rng_bytes, same_rng


def drawn_generator(seed: int, draws: int) -> torch.Generator:
    generator = torch.Generator()
    generator.manual_seed(seed)
    torch.randperm(draws, generator=generator)
    return generator


@pytest.mark.parametrize(("seed", "draws"), [(0, 0), (5, 1), (123_456_789, 10_000)])
def test_a_generator_state_comes_back_exactly_from_a_short_text(seed: int, draws: int) -> None:
    state = drawn_generator(seed, draws).get_state()
    text = encode_rng(state)
    assert torch.equal(decode_rng(text), state)
    assert same_rng(text, state)
    # 5,056 bytes hold 624 32-bit words in 64-bit slots: the text carries the words, not the slots.
    assert len(text) < 0.55 * len(base64.b64encode(state.numpy().tobytes()))


@given(st.binary(max_size=200))
def test_any_bytes_come_back(raw: bytes) -> None:
    assert (
        rng_bytes(
            encode_rng(
                torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
            )
        )
        == raw
    )


def test_plain_base64_is_read_too() -> None:
    state = drawn_generator(1, 100).get_state()
    plain = base64.b64encode(state.numpy().tobytes()).decode("ascii")
    assert torch.equal(decode_rng(plain), state)
    assert same_rng(plain, state) and not same_rng(plain, drawn_generator(2, 100).get_state())


@pytest.mark.parametrize("text", ["shuffled-zlib:AAAA", "shuffled-zlib:not base64!", "not base64!"])
def test_text_that_is_no_rng_state_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError, match="not the text of a torch RNG state"):
        rng_bytes(text)


class Squares(torch.utils.data.Dataset[int]):
    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int) -> int:
        return index * index


def shuffled_loader(workers: int = 0) -> DataLoader:
    generator = torch.Generator()
    generator.manual_seed(7)
    return DataLoader(Squares(), batch_size=4, shuffle=True, generator=generator, num_workers=workers)


def batches(loader: Any, count: int | None = None) -> list[list[int]]:
    out = []
    for batch in loader:
        out.append(batch.tolist())
        if count is not None and len(out) == count:
            break
    return out


def as_version_3(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` as a version 3 loader wrote it: every RNG state in plain base64 (and the
    per-key states naming the epoch's origin by the digest of that text)."""
    text = json.dumps(state)
    if state["sampler"] is not None:
        origin = state["sampler"]["rng"]
        text = text.replace(origin_digest(origin), origin_digest(plain(origin)))
    old = json.loads(text)
    old["version"] = 3
    for key in ("generator", "sampler_generator", "rng"):
        if old[key] is not None:
            old[key] = plain(old[key])
    if old["sampler"] is not None:
        old["sampler"]["rng"] = plain(old["sampler"]["rng"])
    return old


def plain(text: str) -> str:
    return base64.b64encode(rng_bytes(text)).decode("ascii")


@pytest.mark.parametrize("workers", [0, 2])
def test_a_version_3_state_resumes_the_same_batches(workers: int) -> None:
    whole = shuffled_loader()
    expected = batches(whole) + batches(whole)
    loader = shuffled_loader(workers)
    head = batches(loader, 3)
    state = loader.state_dict()
    assert state["version"] == 4 and state["generator"].startswith("shuffled-zlib:")
    loader.shutdown()
    resumed = shuffled_loader(workers)
    old = as_version_3(state)
    assert origin_digest(state["sampler"]["rng"]) not in json.dumps(old)
    resumed.load_state_dict(old)
    assert head + batches(resumed) + batches(resumed) == expected
    resumed.shutdown()


def test_a_damaged_generator_state_is_refused_before_anything_runs() -> None:
    loader = shuffled_loader()
    batches(loader, 1)
    state = loader.state_dict()
    state["generator"] = "shuffled-zlib:AAAA"
    with pytest.raises(StateError, match="'generator' must be the text of a torch RNG state"):
        shuffled_loader().load_state_dict(state)
