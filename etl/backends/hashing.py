"""The project's hash and range reduction, defined once (every backend must reproduce these bits).

All arithmetic is on unsigned 64-bit words, modulo 2**64.

- ``fmix64(k)``: MurmurHash3's 64-bit finaliser::

      k ^= k >> 33; k *= 0xFF51AFD7ED558CCD; k ^= k >> 33; k *= 0xC4CEB9FE1A85EC53; k ^= k >> 33

  It is a bijection on 64-bit words.
- ``seed_word(seed) = fmix64((seed + 1) * 0x9E3779B97F4A7C15)`` for an integer seed >= 0.
- ``hash64(key, seed) = fmix64(key XOR seed_word(seed))``.
- ``reduce(h, n) = ((h >> 32) * n) >> 32`` maps a hash to ``[0, n)`` for ``1 <= n <= 2**31`` (multiply-shift on
  the high 32 bits; the product stays below 2**63, so signed 64-bit backends compute it exactly).
- ``string_key(bytes) = fmix64(FNV-1a-64(bytes))``: FNV-1a with offset basis 0xCBF29CE484222325 and prime
  0x100000001B3 over the UTF-8 bytes, then the finaliser.
- ``cross_key(k1, ..., km, seed) = hash64(... hash64(hash64(k1, seed) XOR k2, seed) ... XOR km, seed)``.

This module is plain Python so that tests can state the reference values; backends implement the same formulas
vectorised. ``hash64_array`` is ``hash64`` over a numpy array, for host-side bookkeeping (count-table partitions)
and reference scripts.
"""

from __future__ import annotations

import numpy as np

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
C1 = 0xFF51AFD7ED558CCD
C2 = 0xC4CEB9FE1A85EC53
FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
MAX_BUCKETS = 1 << 31


def fmix64(k: int) -> int:
    k &= MASK64
    k ^= k >> 33
    k = (k * C1) & MASK64
    k ^= k >> 33
    k = (k * C2) & MASK64
    k ^= k >> 33
    return k


def seed_word(seed: int) -> int:
    check_seed(seed)
    return fmix64(((seed + 1) * GOLDEN) & MASK64)


def hash64(key: int, seed: int) -> int:
    return fmix64((key & MASK64) ^ seed_word(seed))


def hash64_array(keys: np.ndarray, seed: int) -> np.ndarray:
    """``hash64(key, seed)`` of every key of an integer array, as a new uint64 array (wrapping arithmetic)."""
    k = keys.astype(np.uint64) ^ np.uint64(seed_word(seed))
    s33 = np.uint64(33)
    k ^= k >> s33
    k *= np.uint64(C1)
    k ^= k >> s33
    k *= np.uint64(C2)
    k ^= k >> s33
    return k


def reduce(h: int, n: int) -> int:
    check_buckets(n)
    return ((h >> 32) * n) >> 32


def string_key(b: bytes) -> int:
    h = FNV_OFFSET
    for byte in b:
        h = ((h ^ byte) * FNV_PRIME) & MASK64
    return fmix64(h)


def cross_key(keys: list[int], seed: int) -> int:
    h = hash64(keys[0], seed)
    for k in keys[1:]:
        h = hash64(h ^ (k & MASK64), seed)
    return h


def check_seed(seed: int) -> None:
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")


def check_buckets(n: int) -> None:
    if not isinstance(n, int) or not 1 <= n <= MAX_BUCKETS:
        raise ValueError(f"number of buckets must be an integer in [1, 2**31], got {n!r}")
