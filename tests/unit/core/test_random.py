"""Seeds: counter-based derivation, shared vs local streams, the keyed permutation."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from conveyor.core.permutation import KeyedPermutation
from conveyor.random import SeedGenerator


def test_shared_seeds_ignore_the_path_local_seeds_do_not():
    root = SeedGenerator(42, epoch=1)
    rank0_worker1 = root.spawn(0).spawn(1)
    rank1_worker0 = root.spawn(1).spawn(0)
    assert rank0_worker1.generate_shared_seed() == root.generate_shared_seed()
    assert rank0_worker1.generate_seed() != rank1_worker0.generate_seed()
    assert rank0_worker1.path == (0, 1)


def test_epochs_and_bases_change_every_stream():
    a = SeedGenerator(1)
    assert a.for_epoch(0).generate_shared_seed() != a.for_epoch(1).generate_shared_seed()
    assert SeedGenerator(1).generate_shared_seed() != SeedGenerator(2).generate_shared_seed()
    assert SeedGenerator(1, epoch=5).generate_seed() == SeedGenerator(1, epoch=5).generate_seed()


def test_seed_restarts_the_schedule():
    seeds = SeedGenerator(3, epoch=9)
    seeds.seed(4)
    assert seeds.base_seed == 4 and seeds.epoch == 0
    with pytest.raises(TypeError):
        seeds.seed("4")
    with pytest.raises(ValueError):
        seeds.seed(-1)


def test_pipe_randomness_is_counter_based():
    randomness = SeedGenerator(5).pipe_randomness(ordinal=2, keyed_by_position=True)
    first = randomness.generator(17).integers(1 << 62, size=4)
    again = randomness.generator(17).integers(1 << 62, size=4)
    other = randomness.generator(18).integers(1 << 62, size=4)
    deep = randomness.generator(17, 0, 3).integers(1 << 62, size=4)
    assert (first == again).all() and not (first == other).any() and not (first == deep).any()
    other_op = SeedGenerator(5).pipe_randomness(ordinal=3, keyed_by_position=True)
    assert not (other_op.generator(17).integers(1 << 62, size=4) == first).any()


def test_unseeded_generators_differ():
    assert SeedGenerator().base_seed != SeedGenerator().base_seed


@pytest.mark.parametrize("n", [0, 1, 2, 3, 7, 64, 1000, 4097])
def test_keyed_permutation_is_a_bijection(n):
    perm = KeyedPermutation(n, key=123)
    values = [perm[i] for i in range(n)]
    assert sorted(values) == list(range(n))
    if n >= 64:
        assert values != list(range(n))
        assert values != [KeyedPermutation(n, key=124)[i] for i in range(n)]
    with pytest.raises(IndexError):
        perm[n]


def test_keyed_permutation_looks_uniform():
    # Where position 0 lands, over many keys, should cover the range evenly.
    n, keys = 8, 4000
    counts = np.bincount([KeyedPermutation(n, key=k)[0] for k in range(keys)], minlength=n)
    assert counts.min() > keys / n * 0.8 and counts.max() < keys / n * 1.2


def test_numpy_random_is_loaded_with_conveyor_so_forked_workers_inherit_it():
    # Each worker seeds through numpy.random at its first epoch: loaded only there, every
    # worker would import it itself (about 10 ms of CPU per worker, measured).
    code = "import sys, conveyor; print('numpy.random' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "True"


def test_each_seed_drawn_is_new_and_the_draws_repeat_per_epoch():
    """As torchdata's SeedGenerator: every call hands out the next seed of its stream."""
    seeds = SeedGenerator(11)
    shared = [seeds.generate_shared_seed() for _ in range(3)]
    local = [seeds.generate_seed() for _ in range(3)]
    assert len(set(shared)) == 3 and len(set(local)) == 3
    assert shared[0] == int(seeds.shared_sequence().generate_state(1, np.uint64)[0])
    again = SeedGenerator(11)
    assert [again.generate_shared_seed() for _ in range(3)] == shared
    assert [again.generate_seed() for _ in range(3)] == local
    worker = again.for_epoch(0).spawn(1)
    assert worker.generate_shared_seed() == shared[0], "shared draws agree on every worker"
    assert worker.generate_seed() not in local, "local draws differ per worker"
    assert again.for_epoch(1).generate_shared_seed() not in shared, "a new epoch, new seeds"
