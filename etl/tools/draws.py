"""The building blocks of the synthetic data generators (``etl.tools.synth``, ``etl.tools.events``): counter-based
random draws, a Zipf law on ranks, a bijective scatter of numbers into a key space, and keys written in a column's
encoding.

Counter-based: draw ``i`` of a stream is a pure function of the stream's key and ``i`` (splitmix64 of the key plus
``(i+1)`` times the golden ratio), so values can be made in any order, on any number of threads, with the same bytes.
The numba functions are ``inline="always"``, for use inside other numba kernels.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np
import pyarrow as pa

from etl.backends.cpu import encode_hex
from etl.schema import ColumnSpec

__all__ = ["stream_key", "key_bits", "key_space", "mix", "substream", "unif", "normal", "zipf_rank", "pareto_consts",
           "permute", "validity_bitmap", "encode_keys"]

_M64 = (1 << 64) - 1
_U = np.uint64
_GOLDEN = _U(0x9E3779B97F4A7C15)
_MUL1 = _U(0xBF58476D1CE4E5B9)
_MUL2 = _U(0x94D049BB133111EB)
_INT_BITS = 31


def _mix64(x: int) -> int:
    """splitmix64 finaliser on Python ints (same function as the numba ``mix``)."""
    x &= _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def stream_key(*parts: int) -> int:
    """A 64-bit key mixed from ``parts`` (a seed, a column index, a file...): the key of one stream of draws."""
    h = 0x243F6A8885A308D3
    for p in parts:
        h = _mix64(h ^ (p & _M64)) + 0x9E3779B97F4A7C15
    return _mix64(h)


def key_bits(c: ColumnSpec, cardinality: int) -> int:
    """Bits of the keys of column ``c`` (its key space is ``2**bits``) holding ``cardinality`` keys."""
    if c.encoding == "hex":
        return 4 * (c.width or 8)
    if c.encoding == "int":
        return _INT_BITS
    return max(20, (cardinality - 1).bit_length())  # string words


def key_space(c: ColumnSpec) -> int:
    """The most distinct keys column ``c``'s encoding can write: ``16**width`` (hex), ``2**31`` (int), ``2**28`` (words)."""
    return 1 << (4 * (c.width or 8) if c.encoding == "hex" else _INT_BITS if c.encoding == "int" else 28)


@nb.njit(inline="always")
def mix(z):
    """splitmix64 finaliser of a uint64: a bijection that scatters bits."""
    z = (z ^ (z >> _U(30))) * _MUL1
    z = (z ^ (z >> _U(27))) * _MUL2
    return z ^ (z >> _U(31))


@nb.njit(inline="always")
def substream(key, i):
    """Draw i of stream ``key`` as 64 random bits; also the key of sub-stream i (a user's, a session's...)."""
    return mix(key + (_U(i) + _U(1)) * _GOLDEN)


@nb.njit(inline="always")
def unif(key, i):
    """Uniform in (0, 1) for counter i of stream ``key``."""
    r = substream(key, i)
    return (np.float64(r >> _U(11)) + 0.5) * (1.0 / 9007199254740992.0)


@nb.njit(inline="always")
def normal(key, i):
    """Standard normal for counter i of stream ``key`` (Box-Muller of its uniforms 2i and 2i+1)."""
    u1 = unif(key, 2 * i)
    u2 = unif(key, 2 * i + 1)
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(6.283185307179586 * u2)


@nb.njit(inline="always")
def zipf_rank(u, k, beta, c, inv):
    """Rank in [0, k) from a uniform u: uniform share ``beta``, else the floor of a Pareto, density ∝ (x+1)^-s on
    [0, k), by inversion: x = (1 - v·c)^(1/(1-s)) - 1 with c = 1 - (k+1)^(1-s), inv = 1/(1-s)."""
    if u < beta:
        r = np.int64(u / beta * k)
    else:
        v = (u - beta) / (1.0 - beta)
        r = np.int64((1.0 - v * c) ** inv - 1.0)
    if r >= k:
        r = k - 1
    if r < 0:
        r = 0
    return r


@nb.njit(inline="always")
def pareto_consts(k, s):
    """The constants (c, inv) of ``zipf_rank`` for ``k`` ranks and exponent ``s`` (not 1)."""
    return 1.0 - (k + 1.0) ** (1.0 - s), 1.0 / (1.0 - s)


@nb.njit(inline="always")
def permute(x, salt, bits):
    """A bijection of [0, 2**bits): xor salt, then three rounds of odd multiply and xorshift, all mod 2**bits."""
    mask = _U(0xFFFFFFFFFFFFFFFF) if bits == 64 else (_U(1) << _U(bits)) - _U(1)
    sh = _U(max(1, bits // 2))
    x = (_U(x) ^ salt) & mask
    x = (x * _GOLDEN) & mask
    x ^= x >> sh
    x = (x * _MUL1) & mask
    x ^= x >> sh
    x = (x * _MUL2) & mask
    x ^= x >> sh
    return x


@nb.njit(nogil=True, cache=True)
def _word_lengths(keys, valid, offsets):
    """Offsets of bijective base-26 words of key+1 ('a', ..., 'z', 'aa', ...); nulls take no bytes."""
    pos = 0
    offsets[0] = 0
    for i in range(keys.shape[0]):
        if valid[i]:
            x = keys[i] + _U(1)
            while x > _U(0):
                x = (x - _U(1)) // _U(26)
                pos += 1
        offsets[i + 1] = pos
    return pos


@nb.njit(nogil=True, cache=True)
def _word_fill(keys, valid, offsets, data):
    for i in range(keys.shape[0]):
        if valid[i]:
            x = keys[i] + _U(1)
            p = offsets[i + 1]
            while x > _U(0):
                x -= _U(1)
                p -= 1
                data[p] = 97 + np.int64(x % _U(26))
                x //= _U(26)


def validity_bitmap(valid: np.ndarray, nvalid: int) -> pa.Buffer | None:
    """Arrow's validity bitmap of the 0/1 array ``valid`` (None when all ``nvalid`` rows are valid)."""
    if nvalid == valid.shape[0]:
        return None
    return pa.py_buffer(np.packbits(valid, bitorder="little"))


def encode_keys(keys: np.ndarray, valid: np.ndarray, nvalid: int, c: ColumnSpec) -> pa.Array:
    """Keys → Arrow array of the column's raw type (hex/word strings or int64)."""
    n = keys.shape[0]
    if c.encoding == "int":
        return pa.Array.from_buffers(pa.int64(), n, [validity_bitmap(valid, nvalid), pa.py_buffer(keys.view(np.int64))],
                                     null_count=n - nvalid)
    if c.encoding == "hex":
        offsets, data = encode_hex(keys, valid, c.width or 8)
    else:
        offsets = np.empty(n + 1, np.int32)
        data = np.empty(_word_lengths(keys, valid, offsets), np.uint8)
        _word_fill(keys, valid, offsets, data)
    return pa.Array.from_buffers(pa.string(), n, [validity_bitmap(valid, nvalid), pa.py_buffer(offsets), pa.py_buffer(data)],
                                 null_count=n - nvalid)
