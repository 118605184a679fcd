"""State validation costs no more than the state (issue 13, item 11).

Only exact JSON types are accepted, without running any method of anything else; depth,
size and int range are bounded; every message is short, whatever the bad value's size.
"""

from __future__ import annotations

import ast
import collections
import contextlib
import enum
import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import conveyor.core.validation
from conveyor import DataLoader2, InProcessReadingService
from conveyor.core.validation import (
    INT_BOUND,
    MAX_CHARS,
    MAX_DEPTH,
    MIN_INT,
    check_plain_data,
    describe_state_value,
    require_keys,
    require_non_negative,
    require_position,
)
from conveyor.errors import StateError
from conveyor.pipes import IterableWrapper

#: Every message in this file must be shorter than this.
SHORT = 400


def make_loader() -> DataLoader2:
    pipe = IterableWrapper(list(range(30))).shuffle(buffer_size=4).sharding_filter().batch(2).prefetch(2)
    return DataLoader2(pipe, reading_service=InProcessReadingService(prefetch_cnt=2))


def mid_epoch_state() -> dict[str, Any]:
    """A JSON round-tripped state, three items into the first epoch."""
    dl = make_loader()
    try:
        dl.seed(3)
        it = iter(dl)
        for _ in range(3):
            next(it)
        return json.loads(json.dumps(dl.state_dict()))
    finally:
        dl.shutdown()


def load_error(state: Any) -> StateError:
    """The StateError a fresh loader raises for ``state`` (it must raise one)."""
    dl = make_loader()
    try:
        with pytest.raises(StateError) as info:
            dl.load_state_dict(state)
        return info.value
    finally:
        dl.shutdown()


def plain_error(value: Any, **limits: int) -> str:
    with pytest.raises(StateError) as info:
        check_plain_data(value, "state", **limits)
    message = str(info.value)
    assert len(message) < SHORT, message[:SHORT]
    return message


