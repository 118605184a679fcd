"""Observing a running loader: per-stage statistics, the sampled pull profiler, the
opt-in stack sampler and the run delay of a thread (see docs/DESIGN.md,
"Layer: observe").

Internal: nothing here is public API (``DataLoader2.stats()`` is).
"""
