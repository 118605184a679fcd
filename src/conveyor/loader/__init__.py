"""``DataLoader2``: the loader, how it takes the user's graph (``intake``), its epochs
(``epoch``, ``epoch_iterator``) and its checkpoints (``checkpoint``, ``state``)
(see docs/DESIGN.md, "Layer: loader").

Internal: import ``DataLoader2`` and ``Adapter`` from ``conveyor``.
"""