def nested_lists(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


# --- huge values ---------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_a_100_mb_string_is_refused_with_a_short_message() -> None:
    huge = "x" * 100_000_000
    state = mid_epoch_state()
    for bad in ({**state, "format": huge}, {**state, huge: 1}, huge, [huge]):
        message = str(load_error(bad))
        assert len(message) < SHORT
        assert "100000000 characters" in message
    # Under the total budget, the helpers still show only its start and length.
    big = "y" * 10_000_000
    with pytest.raises(StateError) as info:
        require_keys({"a": big}, {"a": int}, "w")
    assert len(str(info.value)) < SHORT and "10000000 characters" in str(info.value)


@pytest.mark.timeout(60)
def test_a_million_digit_int_is_refused_without_formatting_it() -> None:
    huge = 1 << 3_321_929  # about 10**1_000_000; str() of it would take seconds
    state = mid_epoch_state()
    for bad in (huge, -huge):
        for where in ("seed", "items", "epoch"):
            message = str(load_error({**state, where: bad}))
            assert len(message) < SHORT and "an int of 3321930 bits" in message
        assert "3321930 bits" in plain_error({"a": [bad]})
    assert describe_state_value(huge) == "an int of 3321930 bits"
    with pytest.raises(StateError, match="3321930 bits") as info:
        require_non_negative({"n": huge}, "n", "w")
    assert len(str(info.value)) < SHORT
    with pytest.raises(StateError, match="3321930 bits"):
        require_position([1, huge], "w")


def test_int_bounds() -> None:
    check_plain_data([MIN_INT, INT_BOUND - 1, 0, -1], "state")
    for bad in (MIN_INT - 1, INT_BOUND, 1 << 200):
        assert "outside [-2**63, 2**64)" in plain_error([bad])


# --- depth and size ------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_a_hundred_thousand_deep_list_is_a_state_error_not_a_recursion_error() -> None:
    deep = nested_lists(100_000)
    assert f"nested more than {MAX_DEPTH} deep" in plain_error(deep)
    state = mid_epoch_state()
    for bad in (deep, {**state, "reading_service": deep}, {**state, "extra": {"a": deep}}):
        assert "nested more than" in str(load_error(bad))
    deep_dict: dict[str, Any] = {}
    for _ in range(100_000):
        deep_dict = {"k": deep_dict}
    assert "nested more than" in str(load_error(deep_dict))


def test_depth_limit_is_exact() -> None:
    check_plain_data(nested_lists(MAX_DEPTH), "state")
    plain_error(nested_lists(MAX_DEPTH + 1))
    check_plain_data(nested_lists(5), "state", max_depth=5)
    message = plain_error(nested_lists(6), max_depth=5)
    assert message.startswith("state[0][0][0][0][0]: ")


@pytest.mark.timeout(60)
def test_cycles_and_shared_subtrees_are_bounded() -> None:
    loop: list[Any] = [1]
    loop.append(loop)
    assert "nested more than" in plain_error(loop)
    mapping: dict[str, Any] = {}
    mapping["self"] = mapping
    assert "nested more than" in plain_error(mapping)
    laughs: list[Any] = [0]
    for _ in range(60):  # 2**60 nodes through shared references: the item limit stops it
        laughs = [laughs, laughs]
    assert "values in all" in plain_error(laughs)
    assert "values in all" in plain_error([[0] * 10, [0] * 10], max_items=15)
    check_plain_data([[0] * 10, [0] * 10], "state", max_items=23)


def test_string_budget_counts_keys_and_values() -> None:
    check_plain_data({"ab": "cd", "e": ["fg"]}, "state", max_chars=7)
    assert "characters in all" in plain_error({"ab": "cd", "e": ["fgh"]}, max_chars=7)
    assert "characters in all" in plain_error({"abcdefgh": 1}, max_chars=7)
    assert MAX_CHARS < 100_000_000


# --- exact types only ----------------------------------------------------------------------

CALLS: list[str] = []
ARMED = [False]

#: The methods a spy records (and refuses) once armed.
# fmt: off
SPIED = [
    "__eq__", "__ne__", "__hash__", "__lt__", "__le__", "__gt__", "__ge__", "__len__", "__iter__", "__contains__",
    "__getitem__", "__repr__", "__str__", "__format__", "__bool__", "__int__", "__index__", "__float__",
    "__reduce__", "__reduce_ex__", "__deepcopy__", "__copy__", "keys", "items", "values", "get", "copy",
    "__getattr__",
]
# fmt: on


class SpyMeta(type):
    """A metaclass whose ``__name__`` and checks would record a call."""

    @property
    def __name__(cls) -> str:  # type: ignore[override]
        CALLS.append("meta __name__")
        raise AssertionError("metaclass __name__ read")

    def __instancecheck__(cls, instance: Any) -> bool:
        CALLS.append("__instancecheck__")
        raise AssertionError("__instancecheck__ called")

    def __subclasscheck__(cls, subclass: Any) -> bool:
        CALLS.append("__subclasscheck__")
        raise AssertionError("__subclasscheck__ called")


def spy_method(name: str, original: Callable[..., Any] | None) -> Callable[..., Any]:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if ARMED[0]:
            CALLS.append(name)
            raise AssertionError(f"{name} was called")
        if original is None:
            raise AttributeError(name)
        return original(self, *args, **kwargs)

    return method


def spy_class(base: type, metaclass: type = type) -> type:
    """A subclass of ``base`` whose every method records the call and raises once armed."""
    namespace: dict[str, Any] = {
        name: spy_method(name, getattr(base, name, None))
        for name in SPIED
        if getattr(base, name, None) is not None or name == "__getattr__"
    }
    namespace["__class__"] = property(spy_method("__class__", lambda self: base))
    return metaclass(f"Spy{base.__name__.title()}", (base,), namespace)


SpyDict, SpyList, SpyStr, SpyInt, SpyFloat = (spy_class(b) for b in (dict, list, str, int, float))
MetaSpyInt = spy_class(int, SpyMeta)


class Color(enum.IntEnum):
    RED = 1


class Letter(enum.StrEnum):
    A = "format"


def foreign_values() -> list[Any]:
    """Values that JSON never produces; the spies are built before ``ARMED`` is set."""
    return [
        SpyDict({"a": 1}),
        SpyList([1, 2]),
        SpyStr("format"),
        SpyInt(5),
        SpyFloat(1.5),
        MetaSpyInt(7),
        Color.RED,
        Letter.A,
        collections.OrderedDict(a=1),
        collections.defaultdict(int, a=1),
        collections.Counter("ab"),
        (1, 2),
        collections.namedtuple("Point", "x y")(1, 2),
        b"bytes",
        {1, 2},
        1 + 2j,
        object(),
        math.inf,
    ]


@contextlib.contextmanager
def spies_armed() -> Iterator[None]:
    """While the body runs, any spy method called records itself and raises; none may be."""
    CALLS.clear()
    ARMED[0] = True
    try:
        yield
    finally:
        ARMED[0] = False
    assert CALLS == [], f"methods of a subclass were called: {CALLS}"


@pytest.mark.parametrize("index", range(len(foreign_values())))
def test_foreign_values_are_refused_without_running_their_methods(index: int) -> None:
    state = mid_epoch_state()
    value = foreign_values()[index]
    key_value = SpyStr("seed")  # equal to "seed", with the same hash: a dict lookup would call its __eq__
    keyed = {key_value: 1}
    placements = [
        value,
        {**state, "seed": value},
        {**state, "reading_service": {"main": [value]}},
        {**{k: v for k, v in state.items() if k != "seed"}, key_value: state["seed"]},
    ]
    with spies_armed():
        for bad in placements:
            assert len(str(load_error(bad))) < SHORT
            assert len(describe_state_value(bad)) < SHORT
        assert len(describe_state_value(value)) < SHORT
        with pytest.raises(StateError):
            require_keys(value, {"a": int}, "w")
        with pytest.raises(StateError):
            require_keys({"a": value}, {"a": int}, "w")
        with pytest.raises(StateError):
            require_keys(keyed, {"seed": int}, "w")
        with pytest.raises(StateError):
            require_non_negative({"a": value}, "a", "w")
        with pytest.raises(StateError):
            require_position([value], "w")
        with pytest.raises(StateError):
            require_position(value, "w")


def test_messages_name_the_class_and_the_path() -> None:
    state = {"reading_service": {"main": [0, 1, 2, Color.RED]}}
    spy = SpyInt(1)
    with spies_armed():
        message = plain_error(state)
        assert message.startswith("state['reading_service']['main'][3]: a value of type Color (a subclass of int)")
        assert describe_state_value(spy) == "a value of type SpyInt (a subclass of int)"
        assert describe_state_value((1, 2, 3)) == "a tuple of 3 items"


def test_a_metaclass_name_property_is_not_read() -> None:
    value = MetaSpyInt(1)
    with spies_armed():
        assert describe_state_value(value) == "a value of type SpyInt (a subclass of int)"
        assert "SpyInt" in plain_error([value])


def test_non_finite_floats_are_refused() -> None:
    check_plain_data([0.0, -0.0, 1.5, -1e308, 5e-324], "state")
    for bad in (math.nan, math.inf, -math.inf):
        assert "not a finite number" in plain_error({"a": [1, bad]})
    assert "not a finite number" in str(load_error({**mid_epoch_state(), "items": math.nan}))


@pytest.mark.parametrize("key", [1, None, True, 1.5, (1, 2), b"x", frozenset()])
def test_non_str_keys_are_refused(key: Any) -> None:
    message = plain_error({"a": [{"b": 1, key: 2}]})
    assert message.startswith("state['a'][0]: dict keys must be exact str")
    with pytest.raises(StateError, match="keys must be exact str"):
        require_keys({key: 1}, {"a": int}, "w")


def test_tuples_are_refused() -> None:
    assert "a tuple of 2 items" in plain_error((1, 2))
    assert plain_error({"position": [0, (1, 2)]}).startswith("state['position'][1]: a tuple of 2 items")
    assert "tuple" in str(load_error({**mid_epoch_state(), "reading_service": ()}))


# --- bounded messages ----------------------------------------------------------------------


def test_long_paths_and_keys_are_cut() -> None:
    value: Any = math.nan
    for i in range(50):
        value = {f"{i}" + "k" * 1000: value}
    message = plain_error(value)
    assert "levels ..." in message and "'49kkk" in message and "'0kkk" in message


def test_require_keys_lists_at_most_ten_keys_each_cut_short() -> None:
    state = {f"key{i}" + "z" * 100: i for i in range(100_000)}
    with pytest.raises(StateError, match=r"missing keys \['a'\], unexpected keys \['key0zz") as info:
        require_keys(state, {"a": int}, "w")
    assert len(str(info.value)) < SHORT and "(+99990 more)" in str(info.value)


@given(st.recursive(st.text() | st.integers() | st.floats(), lambda c: st.lists(c) | st.dictionaries(st.text(), c)))
def test_descriptions_are_bounded(value: Any) -> None:
    assert len(describe_state_value(value)) <= 160
    assert len(describe_state_value(value, 20)) <= 100


def test_descriptions_of_big_containers() -> None:
    assert describe_state_value([1, [2], {}, "a"]) == "[1, [...], {}, 'a']"
    assert describe_state_value({"a": 1, "b": {"c": 2}}) == "{'a': 1, 'b': {...}}"
    text = describe_state_value(list(range(10**6)))
    assert text.endswith(", ...] (a list of 1000000 entries)") and len(text) < 160
    assert "(a str of 1000 characters)" in describe_state_value("\x00" * 1000)
    assert len(describe_state_value("\U000e0001" * 20)) < 160


# --- every plain value is accepted, every foreign one refused ------------------------------

JSON_ROUND_TRIPPED = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(MIN_INT, INT_BOUND - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=30,
).map(lambda v: json.loads(json.dumps(v, allow_nan=False)))


@given(JSON_ROUND_TRIPPED)
def test_json_data_within_limits_is_accepted(value: Any) -> None:
    check_plain_data(value, "state")


def containers_in(value: Any) -> list[Any]:
    found, todo = [], [value]
    while todo:
        node = todo.pop()
        if type(node) in (list, dict):
            found.append(node)
            todo.extend(node.values() if type(node) is dict else node)
    return found


@given(JSON_ROUND_TRIPPED, st.sampled_from(range(len(foreign_values()))), st.data())
def test_data_with_any_foreign_node_is_refused(value: Any, index: int, data: st.DataObject) -> None:
    foreign = foreign_values()[index]
    containers = containers_in(value)
    if not containers:
        value = foreign
    else:
        target = data.draw(st.sampled_from(containers))
        if type(target) is list:
            target.insert(data.draw(st.integers(0, len(target))), foreign)
        elif data.draw(st.booleans()) or type(foreign) in (dict, list, set) or not hash_safe(foreign):
            target[data.draw(st.text(max_size=3))] = foreign
        else:
            target[foreign] = 0
    with spies_armed(), pytest.raises(StateError):
        check_plain_data(value, "state")


def hash_safe(value: Any) -> bool:
    """Whether ``value`` can be a dict key (spies are: their hooks run only once armed)."""
    try:
        hash(value)
    except TypeError:
        return False
    return True


# --- real states and the module's contract ------------------------------------------------


def test_real_states_pass_unchanged() -> None:
    state = mid_epoch_state()
    check_plain_data(state, "state")
    dl = make_loader()
    try:
        dl.load_state_dict(state)
        assert dl.state_dict() == state
        check_plain_data(dl.state_dict(), "state")  # as returned, before any JSON round trip
    finally:
        dl.shutdown()


def test_validation_imports_nothing_from_conveyor_but_errors() -> None:
    tree = ast.parse(Path(conveyor.core.validation.__file__).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert {name for name in imported if name and name.startswith("conveyor")} == {"conveyor.errors"}
