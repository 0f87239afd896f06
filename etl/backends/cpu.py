"""The CPU backend: numpy plus numba kernels over flat buffers (Arrow buffers viewed as numpy, no copies).

Every kernel releases the GIL (``nogil=True``), so worker threads transform row groups in parallel. The formulas
for hashing, range reduction and string keys are defined in ``etl.backends.hashing``; ids follow the reserved-id
convention of ``etl.ops.categorical`` (0 padding, 1 null, then the op's own ids).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from etl.backends.hashing import C1, C2, FNV_OFFSET, FNV_PRIME, check_buckets, seed_word
from etl.batch import Strings, gather_ranges, take_values

NULL_ID = 1
FIRST_ID = 2
_jit = nb.njit(nogil=True, cache=True)

_C1 = np.uint64(C1)
_C2 = np.uint64(C2)
_FNV_OFFSET = np.uint64(FNV_OFFSET)
_FNV_PRIME = np.uint64(FNV_PRIME)
_S33 = np.uint64(33)
_S32 = np.uint64(32)
_INT64_MIN_MAGNITUDE = np.uint64(1 << 63)


@_jit
def _fmix64(k):
    k ^= k >> _S33
    k *= _C1
    k ^= k >> _S33
    k *= _C2
    k ^= k >> _S33
    return k


@_jit
def _reduce(h, n):
    return np.int64((h >> _S32) * np.uint64(n) >> _S32)


# ---------------------------------------------------------------- dense


def fill_null(values: np.ndarray, valid: np.ndarray | None, value: float) -> np.ndarray:
    """float64 copy of ``values`` with missing entries replaced by ``value``."""
    out = values.astype(np.float64)
    if valid is not None:
        out[~valid] = value
    return out


def clamp(values: np.ndarray, lo: float | None, hi: float | None) -> np.ndarray:
    """float64 values limited to [lo, hi] (a bound of None is open)."""
    return np.clip(values.astype(np.float64, copy=False), lo, hi)


def log1p(values: np.ndarray) -> np.ndarray:
    """float64 ln(1 + x)."""
    return np.log1p(values.astype(np.float64, copy=False))


def normalize(values: np.ndarray, mean: float, std: float) -> np.ndarray:
    """float64 (x - mean) / std."""
    return (values.astype(np.float64, copy=False) - mean) / std


def moments(values: np.ndarray, valid: np.ndarray | None) -> tuple[int, float, float] | None:
    """(count, sum, sum of squared deviations from their mean) of the present values in float64, or None when
    no value is present."""
    v = values.astype(np.float64, copy=False)
    if valid is not None:
        v = v[valid]
    if not len(v):
        return None
    return len(v), float(v.sum()), float(((v - v.mean()) ** 2).sum())


def bucketize(values: np.ndarray, valid: np.ndarray | None, boundaries: np.ndarray, out_dtype) -> np.ndarray:
    """id = 2 + number of boundaries <= value (right-closed buckets); missing → 1."""
    ids = (np.searchsorted(boundaries, values, side="right") + FIRST_ID).astype(out_dtype)
    if valid is not None:
        ids[~valid] = NULL_ID
    return ids


def nonfinite_mask(values: np.ndarray, valid: np.ndarray | None) -> np.ndarray | None:
    """Rows whose present value is NaN or ±inf, or None when there are none."""
    if values.dtype.kind != "f":
        return None
    bad = ~np.isfinite(values)
    if valid is not None:
        bad &= valid
    return bad if bad.any() else None


# ---------------------------------------------------------------- host data


def to_numpy(x: np.ndarray | Strings) -> np.ndarray | Strings:
    """The array (or strings) as numpy, already the case here: every backend has this so that ops can hand data
    to host-side code (fitted state, error reports)."""
    return x


def is_keys(values: np.ndarray | Strings) -> bool:
    """Whether ``values`` are decoded keys (uint64) rather than raw values."""
    return isinstance(values, np.ndarray) and values.dtype == np.uint64


take = take_values


# ---------------------------------------------------------------- decode


def _hex_digit_table() -> np.ndarray:
    """Byte → hex digit value; 0xFF for bytes that are not hex digits."""
    lut = np.full(256, 0xFF, np.uint8)
    for i, c in enumerate(b"0123456789abcdef"):
        lut[c] = i
    for i, c in enumerate(b"ABCDEF"):
        lut[c] = 10 + i
    return lut


_HEX_DIGIT = _hex_digit_table()


@_jit
def _decode_hex(data, starts, ends, valid, width, lut, keys, bad):
    nbad = 0
    for i in range(len(keys)):
        s = starts[i]
        e = ends[i]
        n = e - s
        k = np.uint64(0)
        flag = np.uint8(0)
        if n < 1 or n > 16 or (width != 0 and n != width):
            flag = np.uint8(0xFF)
        else:
            for j in range(s, e):
                d = lut[data[j]]
                flag |= d  # bit 7 is set only by a non-digit
                k = (k << np.uint64(4)) | np.uint64(d & np.uint8(15))
        if valid is not None and not valid[i]:
            k = np.uint64(0)
            flag = np.uint8(0)
        keys[i] = k
        if flag & np.uint8(0x80):
            bad[i] = True
            nbad += 1
    return nbad


@_jit
def _decode_int_text(data, starts, ends, valid, keys, bad):
    nbad = 0
    for i in range(len(keys)):
        if valid is not None and not valid[i]:
            keys[i] = 0
            continue
        s = starts[i]
        e = ends[i]
        neg = False
        if s < e and (data[s] == 45 or data[s] == 43):
            neg = data[s] == 45
            s += 1
        ok = 0 < e - s <= 19
        mag = np.uint64(0)  # below 10**19 < 2**64: no overflow
        if ok:
            for j in range(s, e):
                c = data[j]
                if c < 48 or c > 57:
                    ok = False
                    break
                mag = mag * np.uint64(10) + np.uint64(c - 48)
        if ok and mag > (_INT64_MIN_MAGNITUDE if neg else _INT64_MIN_MAGNITUDE - np.uint64(1)):
            ok = False
        keys[i] = (np.uint64(0) - mag) if neg else mag
        if not ok:
            bad[i] = True
            nbad += 1
    return nbad


@_jit
def _decode_string(data, starts, ends, valid, keys):
    for i in range(len(keys)):
        if valid is not None and not valid[i]:
            keys[i] = 0
            continue
        h = _FNV_OFFSET
        for j in range(starts[i], ends[i]):
            h = (h ^ np.uint64(data[j])) * _FNV_PRIME
        keys[i] = _fmix64(h)


@_jit
def _encode_hex(keys, valid, width, offsets, data):
    pos = 0
    offsets[0] = 0
    for i in range(keys.shape[0]):
        if valid is None or valid[i]:
            x = keys[i]
            for d in range(width):
                nib = np.int64((x >> np.uint64(4 * (width - 1 - d))) & np.uint64(15))
                data[pos + d] = 48 + nib if nib < 10 else 87 + nib
            pos += width
        offsets[i + 1] = pos
    return pos


def encode_hex(keys: np.ndarray, valid: np.ndarray | None, width: int) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of ``decode_hex``: exactly ``width`` lowercase hex digits per present key (the low
    ``4 * width`` bits); missing keys take no bytes. Returns Arrow string buffers (int32 offsets, bytes)."""
    n_present = len(keys) if valid is None else int(np.count_nonzero(valid))
    offsets = np.empty(len(keys) + 1, np.int32)
    data = np.empty(n_present * width, np.uint8)
    _encode_hex(keys, valid, width, offsets, data)
    return offsets, data


