"""Counter-based seeds: every random number conveyor draws is a pure function of a key
(a loader's seed, the epoch, the op, an item's position), so a run is reproducible from
``(seed, epoch, config)``.

The public face of :mod:`conveyor.core.random`.
"""

from conveyor.core.random import PipeRandomness, SeedGenerator, draw_seed, global_rng_digest, seed_global_rngs

__all__ = ["PipeRandomness", "SeedGenerator", "draw_seed", "global_rng_digest", "seed_global_rngs"]
