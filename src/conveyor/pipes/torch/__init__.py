"""Pipes over torch's objects: ``from_torch`` sources (datasets, ``IterableDataset``s and
datapipe graphs), ``pin_memory``, and the sampler source and fetcher of ``conveyor.DataLoader``.

Internal: import the ops from ``conveyor.pipes``.
"""
