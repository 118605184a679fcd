"""Samplers that keep their position, under torchdata's names (``RandomSampler``,
``SequentialSampler``, ``BatchSampler``, ``StatefulDistributedSampler``); they need torch.

The public face of :mod:`conveyor.torch_compat.samplers`.
"""

from conveyor.torch_compat.samplers import BatchSampler, RandomSampler, SequentialSampler, StatefulDistributedSampler

__all__ = ["BatchSampler", "RandomSampler", "SequentialSampler", "StatefulDistributedSampler"]
