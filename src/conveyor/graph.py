"""Graph tools: walk, find, replace and remove pipes; apply sharding and seeds; draw a
graph (``to_dot``, ``to_mermaid``); name it (``fingerprint``, ``describe``). torchdata's
``graph_settings`` and ``graph`` names.

The public face of :mod:`conveyor.core.graph`.
"""

from conveyor.core.graph import (
    Graph,
    GraphOrPipe,
    apply_random_seed,
    apply_sharding,
    describe,
    find_dps,
    fingerprint,
    list_dps,
    remove_dp,
    replace_dp,
    set_datapipes_seed,
    set_graph_random_seed,
    to_dot,
    to_mermaid,
    traverse,
    traverse_dps,
)
from conveyor.core.op_roles import SHARDING_PRIORITIES

__all__ = [
    "SHARDING_PRIORITIES",
    "Graph",
    "GraphOrPipe",
    "apply_random_seed",
    "apply_sharding",
    "describe",
    "find_dps",
    "fingerprint",
    "list_dps",
    "remove_dp",
    "replace_dp",
    "set_datapipes_seed",
    "set_graph_random_seed",
    "to_dot",
    "to_mermaid",
    "traverse",
    "traverse_dps",
]
