"""The pipe contract: a pipe is a description, a pass over it is an object of its own.

A pipe (:class:`IterDataPipe`, or a random-access :class:`MapDataPipe`) holds its
arguments and its inputs, in public attributes, so graph tools walk a graph by looking
at attributes, never by pickling it. It does not change while items flow: each
iteration opens a :class:`~conveyor.core.passes.Pass` that owns the positions,
counters and buffers (see :mod:`conveyor.core.passes`). Each op is a small class that
registers itself under a functional name (``pipe.map(fn)`` builds ``Mapper(pipe, fn)``)
and names its pass class in :attr:`IterDataPipe.pass_type`.

State contract. A pass's state is plain JSON data nested like the graph: an op's own
fields (declared in :attr:`IterDataPipe.state_fields`) plus its inputs' states under
``"source"`` (one input) or ``"sources"`` (several). :meth:`IterDataPipe.check_state`
validates a whole state against the graph, following the graph (never a name written in
the state), and :meth:`IterDataPipe.open` starts a pass from one.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar, Generic, Self, TypeVar

from conveyor.core.functional import document_op_class, make_method
from conveyor.core.op_index import install_stubs, load_owner
from conveyor.core.passes import BINDINGS, Pass, PassContext, PassType, Position, State, foreign_view
from conveyor.core.pickling import picklable_attributes, restored_attributes
from conveyor.core.torch_support import (
    is_torch_datapipe,
    is_torch_iter_datapipe,
    register_iterable_dataset,
    register_pending,
    torch_pickling_hook,
)
from conveyor.core.user_iter_pass import UserIterPass
from conveyor.core.validation import check_plain_data, require_keys, require_non_negative
from conveyor.errors import StateError

#: An op class or function being registered under a functional name.
F = TypeVar("F", bound=Callable[..., Any])
#: What a pipe yields: ``IterDataPipe[int]``, ``MapDataPipe[str]`` in annotations and bases.
T_co = TypeVar("T_co", covariant=True)

__all__ = ["DataPipe", "IterDataPipe", "MapDataPipe", "Pass", "PassContext", "Position", "State"]


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

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        register_pending()  # torch imported after conveyor: pipes become IterableDatasets now
        return super().__new__(cls)

    #: Attribute names that define what the node does; shown by ``repr`` and hashed into
    #: the graph fingerprint.
    _params: ClassVar[tuple[str, ...]] = ()
    #: Attributes that belong to a run, not to the description: never copied or pickled.
    _runtime: ClassVar[frozenset[str]] = frozenset({"_latest_pass", "_staged_state"})

    def inputs(self) -> list[DataPipe]:
        """The pipes this node reads from, in a stable order (public attributes only; a
        torch datapipe among them too, see :mod:`conveyor.core.foreign`)."""
        found: list[DataPipe] = []
        for name, value in vars(self).items():
            if name.startswith("_"):
                continue
            if isinstance(value, DataPipe) or is_torch_datapipe(value):
                found.append(value)
            elif isinstance(value, (list, tuple)):
                found.extend(v for v in value if isinstance(v, DataPipe) or is_torch_datapipe(v))
        return found

    def __repr__(self) -> str:
        args = ", ".join(f"{name}={describe_value(getattr(self, name, None))}" for name in self._params)
        return f"{type(self).__name__}({args})"

    def __len__(self) -> int:
        raise self._no_length("its length is not known in advance")

    def _no_length(self, why: str) -> TypeError:
        return TypeError(f"{self!r} has no length: {why}. Use .set_length(n) if you know it.")

    #: The torch datapipe class this kind of pipe stands for (see :meth:`__reduce_ex__`).
    _torch_kind: ClassVar[str] = "IterDataPipe"

    def __getstate__(self) -> dict[str, Any]:
        """Plain ``pickle`` and ``copy`` work on a graph whose ops hold lambdas or local
        functions (see :mod:`conveyor.core.pickling`); what belongs to a run stays behind."""
        hook = torch_pickling_hook(self._torch_kind, "getstate_hook")
        if hook is not None:  # torch's traversal: it keeps only what may hold pipes
            return hook(dict(self.__dict__))
        return picklable_attributes(self.__dict__, self._runtime)

    def __reduce_ex__(self, protocol: Any) -> Any:
        """As torch's datapipes: while torch's graph traversal pickles a graph, its hook
        records this pipe as an input and stands in for it."""
        hook = torch_pickling_hook(self._torch_kind, "reduce_ex_hook")
        if hook is not None:
            try:
                return hook(self)
            except NotImplementedError:  # the node being scanned itself, or one seen already
                pass
        return self._reduce(protocol)

    def _reduce(self, protocol: Any) -> Any:
        return super().__reduce_ex__(protocol)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(restored_attributes(state))

    # --- functional registration -------------------------------------------------------

    @classmethod
    def register_functional(
        cls, name: str, aliases: Mapping[str, str] | None = None, *, builds: type | None = None
    ) -> Callable[[F], F]:
        """Decorator: make ``pipe.<name>(*args, **kw)`` build ``op(pipe, *args, **kw)``,
        for ``op`` an op class (as torchdata's ``functional_datapipe``) or a function.

        The method takes the op's parameters after its input, as ``inspect.signature``
        and ``help()`` show (see :mod:`conveyor.core.functional`). ``aliases`` maps
        other keyword names to the op's own: ``batch(n=4)`` (this project's spelling) and
        ``batch(batch_size=4)`` (torchdata's) are the same call. ``builds``: the op class
        a function makes, for graph tools that name a node by its functional call.
        """

        def decorate(op: F) -> F:
            load_owner(cls, name)  # conveyor's op of that name, if not loaded yet, meets this one
            registry = cls._registry()
            entry = builds or op
            if name in registry and registry[name] is not entry:
                raise ValueError(f"functional name {name!r} is already taken by {registry[name]}")
            registry[name] = entry
            setattr(cls, name, make_method(cls, name, op, aliases or {}))
            if isinstance(builds, type) and builds is not op:
                document_op_class(builds, cls, name, op)
            return op

        return decorate

    @classmethod
    def _registry(cls) -> dict[str, Callable[..., Any]]:
        raise NotImplementedError(f"{cls.__name__} is neither an IterDataPipe nor a MapDataPipe")


class IterDataPipe(DataPipe, Generic[T_co]):
    """A lazy, re-iterable stream of items. Each ``iter()`` opens a new pass.

    An op sets :attr:`pass_type` (its :class:`~conveyor.core.passes.Pass` class, built as
    ``pass_type(pipe, state, context)``) and :attr:`state_fields`. A subclass that
    implements ``__iter__`` itself (as torchdata's pipes do) works too: its inputs' passes
    are opened for it and its state is theirs (:class:`~conveyor.core.user_iter_pass.UserIterPass`).
    """

    #: Functional name -> what builds the op (its class, or a function): one table for
    #: IterDataPipe and its subclasses.
    _functional_names: ClassVar[dict[str, Callable[..., Any]]] = {}

    #: True for ops that treat each item on its own (map, filter, flatmap, ...): after the
    #: sharding point their output does not depend on how items are split among workers.
    per_item: bool = False
    #: True for ops whose output keeps the order of positions at the sharding point (every
    #: per-item op, and batch, header, enumerate). The multiprocessing merge follows
    #: positions only when every op after the sharding point keeps their order.
    keeps_order: ClassVar[bool] = False
    #: False for ops that must run once, in the main process (pin memory, fullsync).
    replicable: ClassVar[bool] = True
    #: For a pipe that implements ``__iter__`` itself and has no input (a user's source):
    #: whether a fresh ``__iter__`` yields the same items again, so that a mid-epoch state
    #: resumes by replaying it past the items it had yielded. Set it False for a stream that
    #: does not repeat (a network feed): its mid-epoch states are then refused at resume.
    replayable: ClassVar[bool] = True
    #: True for ops that make several items of one input item (their positions get a
    #: sub-index): the merge then cannot know a worker moved past a position until it says so.
    adds_sub_positions: ClassVar[bool] = False
    #: True for ops whose state may hold their input's state from *before* their last item
    #: (a shuffle window's start, an item being expanded), which a resume replays from.
    replays_input: ClassVar[bool] = False
    #: True for ops whose passes run threads (``prefetch``, ``threadpool_map``): in the main
    #: process under worker processes, every worker is started before such a pass opens
    #: (no worker is forked while a thread of ours runs).
    runs_threads: ClassVar[bool] = False
    #: The class of this op's passes.
    pass_type: ClassVar[PassType | None] = None
    #: The keys of a pass's state and their JSON types; ``"source"``/``"sources"`` hold the
    #: inputs' states. An ``int`` field is a counter: checked to be in ``[0, 2**63)``.
    state_fields: ClassVar[Mapping[str, Any]] = {}

    def __iter__(self) -> Iterator[T_co]:
        bound = BINDINGS.take(self)
        if bound is not None:  # a user-defined pipe reading its input inside a pass
            return bound.items
        if self.pass_type is not None and type(self).__iter__ is not IterDataPipe.__iter__:
            # A subclass's own __iter__ extends the op's (super().__iter__()): the op's own
            # pass, over the inputs bound for the subclass's pass.
            return self.pass_type(self, None, BINDINGS.context_for(self)).items
        opened = self.open(self.__dict__.pop("_staged_state", None))
        self._latest_pass = opened
        return opened.items

    def open(self, state: State | None = None, context: PassContext | None = None) -> Pass:
        """A new pass over this pipe, from ``state`` (validated first; None: the start)."""
        if state is not None:
            check_plain_data(state, f"state of {self!r}")
            self.check_state(state)
        return (context or PassContext()).open(self, state)

    def _open(self, state: State | None, context: PassContext) -> Pass:
        """Build this op's pass; ``state`` is valid (see :meth:`check_state`)."""
        pass_type = self.pass_type
        if pass_type is None or self._iterates_itself():
            return UserIterPass(self, state, context)
        return pass_type(self, state, context)

    def is_replicable(self) -> bool:
        """torchdata's protocol: ``False`` keeps this op, and everything after it, in the
        main process (:attr:`replicable` by default; a subclass may override either)."""
        return self.replicable

    def _iterates_itself(self) -> bool:
        return self.pass_type is None or type(self).__iter__ is not IterDataPipe.__iter__

    def __len__(self) -> int:
        raise self._no_length("its length is not known in advance")

    @classmethod
    def _registry(cls) -> dict[str, Callable[..., Any]]:
        return IterDataPipe._functional_names

    # --- state --------------------------------------------------------------------------

    def fields(self) -> Mapping[str, Any]:
        """The keys of this op's pass state and their JSON types."""
        return {"inputs": list, "yielded": int} if self._iterates_itself() else self.state_fields

    def check_state(self, state: Any, where: str = "") -> None:
        """Raise :class:`StateError` unless ``state`` is a valid state of a pass over this
        pipe, inputs included. Changes nothing; runs no code from the state."""
        where = where or repr(self)
        fields = self.fields()
        require_keys(state, fields, where)
        for key in ("sources", "inputs"):
            if key in fields and len(state[key]) != len(self._state_inputs(key)):
                raise StateError(f"{where}: {key!r} must hold {len(self._state_inputs(key))} states")
        for key, kind in fields.items():
            if kind is int:
                require_non_negative(state, key, where)
        self.check_own_state(state, where)
        for child, child_state, key in self.substates(state):
            child = _as_pipe(child)
            child.check_state(child_state, _inner(where, key, child))

    def check_own_state(self, state: Mapping[str, Any], where: str) -> None:
        """Checks of this op's own fields beyond their types (ranges, consistency)."""

    def holds_live_input(self, state: Mapping[str, Any]) -> bool:
        """Whether ``state`` (a valid one) holds its input's live state, not one from an
        earlier point: always unless the op :attr:`replays_input`, whose states may say
        when they do."""
        return not self.replays_input

    def substates(self, state: Mapping[str, Any]) -> list[tuple[IterDataPipe, Any, str]]:
        """``(input pipe, its state, key)`` for each input state held in ``state`` (a valid
        one), following the graph: how state walks find every node's part."""
        found: list[tuple[IterDataPipe, Any, str]] = []
        fields = self.fields()
        if "source" in fields and state["source"] is not None:
            found.append((self.source, state["source"], "source"))  # type: ignore[attr-defined]
        for key in ("sources", "inputs"):
            if key in fields:
                pipes = self._state_inputs(key)
                found.extend(
                    (pipe, inner, f"{key}[{i}]")
                    for i, (pipe, inner) in enumerate(zip(pipes, state[key], strict=True))
                    if inner is not None
                )
        return found

    def _state_inputs(self, key: str) -> list[Any]:  # conveyor's iterable pipes, and torch's
        pipes = self.sources if key == "sources" else self.inputs()  # type: ignore[attr-defined]
        return [pipe for pipe in pipes if isinstance(pipe, IterDataPipe) or is_torch_iter_datapipe(pipe)]

    def state_dict(self) -> State:
        """The state of the last pass ``iter()`` opened on this pipe (a staged state until
        the next ``iter()``; the start's before any). A convenience for one pipe used on
        its own: a loader keeps its passes itself."""
        staged = self.__dict__.get("_staged_state")
        if staged is not None:
            return copy.deepcopy(staged)
        latest = self.__dict__.get("_latest_pass")
        if latest is not None:
            return latest.state()
        fresh = self.open()
        try:
            return fresh.state()
        finally:
            fresh.close()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Validate ``state`` and stage it: the next ``iter()`` resumes from it."""
        check_plain_data(state, f"state of {self!r}")
        self.check_state(state)
        self._staged_state = copy.deepcopy(dict(state))


def _as_pipe(node: Any) -> Any:
    """A torch datapipe among the inputs, seen through conveyor's pipe API."""
    if isinstance(node, DataPipe):
        return node
    return foreign_view(node)  # conveyor.core.foreign's, which builds on this module


def _inner(where: str, key: str, child: DataPipe) -> str:
    """Where an input's state sits: the path of keys, then the pipe (kept short)."""
    path = where.rsplit(" (", 1)[0] if where.endswith(")") and " (" in where else where
    text = f"{path}.{key} ({type(child).__name__})"
    return text if len(text) <= 240 else f"...{text[-237:]}"


# With torch, a pipe is a torch IterDataPipe (so an IterableDataset) too: torch's DataLoader
# reads it (each worker keeps its share at sharding_filter()), and torch's graph tools walk it.
register_iterable_dataset(IterDataPipe)


class MapDataPipe(DataPipe, Generic[T_co]):
    """A random-access collection of items: ``__getitem__`` and ``__len__``."""

    _functional_names: ClassVar[dict[str, Callable[..., Any]]] = {}
    _torch_kind = "MapDataPipe"

    def __getitem__(self, index: int) -> T_co:
        raise NotImplementedError(f"{type(self).__name__} must implement __getitem__")

    def __len__(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} must implement __len__")

    def __iter__(self) -> Iterator[T_co]:
        read = self.reader()
        for index in range(len(self)):
            yield read(index)

    def reader(self) -> Callable[[int], T_co]:
        """A function reading items by index under the randomness set now: a pass keeps
        it, so a later epoch's seeds do not reach a pass still running."""
        return self.__getitem__

    def state_dict(self) -> dict[str, Any]:
        """Random access has no position of its own (the pipe that iterates it keeps the
        index), so its state is always ``{}``."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Accept the empty state :meth:`state_dict` returns; anything else is a
        :class:`~conveyor.errors.StateError`."""
        if type(state) is not dict:
            raise StateError(f"state of {self!r} must be a dict, got {type(state).__name__}")
        if state:
            raise StateError(f"{self!r} holds no state, but was given {len(state)} keys")

    # to_iter_datapipe() is an op of conveyor.pipes.map_pipes (MapToIterConverter), which
    # builds on this module: installed as a functional name below, as map, batch, shuffle.

    @classmethod
    def _registry(cls) -> dict[str, Callable[..., Any]]:
        return MapDataPipe._functional_names


register_iterable_dataset(MapDataPipe, "MapDataPipe")
install_stubs(IterDataPipe)  # every functional name, its op's module imported at its first call
install_stubs(MapDataPipe)