def decode_hex(s: Strings, valid: np.ndarray | None, width: int | None) -> tuple[np.ndarray, np.ndarray | None]:
    """Hex text → uint64 keys. Returns (keys, bad) where bad marks malformed present values (None if none)."""
    keys = np.empty(len(s), np.uint64)
    bad = np.zeros(len(s), np.bool_)
    nbad = _decode_hex(s.data, s.starts, s.ends, valid, width or 0, _HEX_DIGIT, keys, bad)
    return keys, (bad if nbad else None)


def decode_int_text(s: Strings, valid: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
    """Decimal integer text (optional sign, at most 19 digits, within the int64 range) → its int64 value as a
    uint64 word (two's complement). Anything else is marked bad."""
    keys = np.empty(len(s), np.uint64)
    bad = np.zeros(len(s), np.bool_)
    nbad = _decode_int_text(s.data, s.starts, s.ends, valid, keys, bad)
    return keys, (bad if nbad else None)


def decode_string(s: Strings, valid: np.ndarray | None) -> np.ndarray:
    """Any text → ``string_key`` of its UTF-8 bytes."""
    keys = np.empty(len(s), np.uint64)
    _decode_string(s.data, s.starts, s.ends, valid, keys)
    return keys


def decode_int(values: np.ndarray) -> np.ndarray:
    """int64 values → the same bits as uint64 keys (zero copy)."""
    return values.astype(np.int64, copy=False).view(np.uint64)


# ---------------------------------------------------------------- hash and cross


@_jit
def _bucket_ids(keys, valid, rehash, sw, n, out):
    for i in range(len(keys)):
        if valid is not None and not valid[i]:
            out[i] = 1
        else:
            h = _fmix64(keys[i] ^ sw) if rehash else keys[i]
            out[i] = 2 + _reduce(h, n)


def hash_ids(keys: np.ndarray, valid: np.ndarray | None, seed: int, n: int, out_dtype) -> np.ndarray:
    """id = 2 + reduce(hash64(key, seed), n); missing → 1."""
    check_buckets(n)
    out = np.empty(len(keys), out_dtype)
    _bucket_ids(keys, valid, True, np.uint64(seed_word(seed)), n, out)
    return out


def bucket_ids(hashes: np.ndarray, valid: np.ndarray | None, n: int, out_dtype) -> np.ndarray:
    """id = 2 + reduce(hash, n) for values that are already hashes; missing → 1."""
    check_buckets(n)
    out = np.empty(len(hashes), out_dtype)
    _bucket_ids(hashes, valid, False, np.uint64(0), n, out)
    return out


@_jit
def _cross_step(h, k, sw, first):
    for i in range(len(h)):
        x = k[i] if first else (h[i] ^ k[i])
        h[i] = _fmix64(x ^ sw)


def cross_keys(keys: list[np.ndarray], valids: list[np.ndarray | None], seed: int) -> tuple[np.ndarray, np.ndarray | None]:
    """``cross_key`` of aligned key columns; a row is missing when any input is missing."""
    sw = np.uint64(seed_word(seed))
    h = np.empty(len(keys[0]), np.uint64)
    for j, k in enumerate(keys):
        _cross_step(h, k, sw, j == 0)
    valid = None
    for v in valids:
        if v is not None:
            valid = v.copy() if valid is None else (valid & v)
    return h, valid


# ---------------------------------------------------------------- vocabulary lookup (open addressing)


@_jit
def _table_insert(tkeys, tvals, keys, vals):
    mask = np.uint64(len(tkeys) - 1)
    for i in range(len(keys)):
        k = keys[i]
        j = _fmix64(k) & mask
        while tvals[j] >= 0 and tkeys[j] != k:
            j = (j + np.uint64(1)) & mask
        tkeys[j] = k
        tvals[j] = vals[i]


@_jit
def _lookup(tkeys, tvals, keys, valid, oov_base, oov_n, sw, out):
    mask = np.uint64(len(tkeys) - 1)
    for i in range(len(keys)):
        if valid is not None and not valid[i]:
            out[i] = 1
            continue
        k = keys[i]
        j = _fmix64(k) & mask
        v = -1
        while tvals[j] >= 0:
            if tkeys[j] == k:
                v = tvals[j]
                break
            j = (j + np.uint64(1)) & mask
        if v < 0:
            v = oov_base + _reduce(_fmix64(k ^ sw), oov_n)
        out[i] = v


class LookupTable:
    """Open-addressing hash table from uint64 keys to int64 ids (load factor <= 0.5, linear probing)."""

    def __init__(self, keys: np.ndarray, ids: np.ndarray):
        cap = 16
        while cap < 2 * len(keys):
            cap *= 2
        self.keys = np.zeros(cap, np.uint64)
        self.vals = np.full(cap, -1, np.int64)
        _table_insert(self.keys, self.vals, keys.astype(np.uint64, copy=False), ids.astype(np.int64, copy=False))

    def lookup(self, keys: np.ndarray, valid: np.ndarray | None, oov_base: int, oov_n: int, seed: int, out_dtype) -> np.ndarray:
        """ids of ``keys``; an absent key gets ``oov_base + reduce(hash64(key, seed), oov_n)``, missing → 1."""
        out = np.empty(len(keys), out_dtype)
        _lookup(self.keys, self.vals, keys, valid, oov_base, oov_n, np.uint64(seed_word(seed)), out)
        return out


# ---------------------------------------------------------------- counting (fit)


@_jit
def _count(tkeys, tcounts, keys, valid, weights):
    """Add each present key (``weights[i]`` times, or once when weights is None); returns new keys added."""
    mask = np.uint64(len(tkeys) - 1)
    added = 0
    for i in range(len(keys)):
        if valid is not None and not valid[i]:
            continue
        k = keys[i]
        j = _fmix64(k) & mask
        while tcounts[j] > 0 and tkeys[j] != k:
            j = (j + np.uint64(1)) & mask
        if tcounts[j] == 0:
            tkeys[j] = k
            added += 1
        tcounts[j] += 1 if weights is None else weights[i]
    return added


class KeyCounter:
    """Counts occurrences of uint64 keys in bounded memory (proportional to the number of distinct keys)."""

    def __init__(self) -> None:
        self.keys = np.zeros(1024, np.uint64)
        self.counts = np.zeros(1024, np.int64)
        self.size = 0

    def add(self, keys: np.ndarray, valid: np.ndarray | None) -> None:
        if 2 * (self.size + len(keys)) > len(self.keys):
            self._grow(self.size + len(keys))
        self.size += _count(self.keys, self.counts, keys, valid, None)

    def add_counts(self, keys: np.ndarray, counts: np.ndarray) -> None:
        """Add ``counts[i]`` occurrences of ``keys[i]`` (keys distinct)."""
        if 2 * (self.size + len(keys)) > len(self.keys):
            self._grow(self.size + len(keys))
        self.size += _count(self.keys, self.counts, keys, None, counts)

    def merge_from(self, other: KeyCounter) -> None:
        """Add every count of ``other`` into this counter."""
        used = other.counts > 0
        self.add_counts(other.keys[used], other.counts[used])

    def _grow(self, need: int) -> None:
        cap = len(self.keys)
        while cap < 2 * need:
            cap *= 2
        used = self.counts > 0
        k, c = self.keys[used], self.counts[used]
        self.keys = np.zeros(cap, np.uint64)
        self.counts = np.zeros(cap, np.int64)
        self.size = _count(self.keys, self.counts, k, None, c)

    def at_least(self, threshold: int) -> tuple[np.ndarray, np.ndarray]:
        """(keys, counts) of the keys counted at least ``threshold`` times, in no particular order."""
        keep = self.counts >= max(threshold, 1)
        return self.keys[keep], self.counts[keep]


# ---------------------------------------------------------------- lists


def first_x(offsets: np.ndarray, x: int) -> tuple[np.ndarray, np.ndarray]:
    """Keep the first ``x`` elements of each list: returns (element indices to keep, new offsets)."""
    return gather_ranges(offsets[:-1], np.minimum(np.diff(offsets), x))
