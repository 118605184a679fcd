"""torch datapipes inside a conveyor graph.

A user may put a ``torch.utils.data`` ``IterDataPipe`` of their own (an adaptor written
for torchdata) between conveyor pipes, as torchdata allowed. Graph tools see it as it is
(its inputs are its public attributes that hold pipes, as torch's traversal finds them).
Passes and state checks see it through a :class:`ForeignPipe`, which gives it conveyor's
pipe API: a pass over it is a :class:`~conveyor.core.user_iter_pass.UserIterPass` (its inputs'
passes are opened for it and handed to its own ``iter(self.datapipe)`` calls, its state is
theirs plus the items it yielded), exactly as for a conveyor pipe that implements
``__iter__`` itself.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

from conveyor.core.base import DataPipe, IterDataPipe
from conveyor.core.passes import install_foreign_view
from conveyor.core.torch_support import is_torch_datapipe, is_torch_iter_datapipe

_ADAPTERS: weakref.WeakKeyDictionary[Any, ForeignPipe] = weakref.WeakKeyDictionary()


def is_pipe(value: Any) -> bool:
    """A conveyor pipe, or a torch datapipe."""
    return isinstance(value, DataPipe) or is_torch_datapipe(value)


def inputs_of(node: Any) -> list[Any]:
    """The pipes ``node`` reads from: a conveyor pipe's :meth:`~DataPipe.inputs`, a torch
    datapipe's public attributes that hold pipes (directly or in a list or tuple)."""
    if isinstance(node, DataPipe):
        return node.inputs()
    found: list[Any] = []
    for name, value in vars(node).items():
        if name.startswith("_"):
            continue
        if is_pipe(value):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(v for v in value if is_pipe(v))
    return found


def is_iterable_pipe(value: Any) -> bool:
    """A conveyor ``IterDataPipe`` or a torch ``IterDataPipe``: something a pass can read."""
    return isinstance(value, IterDataPipe) or (not isinstance(value, DataPipe) and is_torch_iter_datapipe(value))


def as_pipe(node: Any) -> Any:
    """``node`` itself for a conveyor pipe; for a torch datapipe, its :class:`ForeignPipe`
    (one per node, for as long as the node lives)."""
    if isinstance(node, DataPipe) or not is_torch_iter_datapipe(node):
        return node
    adapter = _ADAPTERS.get(node)
    if adapter is None:
        adapter = _ADAPTERS[node] = ForeignPipe(node)
    return adapter


# Passes and state checks (below the pipes, so unable to import this module) see a torch
# datapipe through this view; conveyor.pipes imports this module, so it is set before any
# pass opens.
install_foreign_view(as_pipe)


class ForeignPipe(IterDataPipe):
    """Conveyor's view of a torch ``IterDataPipe`` in a conveyor graph (see the module)."""

    #: Its consumer iterates the torch node itself, not a pass bound for it.
    foreign = True

    def __init__(self, node: Any) -> None:
        self._node = node  # private: not an input of the adapter, its subject

    def inputs(self) -> list[Any]:
        return inputs_of(self._node)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._node)

    def __repr__(self) -> str:
        return f"{type(self._node).__name__} (a torch datapipe)"


def torch_sharding_points(nodes: list[Any]) -> list[Any]:
    """The torch datapipes among ``nodes`` that torch's ``apply_sharding`` would configure
    (its ``sharding_filter``, or any node with an ``apply_sharding`` method)."""
    foreign = [node for node in nodes if not isinstance(node, DataPipe)]
    if not foreign:
        return []
    from conveyor.core._torch_graph import is_sharding_pipe  # imports torch: only once a torch node is here

    return [node for node in foreign if is_sharding_pipe(node)]


def shard_torch_point(node: Any, num_shards: int, shard_index: int, priority: int) -> None:
    """Configure a torch sharding datapipe at conveyor's level ``priority``, as torch's
    ``apply_sharding`` does (its group of the same name; no group for an old signature)."""
    import inspect

    from conveyor.core._torch_graph import torch_priority  # imports torch: a torch node is here

    if len(inspect.signature(node.apply_sharding).parameters) < 3:
        node.apply_sharding(num_shards, shard_index)
    else:
        node.apply_sharding(num_shards, shard_index, sharding_group=torch_priority(priority))


def torch_random_nodes(nodes: list[Any]) -> list[Any]:
    """The torch datapipes among ``nodes`` that draw random numbers (torch's test: a
    ``set_seed`` method)."""
    import inspect

    return [
        node
        for node in nodes
        if not isinstance(node, DataPipe) and hasattr(node, "set_seed") and inspect.ismethod(node.set_seed)
    ]
