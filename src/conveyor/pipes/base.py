"""The pipe contract: lazy nodes that know their inputs, carry their own state and a name.

A pipe is a node in a graph. It keeps its inputs in public attributes, so graph tools walk
the graph by looking at attributes, never by pickling it. Each op is a small class that
registers itself under a functional name (``pipe.map(fn)`` builds ``Mapper(pipe, fn)``).

State contract. A node's ``state_dict()`` describes where its *most recent* iteration is,
as plain data, right after the last item it yielded; it holds only the node's own part
(most nodes hold nothing) and the graph's state is the list of all nodes' parts
(:mod:`conveyor.state`). ``load_state_dict()`` validates and stages a state; the node's next
``__iter__`` starts from it instead of from the beginning. Nodes update their counters
*before* they yield, so a state taken between two items is exact.
"""

from __future__ import annotations

import functools
import sys
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar, TypeVar

from conveyor.errors import StateError
from conveyor.random import PipeRandomness, fresh_randomness
from conveyor.validation import require_keys, require_non_negative

T = TypeVar("T")

#: An item's position at the sharding point: the index there, followed by sub-indices
#: added by ops that expand one item into several (``flatmap``, ``unbatch``).
Position = tuple[int, ...]


def describe_value(value: Any) -> str:
    """A short, stable text for a constructor argument (used by ``repr`` and fingerprints)."""
    if isinstance(value, functools.partial):
        return f"partial({describe_value(value.func)})"
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{getattr(value, '__module__', '?')}.{value.__qualname__}"
    if isinstance(value, DataPipe):
        return type(value).__name__
    if isinstance(value, (int, float, str, bool, type(None))):
        return repr(value)
    if isinstance(value, (list, tuple)) and len(value) <= 8:
        inner = ", ".join(describe_value(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    return type(value).__name__


class DataPipe:
    """Common base of iterable and random-access pipes: inputs, naming, length errors."""

    #: Attribute names that define what the node does; shown by ``repr`` and hashed into
    #: the graph fingerprint. Runtime counters never belong here.
    _params: ClassVar[tuple[str, ...]] = ()

    def inputs(self) -> list[DataPipe]:
        """The pipes this node reads from, in a stable order (public attributes only)."""
        found: list[DataPipe] = []
        for name, value in vars(self).items():
            if name.startswith("_"):
                continue
            if isinstance(value, DataPipe):
                found.append(value)
            elif isinstance(value, (list, tuple)):
                found.extend(v for v in value if isinstance(v, DataPipe))
        return found

    def __repr__(self) -> str:
        args = ", ".join(f"{name}={describe_value(getattr(self, name, None))}" for name in self._params)
        return f"{type(self).__name__}({args})"

    def _no_length(self, why: str) -> TypeError:
        return TypeError(f"{self!r} has no length: {why}. Use .set_length(n) if you know it.")

    def __getstate__(self) -> dict[str, Any]:
        """Plain ``pickle`` works on a graph whose ops hold lambdas or local functions
        (directly or in a ``functools.partial``): those travel by value (cloudpickle), as
        :mod:`conveyor.serialization` sends them."""
        state = dict(self.__dict__)
        for name, value in state.items():
            if _found_by_name_only(value) is False:
                state[name] = _ByValue(value)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        # A shallow copy gets the wrappers themselves back.
        self.__dict__.update({k: v.function if type(v) is _ByValue else v for k, v in state.items()})


def _found_by_name_only(value: Any) -> bool | None:
    """For a function (or a partial of one): whether plain pickle finds every function in it
    again by module and qualified name; None for anything else."""
    if isinstance(value, functools.partial):
        parts = [value.func, *value.args, *value.keywords.values()]
        verdicts = [_found_by_name_only(part) for part in parts]
        return None if all(v is None for v in verdicts) else all(v is not False for v in verdicts)
    if not isinstance(value, types.FunctionType):
        return None
    target: Any = sys.modules.get(value.__module__)
    for part in value.__qualname__.split("."):
        target = getattr(target, part, None)
    return target is value


class _ByValue:
    """A function pickled by value; a copy is the function itself, as for any function."""

    __slots__ = ("function",)

    def __init__(self, function: Callable[..., Any]):
        self.function = function

    def __reduce__(self) -> tuple[Any, ...]:
        from conveyor.serialization import dumps, loads

        return loads, (dumps(self.function),)

    def __deepcopy__(self, memo: dict[int, Any]) -> Callable[..., Any]:
        return self.function


class IterDataPipe(DataPipe):
    """A lazy, re-iterable stream of items. Each ``iter()`` starts a new pass.

    Subclasses implement ``__iter__``; stateful ones also ``state_dict``, ``_check_state``
    and read their staged state with ``_take_restored()`` at the start of ``__iter__``.
    """

    _functional_names: ClassVar[dict[str, type]] = {}

    #: True for ops that treat each item on its own (map, filter, flatmap, ...): after the
    #: sharding point their output does not depend on how items are split among workers.
    per_item: ClassVar[bool] = False
    #: True for ops whose output keeps the order of positions at the sharding point (every
    #: per-item op, and batch, header, enumerate). The multiprocessing merge follows
    #: positions only when every op after the sharding point keeps their order.
    keeps_order: ClassVar[bool] = False
    #: False for ops that must run once, in the main process (pin memory, fullsync).
    replicable: ClassVar[bool] = True

    def __iter__(self) -> Iterator[Any]:
        raise NotImplementedError(f"{type(self).__name__} must implement __iter__")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "__iter__" in cls.__dict__:
            cls.__iter__ = _metered(cls.__dict__["__iter__"])  # type: ignore[method-assign]

    def __len__(self) -> int:
        raise self._no_length("its length is not known in advance")

    # --- functional registration -------------------------------------------------------

    @classmethod
    def register_functional(cls, name: str, aliases: Mapping[str, str] | None = None) -> Callable[[type[T]], type[T]]:
        """Class decorator: make ``pipe.<name>(*args, **kw)`` build ``Op(pipe, *args, **kw)``.

        ``aliases`` maps other keyword names to the op's own: ``batch(n=4)`` (this
        project's spelling) and ``batch(batch_size=4)`` (torchdata's) are the same call.
        """
        renames = dict(aliases or {})

        def decorate(op: type[T]) -> type[T]:
            registry = cls._registry()
            if name in registry and registry[name] is not op:
                raise ValueError(f"functional name {name!r} is already taken by {registry[name]}")
            registry[name] = op

            def method(self: DataPipe, *args: Any, **kwargs: Any) -> Any:
                for alias in renames.keys() & kwargs.keys():
                    own = renames[alias]
                    if own in kwargs:
                        raise TypeError(f"{name}() got both {alias}= and {own}=, which name the same argument")
                    kwargs[own] = kwargs.pop(alias)
                return op(self, *args, **kwargs)

            method.__name__ = name
            method.__qualname__ = f"{cls.__name__}.{name}"
            method.__doc__ = op.__doc__
            setattr(cls, name, method)
            return op

        return decorate

    @classmethod
    def _registry(cls) -> dict[str, type]:
        return IterDataPipe._functional_names

    # --- state --------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """This node's own position as plain data (``{}`` for stateless nodes).

        A staged state (loaded, not yet iterated) is reported as it is, so a state taken
        right after ``load_state_dict`` round-trips.
        """
        staged = self.__dict__.get("_restored")
        return dict(staged) if staged is not None else self._current_state()

    def _current_state(self) -> dict[str, Any]:
        """The live state of this node's current pass; stateful subclasses override it."""
        return {}

    def _check_state(self, state: Mapping[str, Any]) -> None:
        """Raise :class:`StateError` unless ``state`` is a valid state of this node.

        Must not change the node: :func:`conveyor.state.validate_graph_state` calls it to
        validate a whole graph's state before anything is loaded.
        """
        if state:
            raise StateError(f"{self!r} holds no state, but was given keys {sorted(state)}")

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Validate ``state`` and stage it: the next ``iter()`` resumes from it."""
        if not isinstance(state, Mapping):
            raise StateError(f"state of {self!r} must be a mapping, got {type(state).__name__}")
        self._check_state(state)
        self._restored = dict(state) if state else None

    def _take_restored(self) -> dict[str, Any] | None:
        """The staged state, once; ``None`` when this pass starts from the beginning."""
        return self.__dict__.pop("_restored", None)

    def _resuming(self) -> bool:
        """Whether a staged state waits for this node's next pass."""
        return "_restored" in self.__dict__

    def _abandon_restored(self) -> None:
        """The pass that a staged state resumes will not reach this node (an op downstream,
        like ``header``, ended it early) and a new pass of the same epoch follows: a node
        that numbers its passes counts that one as begun. The next :meth:`reset` drops the
        state itself."""

    def reset(self) -> None:
        """Forget progress and any staged state: ``state_dict()`` now describes a pass that
        has not started. The loader resets every node when a fresh epoch begins, so nodes
        that an epoch has not reached yet report a start, not last epoch's end.
        Stateful subclasses extend it to reset their counters.
        """
        self.__dict__.pop("_restored", None)

    # --- item positions at the sharding point ------------------------------------------

    def item_position(self) -> Position | None:
        """Position at the sharding point of the item this node yielded last, if known.

        Random ops after the sharding point key their randomness by it, so their output
        does not depend on which worker or rank ran the item.
        """
        source = getattr(self, "source", None)
        if isinstance(source, IterDataPipe):
            return source.item_position()
        inputs = self.inputs()
        return inputs[0].item_position() if inputs and isinstance(inputs[0], IterDataPipe) else None


def _metered(iter_fn: Callable[[Any], Iterator[Any]]) -> Callable[[Any], Iterator[Any]]:
    """``iter_fn``, counting the items of nodes that carry a stage meter (see
    :mod:`conveyor.stats`); one dictionary lookup per pass for the others."""

    @functools.wraps(iter_fn)
    def __iter__(self: Any) -> Iterator[Any]:
        items = iter_fn(self)
        meter = self.__dict__.get("_meter")
        if meter is None or type(self).__iter__ is not __iter__:
            return items  # not metered, or a subclass's __iter__ calling this one: counted there
        return meter.count(items)

    return __iter__


class CountingPipe(IterDataPipe):
    """Base for ops whose whole state is one non-negative counter named ``_counter``."""

    _counter: ClassVar[str] = "count"
    _count = 0

    def _start_count(self) -> int:
        """The counter a pass starts from: the staged state's, or 0."""
        resume = self._take_restored()
        self._count = resume[self._counter] if resume else 0
        return self._count

    def reset(self) -> None:
        super().reset()
        self._count = 0

    def _current_state(self) -> dict[str, Any]:
        return {self._counter: self._count}

    def _check_state(self, state: Mapping[str, Any]) -> None:
        require_keys(state, {self._counter: int}, repr(self))
        require_non_negative(state, self._counter, repr(self))


class PassNumbering:
    """An op that numbers its passes (``_passes``: passes begun this epoch) and whose state
    names the pass it is in (``"pass"``): mix it in before :class:`IterDataPipe`."""

    _passes: int
    _pass: int

    def set_randomness(self, randomness: Any) -> None:
        """A new epoch's randomness: its passes count from 0, and the pass this node has not
        begun yet is pass 0 (a state saved before it begins must say so)."""
        super().set_randomness(randomness)  # type: ignore[misc]
        self._passes = self._pass = 0

    def _abandon_restored(self) -> None:
        staged = self.__dict__.get("_restored")
        if staged:
            self._passes = max(self._passes, staged["pass"] + 1)


class PassCounting(PassNumbering):
    """State of an op that counts its passes and the items of the current one (a random op
    keyed by ``(pass, count)``, so a graph read twice in an epoch draws anew): mix it in
    before :class:`IterDataPipe`; the op sets ``_passes``, ``_pass`` and ``_count``."""

    _pass: int
    _count: int

    def reset(self) -> None:
        super().reset()  # type: ignore[misc]
        self._pass, self._count = self._passes, 0

    def _current_state(self) -> dict[str, Any]:
        return {"pass": self._pass, "count": self._count}

    def _check_state(self, state: Mapping[str, Any]) -> None:
        require_keys(state, {"pass": int, "count": int}, repr(self))
        require_non_negative(state, "pass", repr(self))
        require_non_negative(state, "count", repr(self))


class MapDataPipe(DataPipe):
    """A random-access collection of items: ``__getitem__`` and ``__len__``."""

    _functional_names: ClassVar[dict[str, type]] = {}

    def __getitem__(self, index: int) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement __getitem__")

    def __len__(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} must implement __len__")

    def __iter__(self) -> Iterator[Any]:
        for index in range(len(self)):
            yield self[index]

    def state_dict(self) -> dict[str, Any]:
        """Random access has no position of its own (the pipe that iterates it keeps the
        index), so its state is always ``{}``."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Accept the empty state :meth:`state_dict` returns; anything else is a
        :class:`~conveyor.errors.StateError`."""
        if not isinstance(state, Mapping):
            raise StateError(f"state of {self!r} must be a mapping, got {type(state).__name__}")
        if state:
            raise StateError(f"{self!r} holds no state, but was given keys {sorted(state)}")

    def to_iter_datapipe(self) -> IterDataPipe:
        """An ``IterDataPipe`` over this pipe's items in index order (O(1) resume)."""
        from conveyor.pipes.map_pipes import MapToIterConverter

        return MapToIterConverter(self)

    register_functional = classmethod(IterDataPipe.register_functional.__func__)  # type: ignore[attr-defined]

    @classmethod
    def _registry(cls) -> dict[str, type]:
        return MapDataPipe._functional_names


class RandomOp:
    """Mixin for ops that draw random numbers. :func:`conveyor.graph.apply_random_seed`
    gives each one its :class:`~conveyor.random.PipeRandomness` per epoch; an op iterated
    outside a loader draws a fresh random key once.
    """

    _randomness: PipeRandomness | None = None

    def set_randomness(self, randomness: PipeRandomness) -> None:
        self._randomness = randomness

    def randomness(self) -> PipeRandomness:
        if self._randomness is None:
            self._randomness = fresh_randomness(keyed_by_position=False)
        return self._randomness


class ShardingPoint:
    """Marker for the node where items are split between ranks and workers."""

    def apply_sharding(self, num_shards: int, shard_index: int, priority: Any) -> None:
        raise NotImplementedError


class IndexedStream:
    """An iterable pipe whose items can be read by position without the ones before
    (random access read in index order): a sharding point right after it reads only its
    own shard's items, instead of loading every item to drop most of them.

    A pass driven this way starts with :meth:`start_indexed_pass`, reads with
    :meth:`read_at` in increasing positions and ends with :meth:`end_indexed_pass`; the
    pipe's state then is what iterating it up to the same item would have left.
    """

    def start_indexed_pass(self) -> int:
        """Begin a pass (taking any staged state); the position it starts from."""
        raise NotImplementedError

    def read_at(self, position: int) -> Any:
        """Item ``position``, recorded as the last one read."""
        raise NotImplementedError

    def end_indexed_pass(self) -> None:
        """Record the pass as read to its end."""
        raise NotImplementedError


def close_iterator(iterator: Any) -> None:
    """Close a generator (running its ``finally`` blocks now); other iterators are left be."""
    close = getattr(iterator, "close", None)
    if close is not None:
        close()


def note_error(err: BaseException, pipe: DataPipe) -> None:
    """Add a note naming the pipe whose user function raised ``err`` (once)."""
    if not getattr(err, "_conveyor_noted", False):
        err.add_note(f"[conveyor] raised by the function of {pipe!r}")
        err._conveyor_noted = True  # type: ignore[attr-defined]


def check_int(name: str, value: Any, minimum: int = 0, allow_none: bool = False) -> None:
    """Reject anything but an int >= ``minimum`` (bools too), naming the argument."""
    if allow_none and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = "a positive int" if minimum == 1 else f"an int >= {minimum}"
        raise ValueError(f"{name} must be {kind}{' or None' if allow_none else ''}, got {value!r}")
