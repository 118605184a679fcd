"""``conveyor.DataLoader``: torch's ``DataLoader`` on conveyor's engine, with its arguments,
its state, torch's worker conventions and the samplers that keep their position (see
docs/DESIGN.md, "Layer: torch_compat").

Internal: import ``DataLoader`` from ``conveyor`` and the samplers from ``conveyor.samplers``.
"""
