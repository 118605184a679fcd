"""Fuzzing ``DataLoader2.load_state_dict`` with corrupt states.

A corrupt state must be rejected at once, inside ``load_state_dict``, with a
:class:`~conveyor.errors.StateError`; a mutation that happens to leave a valid state must
load and iterate without any error other than ``StateError``/``ResumeError`` and without
hanging. Loading must never unpickle anything.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import math
import pickle
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from conveyor import DataLoader2, InProcessReadingService
from conveyor.errors import ResumeError, StateError
from conveyor.pipes import IterableWrapper
from hypothesis_profiles import scaled

# --- pipelines -----------------------------------------------------------------------------


def build_main() -> Any:
    """shuffle, sharding_filter, flatmap, batch and prefetch (the service prefetches too)."""
    return (
        IterableWrapper(list(range(40)))
        .shuffle(buffer_size=6)
        .sharding_filter()
        .flatmap(lambda x: [x, x + 100])
        .batch(3)
        .prefetch(2)
    )


def build_other_ops() -> Any:
    """enumerate, header, cycle, random_map, unbatch: the other stateful ops."""
    return (
        IterableWrapper(list(range(25)))
        .enumerate()
        .map(lambda t: t[1])
        .header(20)
        .cycle(2)
        .random_map(lambda x, rng: x * 1000 + int(rng.integers(1000)))
        .batch(4, drop_last=True)
        .unbatch()
        .shuffle(buffer_size=5)
    )


def check_main_item(item: Any) -> None:
    assert isinstance(item, list) and 1 <= len(item) <= 3
    assert all(isinstance(x, int) and (0 <= x < 40 or 100 <= x < 140) for x in item)


def check_other_item(item: Any) -> None:
    assert isinstance(item, int) and 0 <= item < 25_000


PIPELINES: dict[str, tuple[Callable[[], Any], Callable[[Any], None]]] = {
    "main": (build_main, check_main_item),
    "other_ops": (build_other_ops, check_other_item),
}


def make_loader(name: str) -> DataLoader2:
    return DataLoader2(PIPELINES[name][0](), reading_service=InProcessReadingService(prefetch_cnt=2))


def assert_rejected(state: Any, name: str = "main") -> None:
    """A fresh loader of pipeline ``name`` refuses ``state`` with a StateError, without pickle."""
    with no_pickle():
        dl = make_loader(name)
        try:
            with pytest.raises(StateError):
                dl.load_state_dict(state)
        finally:
            dl.shutdown()


@functools.cache
def valid_states(name: str) -> tuple[dict[str, Any], ...]:
    """JSON round-tripped states: before any epoch, at several mid-epoch cuts, between epochs."""
    states = []
    for cut in (None, 0, 1, 5, 13, 2000):
        dl = make_loader(name)
        try:
            dl.seed(7)
            if cut == 2000:
                list(dl)
            elif cut is not None:
                it = iter(dl)
                for _ in range(cut):
                    next(it)
            states.append(json.loads(json.dumps(dl.state_dict())))
        finally:
            dl.shutdown()
    return tuple(states)


# --- no pickle -----------------------------------------------------------------------------


class PickleUsed(AssertionError):
    pass


@contextlib.contextmanager
def no_pickle() -> Iterator[None]:
    """Make every unpickling entry point raise while the body runs."""

    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise PickleUsed("state loading must never unpickle")

    targets: list[tuple[Any, str]] = [(pickle, "loads"), (pickle, "load")]
    with contextlib.suppress(ImportError):
        import cloudpickle

        targets += [(cloudpickle, "loads"), (cloudpickle, "load")]
    saved = [(mod, attr, getattr(mod, attr)) for mod, attr in targets if hasattr(mod, attr)]
    for mod, attr, _ in saved:
        setattr(mod, attr, forbidden)
    try:
        yield
    finally:
        for mod, attr, original in saved:
            setattr(mod, attr, original)


# --- mutations -----------------------------------------------------------------------------

JSON_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(-(1 << 70), 1 << 70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=6)
)
JSON = st.recursive(
    JSON_LEAVES,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=8,
)
PIPE_NAMES = st.sampled_from(
    ["IterableWrapper", "Shuffler", "ShardingFilter", "FlatMapper", "Batcher", "Prefetcher", "Unbatcher", "Cycler"]
)
STATE_KEYS = st.sampled_from(
    ["nodes", "pipe", "state", "before", "offset", "index", "pass", "window", "taken", "position", "upstream", "graph"]
)
REPLACEMENTS = st.one_of(
    st.none(),
    st.text(max_size=6),
    PIPE_NAMES,
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(0, 3).map(float),
    st.lists(JSON, max_size=3),
    st.dictionaries(st.text(max_size=4) | STATE_KEYS, JSON, max_size=3),
    st.integers(max_value=-1),
    st.integers(min_value=1 << 63, max_value=1 << 200),
    st.integers(0, 60),  # often valid-looking: a different but plausible position
    st.booleans(),
)


def strictly_equal(a: Any, b: Any) -> bool:
    """``==`` that also tells ``True`` from ``1``, ``1.0`` from ``1`` and NaN from NaN."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(strictly_equal(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(strictly_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


def paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path (tuple of keys and indices) into ``obj``, the root ``()`` included."""
    found = [prefix]
    if isinstance(obj, dict):
        for key, value in obj.items():
            found += paths(value, (*prefix, key))
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            found += paths(value, (*prefix, i))
    return found


def get(obj: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        obj = obj[step]
    return obj


MUTATIONS = ["delete", "add_key", "replace", "replace", "truncate", "whole", "tweak_int", "tweak_int", "splice"]


def mutate(data: st.DataObject, state: Any, donors: tuple[Any, ...]) -> Any:
    """One random corruption of ``state`` (a copy is changed; the result is returned).

    ``tweak_int`` and ``splice`` (a subtree from another valid state of the same pipeline)
    tend to keep the state well-formed, so iteration of odd-but-valid states is exercised.
    """
    state = copy.deepcopy(state)
    kind = data.draw(st.sampled_from(MUTATIONS), label="kind")
    if kind == "whole":
        return data.draw(JSON, label="whole state")
    all_paths = paths(state)
    if kind == "tweak_int":
        candidates = [p for p in all_paths if p and type(get(state, p)) is int]
        if not candidates:
            return state
        path = data.draw(st.sampled_from(candidates), label="tweak at")
        old = get(state, path)
        near = st.integers(0, 60) | st.integers(old - 2, old + 2)
        new = data.draw(near | st.sampled_from([2**63 - 1, 2**63, 2**64, -(2**63)]), label="new int")
        get(state, path[:-1])[path[-1]] = new
    elif kind == "splice":
        donor = data.draw(st.sampled_from(donors), label="donor")
        donor_paths = {p for p in paths(donor) if p}
        candidates = [p for p in all_paths if p in donor_paths]
        if not candidates:
            return state
        path = data.draw(st.sampled_from(candidates), label="splice at")
        get(state, path[:-1])[path[-1]] = copy.deepcopy(get(donor, path))
    elif kind == "delete":
        candidates = [p for p in all_paths if p]
        if not candidates:
            return state
        path = data.draw(st.sampled_from(candidates), label="delete at")
        del get(state, path[:-1])[path[-1]]
    elif kind == "add_key":
        candidates = [p for p in all_paths if isinstance(get(state, p), dict)]
        if not candidates:
            return state
        path = data.draw(st.sampled_from(candidates), label="add key at")
        key = data.draw(STATE_KEYS | st.text(max_size=5), label="key")
        get(state, path)[key] = data.draw(JSON, label="value")
    elif kind == "replace":
        path = data.draw(st.sampled_from(all_paths), label="replace at")
        value = data.draw(REPLACEMENTS, label="value")
        if not path:
            return value
        get(state, path[:-1])[path[-1]] = value
    elif kind == "truncate":
        candidates = [p for p in all_paths if isinstance(get(state, p), list) and get(state, p)]
        if not candidates:
            return state
        path = data.draw(st.sampled_from(candidates), label="truncate at")
        target = get(state, path)
        del target[data.draw(st.integers(0, len(target) - 1), label="keep") :]
    return state


def load_and_iterate(name: str, state: Any) -> None:
    """The contract for any input: StateError at once, or a state that iterates cleanly."""
    check_item = PIPELINES[name][1]
    dl = make_loader(name)
    try:
        try:
            dl.load_state_dict(state)
        except StateError:
            return
        except Exception as err:
            raise AssertionError(
                f"load_state_dict raised {type(err).__name__} instead of StateError: {err}\nstate: {state!r}"
            ) from err
        assert strictly_equal(dl.state_dict(), state), "a loaded state must read back unchanged"
        try:
            for _ in range(2):  # the rest of the resumed epoch, then a fresh one
                for item in dl:
                    check_item(item)
        except (StateError, ResumeError):
            pass
    finally:
        dl.shutdown()


# --- properties ----------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(PIPELINES))
@given(data=st.data())
def test_mutated_state_is_rejected_at_once_or_valid(name: str, data: st.DataObject) -> None:
    donors = valid_states(name)
    original = data.draw(st.sampled_from(donors), label="original")
    mutated = original
    for _ in range(data.draw(st.sampled_from([1, 1, 2, 3]), label="mutations")):
        mutated = mutate(data, mutated, donors)
    assume(not strictly_equal(mutated, original))
    with no_pickle():
        load_and_iterate(name, mutated)


@pytest.mark.timeout(60)
@settings(max_examples=scaled(30))
@given(data=st.data())
def test_rejected_state_changes_nothing(data: st.DataObject) -> None:
    """A state rejected by a loader in the middle of an epoch leaves it where it was."""
    donors = valid_states("main")
    mutated = mutate(data, data.draw(st.sampled_from(donors), label="original"), donors)
    full = make_loader("main")
    try:
        full.seed(7)
        expected = list(full)
    finally:
        full.shutdown()
    cut = data.draw(st.integers(0, len(expected)), label="cut")
    dl = make_loader("main")
    try:
        dl.seed(7)
        it = iter(dl)
        first = [next(it) for _ in range(cut)]
        before = json.loads(json.dumps(dl.state_dict()))
        with no_pickle():
            try:
                dl.load_state_dict(mutated)
            except StateError:
                pass
            else:
                return  # still a valid state: nothing to check here
        assert json.loads(json.dumps(dl.state_dict())) == before
        assert first + list(it) == expected
    finally:
        dl.shutdown()


@pytest.mark.timeout(60)
@given(state=JSON)
def test_random_json_is_rejected(state: Any) -> None:
    assert_rejected(state)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_valid_states_load_and_resume(name: str) -> None:
    with no_pickle():
        for state in valid_states(name):
            load_and_iterate(name, state)


@pytest.mark.parametrize(
    "build_other",
    [
        lambda: (
            IterableWrapper(list(range(40)))
            .shuffle(buffer_size=6)
            .sharding_filter()
            .flatmap(lambda x: [x, x + 100])
            .batch(4)
            .prefetch(2)
        ),
        lambda: (
            IterableWrapper(list(range(40)))
            .shuffle(buffer_size=6)
            .sharding_filter()
            .flatmap(lambda x: [x, x + 100])
            .batch(3)
            .map(len)
            .prefetch(2)
        ),
        lambda: IterableWrapper(list(range(40))).shuffle(buffer_size=7).sharding_filter().batch(3),
    ],
    ids=["batch_size", "extra_op", "fewer_ops"],
)
def test_state_of_another_pipeline(build_other: Callable[[], Any]) -> None:
    with no_pickle():
        for state in valid_states("main"):
            dl = DataLoader2(build_other(), reading_service=InProcessReadingService(prefetch_cnt=2))
            try:
                with pytest.raises(StateError, match=r"pipeline|fingerprint"):
                    dl.load_state_dict(state)
            finally:
                dl.shutdown()


def test_state_of_another_pipeline_with_forged_fingerprint() -> None:
    """Node states are checked too, not only the fingerprint."""
    other = DataLoader2(IterableWrapper(list(range(40))).shuffle(buffer_size=6).sharding_filter().batch(3))
    try:
        other.seed(1)
        it = iter(other)
        next(it)
        state = json.loads(json.dumps(other.state_dict()))
    finally:
        other.shutdown()
    state["fingerprint"] = valid_states("main")[0]["fingerprint"]
    assert_rejected(state)


@pytest.mark.parametrize("version", [0, 1, 6, -1, 1 << 80, "5", 5.0, True, None, [5]])
def test_wrong_version(version: Any) -> None:
    with no_pickle():
        for state in valid_states("main"):
            state = copy.deepcopy(state)
            state["version"] = version
            assert_rejected(state)


@pytest.mark.parametrize(
    "state",
    [
        None,
        b"",
        pickle.dumps({"format": "conveyor.DataLoader2"}),
        bytearray(b"{}"),
        [],
        [("format", "conveyor.DataLoader2")],
        "",
        "{}",
        0,
        1.5,
        True,
        (),
        set(),
        object(),
    ],
    ids=lambda v: type(v).__name__,
)
def test_non_dict_state(state: Any) -> None:
    assert_rejected(state)


def test_json_text_of_a_valid_state_is_rejected() -> None:
    """A user who forgot ``json.loads`` gets a StateError, not a crash."""
    assert_rejected(json.dumps(valid_states("main")[2]))


def test_no_pickle_guard_works() -> None:
    with no_pickle(), pytest.raises(PickleUsed):
        pickle.loads(pickle.dumps(1))
    assert pickle.loads(pickle.dumps(1)) == 1
