"""The core every other layer builds on: the pipe contract (``base``, ``passes``, the op
roles and the op index), the sharding points and the graph tools, randomness, states and
their checks, and the bridge to torch datapipes (see docs/DESIGN.md, "Layer: core").

Internal: nothing here is public API; the public names are re-exported by ``conveyor``,
``conveyor.pipes``, ``conveyor.graph``, ``conveyor.random``, ``conveyor.samplers``,
``conveyor.reading_service`` and ``conveyor.errors``.
"""
