"""Users' states as plain JSON-safe data: every supported value comes back equal and of the
same types; anything else is refused at encode time, naming the object and the key."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conveyor.core.plain_state import Stateful, decode, encode
from conveyor.errors import StateError


def roundtrip(value: Any) -> Any:
    return decode(json.loads(json.dumps(encode(value, "a sampler"))), "a sampler")


def same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float) and a != a:
        return b != b
    return a == b


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.binary(max_size=8),
)
keys = st.one_of(st.text(max_size=4), st.integers(-5, 5), st.tuples(st.integers(0, 3), st.text(max_size=2)))
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(keys, inner, max_size=4),
    ),
    max_leaves=12,
)


@given(values)
def test_plain_values_and_containers_come_back_equal_and_of_the_same_types(value: Any) -> None:
    assert same(roundtrip(value), value)


@pytest.mark.parametrize(
    "value",
    [
        torch.get_rng_state(),
        torch.Generator().manual_seed(3).get_state(),
        torch.tensor(2.5),
        torch.zeros(0, 3),
        torch.arange(12, dtype=torch.int16).reshape(3, 4),
        torch.ones(2, dtype=torch.bfloat16),
        torch.tensor([True, False]),
        np.arange(6, dtype=np.float32).reshape(2, 3),
        np.int64(7),
        np.bool_(True),
        {"generator": torch.get_rng_state(), "yielded": 3, (1, 2): b"\x00"},
        {1, 2, 3},
        frozenset({"a"}),
        bytearray(b"ab"),
    ],
    ids=lambda v: type(v).__name__,
)
def test_tensors_arrays_and_other_kinds_come_back_unchanged(value: Any) -> None:
    back = roundtrip(value)
    if isinstance(value, dict):
        assert same(back["generator"], value["generator"]) and back[(1, 2)] == b"\x00" and back["yielded"] == 3
    else:
        assert same(back, value)


def test_what_cannot_be_kept_is_refused_naming_the_object_and_key() -> None:
    with pytest.raises(StateError, match=r"state of a sampler holds a builtin_function_or_method at inner\.fn"):
        encode({"inner": {"fn": print}}, "a sampler")
    with pytest.raises(StateError, match=r"holds a object at \[1\]"):
        encode([1, object()], "a sampler")


def test_a_forged_tag_is_a_state_error() -> None:
    with pytest.raises(StateError, match="malformed 'tensor'"):
        decode({"__conveyor__": "tensor", "dtype": "not_a_dtype", "shape": [1], "b64": ""}, "x")
    with pytest.raises(StateError, match="unknown tag"):
        decode({"__conveyor__": "pickle", "data": "..."}, "x")


def test_the_stateful_protocol() -> None:
    class Counter:
        def state_dict(self) -> dict[str, Any]:
            return {}

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            pass

    assert isinstance(Counter(), Stateful)
    assert not isinstance(object(), Stateful)
