"""``shared_empty`` and ``shared_empty_like`` in the main process: numpy's ``empty`` and
``empty_like``, shape for shape and error for error (the worker side, where they come
from the ring, is in ``tests/integration/workers/test_in_place_arrays.py``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conveyor import shared_empty, shared_empty_like

DTYPES = [np.uint8, np.int64, np.float32, float, "complex128", np.bool_]

shapes = st.one_of(
    st.integers(0, 64),
    st.lists(st.integers(0, 8), max_size=4).map(tuple),
    st.lists(st.integers(0, 8), max_size=4),
    st.lists(st.integers(0, 8), max_size=4).map(lambda dims: tuple(np.int64(d) for d in dims)),
)


@given(shape=shapes, dtype=st.sampled_from(DTYPES), order=st.sampled_from(["C", "F"]))
def test_shared_empty_makes_what_numpy_empty_makes(shape: Any, dtype: Any, order: str) -> None:
    made = shared_empty(shape, dtype, order=order)
    expected = np.empty(shape, dtype, order=order)
    assert type(made) is np.ndarray
    assert made.shape == expected.shape
    assert made.dtype == expected.dtype
    assert made.flags.c_contiguous == expected.flags.c_contiguous
    assert made.flags.f_contiguous == expected.flags.f_contiguous
    assert made.flags.writeable


@pytest.mark.parametrize("shape", [2.5, (2, 1.5), "3", (2, None), -1, (3, -2)])
def test_a_shape_numpy_refuses_is_refused_too(shape: Any) -> None:
    with pytest.raises((TypeError, ValueError)) as numpy_refused:
        np.empty(shape)
    with pytest.raises(type(numpy_refused.value)):
        shared_empty(shape)


def test_shared_empty_like_follows_the_prototype_and_its_overrides() -> None:
    fortran = np.asfortranarray(np.zeros((3, 4), dtype=np.float32))
    made = shared_empty_like(fortran)
    assert made.shape == (3, 4) and made.dtype == np.float32 and made.flags.f_contiguous
    assert shared_empty_like(fortran, order="C").flags.c_contiguous
    assert shared_empty_like([[1, 2, 3]], dtype=np.uint8).dtype == np.uint8
    assert shared_empty_like(fortran, shape=(5,)).shape == (5,)


def test_an_unknown_order_is_refused() -> None:
    with pytest.raises(ValueError, match="order must be 'C' or 'F'"):
        shared_empty((2, 2), order="K")
