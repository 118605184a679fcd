"""A keyed permutation of ``range(n)`` in O(1) memory: shuffle without a list.

A balanced Feistel network over the smallest even number of bits that covers ``n`` is a
bijection on ``[0, 2**bits)``; "cycle walking" (re-encrypting values ``>= n``) restricts it
to ``[0, n)``. The domain is at most ``4 n``, so a lookup takes a few rounds on average.
"""

from __future__ import annotations

import numpy as np

_MASK64 = (1 << 64) - 1


def _mix(value: int) -> int:
    value = (value ^ (value >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    value = (value ^ (value >> 27)) * 0x94D049BB133111EB & _MASK64
    return value ^ (value >> 31)


class KeyedPermutation:
    """``perm[i]`` is where position ``i`` of a shuffled ``range(n)`` comes from."""

    def __init__(self, n: int, key: int, rounds: int = 6):
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        self.n = n
        bits = max(2, (max(n, 1) - 1).bit_length())
        bits += bits % 2
        self._half = bits // 2
        self._mask = (1 << self._half) - 1
        seq = np.random.SeedSequence(key & _MASK64)
        self._round_keys = [int(k) for k in seq.generate_state(rounds, np.uint64)]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        if not 0 <= index < self.n:
            raise IndexError(f"index {index} out of range for a permutation of {self.n}")
        value = index
        while True:
            value = self._encrypt(value)
            if value < self.n:
                return value

    def _encrypt(self, value: int) -> int:
        half, mask = self._half, self._mask
        left, right = value >> half, value & mask
        for round_key in self._round_keys:
            left, right = right, left ^ (_mix(right ^ round_key) & mask)
        return (left << half) | right
