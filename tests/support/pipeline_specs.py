"""Random pipelines from a plain-data spec, for the property tests: a spec is ``(n, ops)``,
a source of ``n`` items and a tuple of op tuples; :func:`build` turns it into a fresh graph
each call (so an uninterrupted run and an interrupted-then-resumed run read identical
graphs) and :func:`reference` is its plain-Python model."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from conveyor import DataLoader2, InProcessReadingService
from conveyor.pipes import IterableWrapper

MAX_N = 60
SEEDS = st.integers(min_value=0, max_value=(1 << 64) - 1)

# --- specs -------------------------------------------------------------------------------

RANDOM_KINDS = frozenset({"shuffle", "random_map"})


#: Ops that split the pipe into branches and join them again (fork, demux, ...).
BRANCHING_OPS = (
    st.tuples(st.just("fork_zip")),
    st.tuples(st.just("demux_mux"), st.integers(2, 3)),
    st.tuples(st.just("round_robin_concat"), st.integers(1, 3)),
    st.tuples(st.just("unzip")),
)


def _op_strategy(allow_random: bool, allow_sharding: bool) -> st.SearchStrategy[tuple[Any, ...]]:
    ops = [
        st.tuples(st.just("map"), st.integers(-3, 5)),
        st.tuples(st.just("filter"), st.integers(2, 4), st.integers(0, 3)),
        st.tuples(st.just("flatmap2")),
        st.tuples(st.just("flatmap_var")),
        st.tuples(st.just("batch"), st.integers(1, 7), st.booleans()),
        st.tuples(st.just("header"), st.integers(0, 8) | st.integers(0, 80)),
        st.tuples(st.just("enumerate")),
        st.tuples(st.just("cycle")),
        st.tuples(st.just("prefetch"), st.integers(1, 4)),
        *BRANCHING_OPS,
    ]
    if allow_sharding:
        ops.append(st.tuples(st.just("sharding_filter")))
    if allow_random:
        ops.append(st.tuples(st.just("shuffle"), st.integers(1, 12)))
        ops.append(st.tuples(st.just("random_map")))
    return st.one_of(ops)


@st.composite
def specs(draw: st.DrawFn, allow_random: bool = True, max_ops: int = 6) -> tuple[int, tuple[tuple[Any, ...], ...]]:
    """``(n, ops)``: a source of ``n`` items and up to ``max_ops`` ops (one sharding_filter at most)."""
    n = draw(st.integers(0, MAX_N))
    count = draw(st.integers(0, max_ops))
    ops: list[tuple[Any, ...]] = []
    sharded = False
    for _ in range(count):
        op = draw(_op_strategy(allow_random, allow_sharding=not sharded))
        sharded = sharded or op[0] == "sharding_filter"
        ops.append(op)
    return n, tuple(ops)


def build(spec: tuple[int, tuple[tuple[Any, ...], ...]]) -> Any:
    """A fresh graph for ``spec``."""
    n, ops = spec
    pipe: Any = IterableWrapper(list(range(n)))
    for op in ops:
        kind = op[0]
        if kind == "map":
            a = op[1]
            pipe = pipe.map(lambda x, a=a: x * 3 + a)
        elif kind == "filter":
            m, r = op[1], op[2]
            pipe = pipe.filter(lambda x, m=m, r=r: x % m != r)
        elif kind == "flatmap2":
            pipe = pipe.flatmap(lambda x: [x, x])
        elif kind == "flatmap_var":
            pipe = pipe.flatmap(lambda x: [x] * (x % 3))
        elif kind == "batch":
            pipe = pipe.batch(op[1], drop_last=op[2]).unbatch()
        elif kind == "shuffle":
            pipe = pipe.shuffle(buffer_size=op[1])
        elif kind == "sharding_filter":
            pipe = pipe.sharding_filter()
        elif kind == "header":
            pipe = pipe.header(op[1])
        elif kind == "enumerate":
            pipe = pipe.enumerate().map(lambda t: t[1])
        elif kind == "cycle":
            pipe = pipe.cycle(2)
        elif kind == "prefetch":
            pipe = pipe.prefetch(op[1])
        elif kind == "fork_zip":
            a, b = pipe.fork(2)
            pipe = a.zip(b.map(lambda x: x + 1)).map(lambda t: t[0] * 2 + t[1])
        elif kind == "demux_mux":
            pipe = _mux_longest(*pipe.demux(op[1], lambda x, k=op[1]: x % k, buffer_size=-1))
        elif kind == "round_robin_concat":
            pipe = _concat(*pipe.round_robin_demux(op[1], buffer_size=-1))
        elif kind == "unzip":
            left, right = pipe.map(lambda x: (x, -x)).unzip(2)
            pipe = left.zip(right).map(lambda t: t[0] - t[1])
        elif kind == "random_map":
            pipe = pipe.random_map(lambda x, rng: (x, int(rng.integers(1000)))).map(lambda p: p[0] * 1000 + p[1])
        else:  # pragma: no cover - the strategy only makes the kinds above
            raise AssertionError(kind)
    return pipe


def reference(spec: tuple[int, tuple[tuple[Any, ...], ...]], shuffle_as_identity: bool = False) -> list[Any]:
    """Plain-Python model of ``build(spec)`` (no random ops, or shuffles taken as identity)."""
    n, ops = spec
    xs: list[Any] = list(range(n))
    for op in ops:
        kind = op[0]
        if kind == "map":
            xs = [x * 3 + op[1] for x in xs]
        elif kind == "filter":
            xs = [x for x in xs if x % op[1] != op[2]]
        elif kind == "flatmap2":
            xs = [y for x in xs for y in (x, x)]
        elif kind == "flatmap_var":
            xs = [y for x in xs for y in [x] * (x % 3)]
        elif kind == "batch":
            if op[2]:
                xs = xs[: len(xs) - len(xs) % op[1]]
        elif kind == "header":
            xs = xs[: op[1]]
        elif kind == "cycle":
            xs = xs * 2
        elif kind == "fork_zip":
            xs = [3 * x + 1 for x in xs]
        elif kind == "demux_mux":
            xs = _interleave_longest([[x for x in xs if x % op[1] == k] for k in range(op[1])])
        elif kind == "round_robin_concat":
            xs = [x for k in range(op[1]) for x in xs[k :: op[1]]]
        elif kind == "unzip":
            xs = [2 * x for x in xs]
        elif kind in ("enumerate", "prefetch", "sharding_filter") or (kind == "shuffle" and shuffle_as_identity):
            pass
        else:
            raise AssertionError(f"no reference for {kind}")
    return xs


def _mux_longest(first: Any, *others: Any) -> Any:
    return first.mux_longest(*others) if others else first


def _concat(first: Any, *others: Any) -> Any:
    return first.concat(*others) if others else first


def _interleave_longest(groups: list[list[Any]]) -> list[Any]:
    out: list[Any] = []
    for i in range(max((len(g) for g in groups), default=0)):
        out.extend(g[i] for g in groups if i < len(g))
    return out


def has_random(spec: tuple[int, tuple[tuple[Any, ...], ...]]) -> bool:
    return any(op[0] in RANDOM_KINDS for op in spec[1])


# --- loader helpers ----------------------------------------------------------------------


def make_loader(spec: Any, prefetch_cnt: int | None = None) -> DataLoader2:
    service = InProcessReadingService(prefetch_cnt=prefetch_cnt) if prefetch_cnt is not None else None
    return DataLoader2(build(spec), reading_service=service)


def epochs(spec: Any, seed: int, count: int = 2, prefetch_cnt: int | None = None) -> list[list[Any]]:
    """``count`` uninterrupted epochs of a loader seeded ``seed``."""
    dl = make_loader(spec, prefetch_cnt)
    try:
        dl.seed(seed)
        return [list(dl) for _ in range(count)]
    finally:
        dl.shutdown()


# --- sharded specs: ops before one sharding_filter, then ops after it ---------------------

BEFORE = st.one_of(
    st.tuples(st.just("map"), st.integers(-3, 5)),
    st.tuples(st.just("filter"), st.integers(2, 4), st.integers(0, 3)),
    st.tuples(st.just("flatmap2")),
    st.tuples(st.just("shuffle"), st.integers(1, 12)),
    st.tuples(st.just("batch"), st.integers(1, 7), st.booleans()),
    st.tuples(st.just("cycle")),
    *BRANCHING_OPS,
)
PER_ITEM = st.one_of(
    st.tuples(st.just("map"), st.integers(-3, 5)),
    st.tuples(st.just("filter"), st.integers(2, 4), st.integers(0, 3)),
    st.tuples(st.just("flatmap2")),
    st.tuples(st.just("flatmap_var")),
    st.tuples(st.just("random_map")),
)
GROUPING = st.one_of(
    PER_ITEM,
    st.tuples(st.just("shuffle"), st.integers(1, 12)),
    st.tuples(st.just("batch"), st.integers(1, 7), st.booleans()),
    st.tuples(st.just("header"), st.integers(0, 30)),
    st.tuples(st.just("enumerate")),
    st.tuples(st.just("cycle")),
    *BRANCHING_OPS,
)


@st.composite
def sharded_specs(draw: st.DrawFn, after: st.SearchStrategy[Any]) -> tuple[int, tuple[tuple[Any, ...], ...]]:
    n = draw(st.integers(0, 50))
    before = draw(st.lists(BEFORE, max_size=2))
    later = draw(st.lists(after, max_size=4))
    return n, (*before, ("sharding_filter",), *later)
