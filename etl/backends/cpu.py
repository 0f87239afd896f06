"""The CPU backend (an ``etl.backends.Backend``): numpy plus numba kernels over flat buffers (Arrow buffers viewed
as numpy, no copies).

Every kernel releases the GIL (``nogil=True``), so worker threads transform row groups in parallel. The formulas
for hashing, range reduction and string keys are defined in ``etl.backends.hashing``; ids follow the reserved-id
convention of ``etl.ids`` (0 padding, 1 null, then the op's own ids).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic
from numpy.typing import DTypeLike

from etl.backends.dates import MAX_SECONDS, MIN_SECONDS, PARTS, SECONDS_PER_DAY, DateFormat
from etl.backends.hashing import C1, C2, FNV_OFFSET, FNV_PRIME, check_buckets, seed_word
from etl.batch import InlineStrings, Strings, gather_ranges, take_values
from etl.ids import FIRST, MISSING

_jit = nb.njit(nogil=True, cache=True)

_C1 = np.uint64(C1)
_C2 = np.uint64(C2)
_FNV_OFFSET = np.uint64(FNV_OFFSET)
_FNV_PRIME = np.uint64(FNV_PRIME)
_S33 = np.uint64(33)
_S32 = np.uint64(32)
_LOW = np.uint64(0xFFFFFFFF)  # the low and high halves of a narrow hash table's word: value, key
_HIGH = np.uint64(0xFFFFFFFF00000000)
_INT64_MIN_MAGNITUDE = np.uint64(1 << 63)
_UINT64_MAX_TENTH = np.uint64((2**64 - 1) // 10)  # 2**64 - 1 = 10 * this + 5
_UINT64_MAX_LAST_DIGIT = np.uint64((2**64 - 1) % 10)


@intrinsic
def prefetch(typingctx, arr, idx):
    """Hint the CPU to fetch the cache line of ``arr[idx]`` (a 1-d or 2-d array; ``idx`` an int or a tuple)
    ahead of use: probes into large hash tables then overlap their memory latency."""
    if not isinstance(arr, types.Array):
        return None
    sig = types.void(arr, idx)

    def codegen(context, builder, signature, args):
        aryty, idxty = signature.args
        ary = context.make_array(aryty)(context, builder, args[0])
        if isinstance(idxty, types.BaseTuple):
            indices = cgutils.unpack_tuple(builder, args[1], len(idxty))
        else:
            indices = [args[1]]
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, indices, wraparound=False, boundscheck=False)
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), "llvm.prefetch.p0")
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen


_PREFETCH = 32  # keys ahead: enough to cover a DRAM miss at ~2-3 ns per key
_NEAR = 1 << 15  # tables of up to this many 16-byte slots (512 KB) stay in L2: no prefetch, it only costs there


@_jit
def fmix64(k):
    """MurmurHash3's 64-bit finaliser of a uint64 (``etl.backends.hashing.fmix64``, the documented formula), in
    numba: callable from the kernels of other modules."""
    k ^= k >> _S33
    k *= _C1
    k ^= k >> _S33
    k *= _C2
    k ^= k >> _S33
    return k


@_jit
def reduce_range(h, n):
    """A hash ``h`` reduced to ``[0, n)`` by the documented rule (``etl.backends.hashing.reduce``), in numba."""
    return np.int64((h >> _S32) * np.uint64(n) >> _S32)


# ---------------------------------------------------------------- dense


@_jit
def _fill_null(values, valid, value, out):
    for i in range(len(out)):
        out[i] = np.float64(values[i]) if valid[i] else value


def fill_null(values: np.ndarray, valid: np.ndarray | None, value: float) -> np.ndarray:
    """float64 copy of ``values`` with missing entries replaced by ``value`` (one pass)."""
    if valid is None or values.dtype not in (np.int64, np.float64, np.int32, np.float32):
        out = values.astype(np.float64)
        if valid is not None:
            out[~valid] = value
        return out
    out = np.empty(len(values), np.float64)
    _fill_null(values, valid, np.float64(value), out)
    return out


def clamp(values: np.ndarray, lo: float | None, hi: float | None) -> np.ndarray:
    """float64 values limited to [lo, hi] (a bound of None is open)."""
    return np.clip(values.astype(np.float64, copy=False), lo, hi)


def log1p(values: np.ndarray) -> np.ndarray:
    """float64 ln(1 + x): -inf at -1, NaN below (no warning: the output check rejects those rows)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log1p(values.astype(np.float64, copy=False))


def normalize(values: np.ndarray, mean: float, std: float) -> np.ndarray:
    """float64 (x - mean) / std (±inf where it overflows, without a warning: the output check rejects those rows)."""
    with np.errstate(over="ignore"):
        return (values.astype(np.float64, copy=False) - mean) / std


def moments(values: np.ndarray, valid: np.ndarray | None) -> tuple[int, float, float] | None:
    """(count, sum, sum of squared deviations from their mean) of the present values in float64, or None when
    no value is present. A sum beyond the float64 range is ±inf, a NaN or infinite value makes NaN or ±inf, without
    a warning (the fit refuses such statistics)."""
    v = values.astype(np.float64, copy=False)
    if valid is not None:
        v = v[valid]
    if not len(v):
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        return len(v), float(v.sum()), float(((v - v.mean()) ** 2).sum())


def magnitudes(values: np.ndarray, valid: np.ndarray | None) -> tuple[np.ndarray, float, float] | None:
    """The present values counted by their top 12 bits as float64 (sign and binary exponent: an int64 array of
    4,096 counts), with their min and max, or None when no value is present (one pass)."""
    v = np.ascontiguousarray(values, dtype=np.float64)
    counts = np.zeros(4096, np.int64)
    low, high, n = _magnitudes(v, v.view(np.uint64), valid, counts)
    return (counts, low, high) if n else None


@_jit
def _magnitudes(values, bits, valid, counts):
    low, high, n = np.inf, -np.inf, 0
    for i in range(len(values)):
        if valid is None or valid[i]:
            counts[bits[i] >> 52] += 1
            low, high, n = min(low, values[i]), max(high, values[i]), n + 1
    return low, high, n


def bucketize(values: np.ndarray, valid: np.ndarray | None, boundaries: np.ndarray, out_dtype: DTypeLike) -> np.ndarray:
    """id = 2 + number of boundaries <= value (right-closed buckets); missing → 1."""
    ids = (np.searchsorted(boundaries, values, side="right") + FIRST).astype(out_dtype)
    if valid is not None:
        ids[~valid] = MISSING
    return ids


def nonfinite_mask(values: np.ndarray, valid: np.ndarray | None) -> np.ndarray | None:
    """Rows whose present value is NaN or ±inf, or None when there are none."""
    if values.dtype.kind != "f":
        return None
    bad = ~np.isfinite(values)
    if valid is not None:
        bad &= valid
    return bad if bad.any() else None


def first_nonfinite(columns: list[tuple[np.ndarray, np.ndarray | None]]) -> tuple[int, np.ndarray] | None:
    """The first of ``columns`` (values, valid) holding a present NaN or ±inf, as (its index, its
    ``nonfinite_mask``), or None."""
    for i, (values, valid) in enumerate(columns):
        bad = nonfinite_mask(values, valid)
        if bad is not None:
            return i, bad
    return None


def as_float32(values: np.ndarray) -> np.ndarray:
    """Float values rounded to float32 as the output holds them (beyond ±float32 max: ±inf); other values as
    they are."""
    if values.dtype.kind != "f":
        return values
    with np.errstate(over="ignore"):
        return values.astype(np.float32)


#: the functions of ``elementwise``
_ELEMENTWISE: dict[str, Callable[..., np.ndarray]] = {
    "float64": lambda a: a.astype(np.float64), "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
    "neg": np.negative, "abs": np.abs, "sqrt": np.sqrt, "log1p": np.log1p, "lt": np.less, "le": np.less_equal,
    "gt": np.greater, "ge": np.greater_equal, "eq": np.equal, "ne": np.not_equal, "isnan": np.isnan,
    "and": np.logical_and, "or": np.logical_or, "not": np.logical_not, "where": np.where,
}  # fmt: skip


def elementwise(fn: str, *args: np.ndarray | float) -> np.ndarray:
    """``fn`` applied value by value to ``args`` (arrays of one length, or numbers; at least one array but for the
    arithmetic functions), for ``etl.ops.expr``: "float64" (a float64 copy), "add", "sub", "mul", "div", "neg",
    "abs", "sqrt", "log1p" (float64 values), "lt", "le", "gt", "ge", "eq", "ne", "isnan" (bool), "and", "or", "not"
    (of bool arrays), "where" (condition, a, b: a where it holds, else b). Float64 arithmetic as IEEE 754 rounds it
    (±inf and NaN where it overflows or is undefined, without a warning)."""
    with np.errstate(all="ignore"):
        return _ELEMENTWISE[fn](*args)


# ---------------------------------------------------------------- host data


def to_numpy(x: np.ndarray | Strings) -> np.ndarray | Strings:
    """The array (or strings) as numpy, already the case here: every backend has this so that ops can hand data
    to host-side code (fitted state, error reports)."""
    return x


def from_host(values: np.ndarray, like: np.ndarray) -> np.ndarray:
    """The host array as it is (this backend's arrays are host arrays)."""
    return values


class ValueTable:
    """A constant table of values, gathered by index (``values[idx]``)."""

    def __init__(self, values: np.ndarray):
        self.values = values

    def take(self, idx: np.ndarray) -> np.ndarray:
        return self.values[idx]


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


_HI = np.uint64(0x8080808080808080)
_LO_NIBBLES = np.uint64(0x0F0F0F0F0F0F0F0F)
_ONES = np.uint64(0x0101010101010101)
_CASE = np.uint64(0x2020202020202020)


@_jit
def _hex8(x):
    """8 ASCII hex digits packed little-endian in a uint64 (first digit in the low byte) → (value, ok), with
    SWAR bit tricks and no branches. A byte is valid when it is '0'-'9', 'a'-'f' or 'A'-'F'; each range check
    adds a constant per byte so that bit 7 tells the comparison (no carry crosses a byte once bytes are known to
    be < 0x80; the value is meaningless when ok is False)."""
    x7 = x & ~_HI
    is_digit = (x7 + np.uint64(0x5050505050505050)) & ~(x7 + np.uint64(0x4646464646464646))  # 0x30 <= b < 0x3A
    lx = x7 | _CASE
    is_alpha = (lx + np.uint64(0x1F1F1F1F1F1F1F1F)) & ~(lx + np.uint64(0x1919191919191919))  # 0x61 <= b|0x20 < 0x67
    ok = ((is_digit | is_alpha) & ~x & _HI) == _HI  # every byte: in range and below 0x80
    v = (x & _LO_NIBBLES) + ((x >> np.uint64(6)) & _ONES) * np.uint64(9)  # byte i = value of digit i
    v = ((v & np.uint64(0x00FF00FF00FF00FF)) << np.uint64(4)) | ((v >> np.uint64(8)) & np.uint64(0x00FF00FF00FF00FF))
    v = ((v & np.uint64(0x000000FF000000FF)) << np.uint64(8)) | ((v >> np.uint64(16)) & np.uint64(0x000000FF000000FF))
    return ((v & np.uint64(0xFFFF)) << np.uint64(16)) | (v >> np.uint64(32)), ok


@_jit
def _load8(data, s):
    """Bytes ``data[s:s+8]`` as a little-endian uint64 (LLVM turns this into one unaligned load)."""
    x = np.uint64(0)
    for j in range(8):
        x |= np.uint64(data[s + j]) << np.uint64(8 * j)
    return x


@_jit
def _hex_bytes(data, s, e, width, lut):
    """Digits ``data[s:e]`` one byte at a time → (value, ok): any length 1-16 (exactly ``width`` if nonzero)."""
    n = e - s
    if n < 1 or n > 16 or (width != 0 and n != width):
        return np.uint64(0), False
    k = np.uint64(0)
    flag = np.uint8(0)
    for j in range(s, e):
        d = lut[data[j]]
        flag |= d  # bit 7 is set only by a non-digit
        k = (k << np.uint64(4)) | np.uint64(d & np.uint8(15))
    return k, (flag & np.uint8(0x80)) == 0


@_jit
def _decode_hex(data, starts, ends, valid, width, lut, keys, bad):
    nbad = 0
    fast = width == 0 or width == 8
    for i in range(len(keys)):
        s = starts[i]
        e = ends[i]
        v = True if valid is None else valid[i]
        if fast and e - s == 8:
            k, ok = _hex8(_load8(data, s))
        elif v:
            k, ok = _hex_bytes(data, s, e, width, lut)
        else:
            k, ok = np.uint64(0), True
        keys[i] = k & (np.uint64(0) - np.uint64(v))  # missing → 0, without a branch
        if v & ~ok:
            bad[i] = True
            nbad += 1
    return nbad


@_jit
def _decode_hex_views(v64, valid, width, lut, keys, bad):
    """Like ``_decode_hex`` on Arrow string views whose strings are all inline, read in place: ``v64`` is the
    view buffer as uint64 words (word 2i: length, then bytes 0-3 of string i; word 2i+1: bytes 4-11).

    A first branch-free (vectorised) pass decodes every row as 8 digits and counts the present rows that are not
    8 valid digits; only when there are some (another width, or malformed values) does a second pass redo those
    rows byte by byte."""
    n = len(keys)
    miss = np.uint64(0)
    for i in range(n):
        w0 = v64[2 * i]
        k, ok = _hex8((w0 >> _S32) | (v64[2 * i + 1] << _S32))
        good = np.uint64(ok & ((w0 & np.uint64(0xFFFFFFFF)) == np.uint64(8)))
        m = np.uint64(1) if valid is None else np.uint64(valid[i])
        keys[i] = k & (np.uint64(0) - m)  # missing → 0
        miss += m & (np.uint64(1) - good)
    if miss == 0 and (width == 0 or width == 8):
        return 0
    data = v64.view(np.uint8)
    nbad = 0
    for i in range(n):
        if valid is not None and not valid[i]:
            continue
        s = 16 * i + 4
        k, ok = _hex_bytes(data, s, s + np.int64(v64[2 * i] & np.uint64(0xFFFFFFFF)), width, lut)
        keys[i] = k
        if not ok:
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
        ok = 0 < e - s <= 20
        mag = np.uint64(0)
        if ok:
            for j in range(s, e):
                c = data[j]
                if c < 48 or c > 57:
                    ok = False
                    break
                d = np.uint64(c - 48)
                if mag > _UINT64_MAX_TENTH or (mag == _UINT64_MAX_TENTH and d > _UINT64_MAX_LAST_DIGIT):
                    ok = False  # beyond 2**64 - 1
                    break
                mag = mag * np.uint64(10) + d
        if ok and neg and mag > _INT64_MIN_MAGNITUDE:
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
        keys[i] = fmix64(h)


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
    if isinstance(s, InlineStrings):  # no start/end arrays to read
        nbad = _decode_hex_views(s.inline_views.reshape(-1).view(np.uint64), valid, width or 0, _HEX_DIGIT, keys, bad)
    else:
        nbad = _decode_hex(s.data, s.starts, s.ends, valid, width or 0, _HEX_DIGIT, keys, bad)
    return keys, (bad if nbad else None)


def decode_int_text(s: Strings, valid: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
    """Decimal integer text (optional sign, at most 20 digits, a value in [-2**63, 2**64 - 1]) → the value as a
    uint64 word: a non-negative value itself, a negative one its two's complement (so -1 and 2**64 - 1 give the
    same key). Anything else is marked bad."""
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


# ---------------------------------------------------------------- dates (see etl.backends.dates)


@_jit
def _days_from_civil(y, m, d):
    """Day number (days since 1970-01-01) of the proleptic Gregorian date y-m-d (Hinnant)."""
    y -= 1 if m <= 2 else 0
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


@_jit
def _civil_from_days(z):
    """(year, month, day) of day number ``z`` (Hinnant)."""
    z += 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (1 if m <= 2 else 0), m, d


@_jit
def _month_days(y, m):
    if m == 2:
        return 29 if (y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)) else 28
    return 30 if m == 4 or m == 6 or m == 9 or m == 11 else 31


@_jit
def _put_fields(f, short_year, out, i):
    """Check the fields ``f`` (year, month, day, hour, minute, second) of row ``i`` and write its parts into
    ``out``; False when they are not a date."""
    y = f[0] + ((2000 if f[0] < 69 else 1900) if short_year else 0)
    m, d = f[1], f[2]
    if not (1 <= y <= 9999 and 1 <= m <= 12 and 1 <= d and f[3] <= 23 and f[4] <= 59 and f[5] <= 59):
        return False
    if d > _month_days(y, m):
        return False
    out[0, i], out[1, i], out[2, i], out[3, i], out[4, i] = y, m, d, f[3], f[4]
    out[5, i] = (_days_from_civil(y, m, d) + 3) % 7
    return True


@_jit
def _dates_from_text(data, starts, ends, valid, template, fstarts, widths, defaults, short_year, out, bad):
    n_fields = len(widths)
    f = np.empty(n_fields, np.int64)
    nbad = 0
    for i in range(len(starts)):
        if valid is not None and not valid[i]:
            continue
        s = starts[i]
        ok = ends[i] - s == len(template)
        if ok:
            for j in range(len(template)):
                b = np.int64(data[s + j])
                t = template[j]
                if (t >= 0 and b != t) or (t < 0 and (b < 48 or b > 57)):
                    ok = False
                    break
        if ok:
            for k in range(n_fields):
                v = defaults[k]
                if widths[k]:
                    v = 0
                    for j in range(fstarts[k], fstarts[k] + widths[k]):
                        v = v * 10 + np.int64(data[s + j]) - 48
                f[k] = v
            ok = _put_fields(f, short_year, out, i)
        if not ok:
            bad[i] = True
            nbad += 1
    return nbad


@_jit
def _dates_from_ints(values, valid, length, fstarts, widths, defaults, short_year, out, bad):
    n_fields = len(widths)
    f = np.empty(n_fields, np.int64)
    limit = np.int64(10) ** length
    nbad = 0
    for i in range(len(values)):
        if valid is not None and not valid[i]:
            continue
        v = np.int64(values[i])
        ok = 0 <= v < limit
        if ok:
            for k in range(n_fields):
                f[k] = defaults[k]
                if widths[k]:
                    f[k] = (v // np.int64(10) ** (length - fstarts[k] - widths[k])) % np.int64(10) ** widths[k]
            ok = _put_fields(f, short_year, out, i)
        if not ok:
            bad[i] = True
            nbad += 1
    return nbad


@_jit
def _dates_from_seconds(seconds, valid, out, bad):
    nbad = 0
    for i in range(len(seconds)):
        if valid is not None and not valid[i]:
            continue
        t = np.int64(seconds[i])
        if bad[i] or t < MIN_SECONDS or t > MAX_SECONDS:  # bad already: malformed integer text
            bad[i] = True
            nbad += 1
            continue
        z = t // SECONDS_PER_DAY
        r = t - z * SECONDS_PER_DAY
        y, m, d = _civil_from_days(z)
        out[0, i], out[1, i], out[2, i], out[3, i], out[4, i], out[5, i] = y, m, d, r // 3600, (r // 60) % 60, (z + 3) % 7
    return nbad


def date_parts(values: np.ndarray | Strings, valid: np.ndarray | None, fmt: DateFormat) -> tuple[np.ndarray, np.ndarray | None]:
    """The parts of each present value read with ``fmt``: int64 [len(PARTS), n] (row j: ``PARTS[j]``; 0 under
    missing values and values that are not a date), and bad: the present values that are not a date in ``fmt`` (None when there are none).
    ``values``: text, or integers (int64)."""
    n = len(values)
    out = np.zeros((len(PARTS), n), np.int64)
    bad = np.zeros(n, np.bool_)
    if fmt.unix:
        if isinstance(values, Strings):
            seconds, text_bad = decode_int_text(values, valid)
            if text_bad is not None:
                bad |= text_bad
            values = seconds.view(np.int64)
        nbad = _dates_from_seconds(values, valid, out, bad)
    else:
        template, fstarts, widths, defaults = fmt.arrays()
        if isinstance(values, Strings):
            nbad = _dates_from_text(values.data, values.starts, values.ends, valid, template, fstarts, widths, defaults, fmt.short_year, out, bad)
        else:
            nbad = _dates_from_ints(values, valid, fmt.length, fstarts, widths, defaults, fmt.short_year, out, bad)
    return out, (bad if nbad else None)


# ---------------------------------------------------------------- hash and cross


@_jit
def _bucket_ids(keys, valid, rehash, sw, n, out):
    for i in range(len(keys)):  # no branch on validity: the loop vectorises
        h = fmix64(keys[i] ^ sw) if rehash else keys[i]
        b = 2 + reduce_range(h, n)
        out[i] = b if valid is None or valid[i] else 1


def hash_ids(keys: np.ndarray, valid: np.ndarray | None, seed: int, n: int, out_dtype: DTypeLike) -> np.ndarray:
    """id = 2 + reduce(hash64(key, seed), n); missing → 1."""
    check_buckets(n)
    out = np.empty(len(keys), out_dtype)
    _bucket_ids(keys, valid, True, np.uint64(seed_word(seed)), n, out)
    return out


def hash_columns(
    keys: list[np.ndarray], valids: list[np.ndarray | None], seed: int, n: int, out_dtype: DTypeLike
) -> list[np.ndarray]:
    """``hash_ids`` of several columns."""
    return [hash_ids(k, v, seed, n, out_dtype) for k, v in zip(keys, valids)]


def bucket_ids(hashes: np.ndarray, valid: np.ndarray | None, n: int, out_dtype: DTypeLike) -> np.ndarray:
    """id = 2 + reduce(hash, n) for values that are already hashes; missing → 1."""
    check_buckets(n)
    out = np.empty(len(hashes), out_dtype)
    _bucket_ids(hashes, valid, False, np.uint64(0), n, out)
    return out


@_jit
def _cross_step(h, k, sw, first):
    for i in range(len(h)):
        x = k[i] if first else (h[i] ^ k[i])
        h[i] = fmix64(x ^ sw)


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


# ---------------------------------------------------------------- hash tables (open addressing)
#
# Both tables below are one (capacity, 2) uint64 array, a power-of-two number of slots of [key, value] (16 bytes,
# so a probe touches one cache line, not one per array), linear probing from ``fmix64(key)``, value 0 = empty
# slot; or, *narrow*, one uint64 a slot, ``key << 32 | value``, where keys and values fit in 32 bits. The probe
# loops prefetch the home slot of the key ``_PREFETCH`` positions ahead, so that the memory latency of large tables
# (a million keys is 32 MB) overlaps instead of adding up.


@_jit
def _slot(k, mask):
    return np.int64(fmix64(k) & mask)


@_jit
def _table_insert(tab, keys, vals):
    mask = np.uint64(len(tab) - 1)
    for i in range(len(keys)):
        k = keys[i]
        j = _slot(k, mask)
        while tab[j, 1] != 0 and tab[j, 0] != k:
            j = (j + 1) & np.int64(mask)
        tab[j, 0] = k
        tab[j, 1] = np.uint64(vals[i] + 1)


@_jit
def _lookup(tab, keys, valid, oov_base, oov_n, sw, out):
    mask = np.uint64(len(tab) - 1)
    n = len(keys)
    far = len(tab) > _NEAR
    for i in range(n):
        if far and i + _PREFETCH < n:
            prefetch(tab, (_slot(keys[i + _PREFETCH], mask), 0))
        if valid is not None and not valid[i]:
            out[i] = 1
            continue
        k = keys[i]
        j = _slot(k, mask)
        v = np.int64(-1)
        while True:
            e = tab[j, 1]
            if e == 0:
                break
            if tab[j, 0] == k:
                v = np.int64(e) - 1
                break
            j = (j + 1) & np.int64(mask)
        if v < 0:
            v = oov_base + reduce_range(fmix64(k ^ sw), oov_n)
        out[i] = v


@_jit
def _table_insert_narrow(tab, keys, vals):
    """``_table_insert`` into a narrow table (``LookupTable``)."""
    mask = np.uint64(len(tab) - 1)
    for i in range(len(keys)):
        k = keys[i]
        tag = k << _S32
        j = _slot(k, mask)
        while tab[j] != 0 and (tab[j] & _HIGH) != tag:
            j = (j + 1) & np.int64(mask)
        tab[j] = tag | np.uint64(vals[i] + 1)


@_jit
def _lookup_narrow(tab, keys, valid, oov_base, oov_n, sw, out):
    """``_lookup`` in a narrow table: a key of 2**32 or more is never in it."""
    mask = np.uint64(len(tab) - 1)
    n = len(keys)
    far = len(tab) > 2 * _NEAR
    for i in range(n):
        if far and i + _PREFETCH < n:
            prefetch(tab, _slot(np.uint64(keys[i + _PREFETCH]), mask))
        if valid is not None and not valid[i]:
            out[i] = 1
            continue
        k = np.uint64(keys[i])
        v = np.int64(-1)
        if k <= _LOW:
            tag = k << _S32
            j = _slot(k, mask)
            while True:
                e = tab[j]
                if e == 0:
                    break
                if (e & _HIGH) == tag:
                    v = np.int64(e & _LOW) - 1
                    break
                j = (j + 1) & np.int64(mask)
        if v < 0:
            v = oov_base + reduce_range(fmix64(k ^ sw), oov_n)
        out[i] = v


class LookupTable:
    """Open-addressing hash table from uint64 keys to int64 ids >= 0, linear probing. *Narrow* (one uint64 a slot,
    ``key << 32 | id + 1``, load factor <= 1/2) when every key is below 2**32 and every id below 2**32 - 1 (decoded
    8-hex-digit keys, small ints); else wide (``[key, id + 1]`` slots of 16 bytes, load factor <= 1/4). Either way an
    absent key (out of vocabulary) stops within the cache line of its home slot, mostly; the narrow table takes a
    quarter of the room."""

    def __init__(self, keys: np.ndarray, ids: np.ndarray):
        keys = keys.astype(np.uint64, copy=False)
        ids = ids.astype(np.int64, copy=False)
        self.narrow = bool(len(keys) == 0 or (int(keys.max()) <= _LOW and 0 <= int(ids.min()) and int(ids.max()) < _LOW))
        cap = 16
        while cap < (2 if self.narrow else 4) * len(keys):
            cap *= 2
        self.table = np.zeros(cap if self.narrow else (cap, 2), np.uint64)
        (_table_insert_narrow if self.narrow else _table_insert)(self.table, keys, ids)

    def lookup(
        self, keys: np.ndarray, valid: np.ndarray | None, oov_base: int, oov_n: int, seed: int, out_dtype: DTypeLike
    ) -> np.ndarray:
        """ids of ``keys``; an absent key gets ``oov_base + reduce(hash64(key, seed), oov_n)``, missing → 1."""
        out = np.empty(len(keys), out_dtype)
        (_lookup_narrow if self.narrow else _lookup)(self.table, keys, valid, oov_base, oov_n, np.uint64(seed_word(seed)), out)
        return out


class LookupTables:
    """The vocabularies of several columns (one ``LookupTable`` each), looked up together."""

    def __init__(self, tables: list[tuple[np.ndarray, np.ndarray]]):
        self.tables = [LookupTable(k, v) for k, v in tables]

    def lookup(
        self,
        keys: list[np.ndarray],
        valids: list[np.ndarray | None],
        oov_base: int,
        oov_n: int,
        seed: int,
        out_dtypes: Sequence[DTypeLike],
    ) -> list[np.ndarray]:
        """ids of each column's ``keys`` in its table, as ``LookupTable.lookup``."""
        return [t.lookup(k, v, oov_base, oov_n, seed, dt) for t, k, v, dt in zip(self.tables, keys, valids, out_dtypes)]


# ---------------------------------------------------------------- counting (fit)
#
# Count tables fill up to 3/4 of their slots: with linear probing a new key then probes ~8 slots on average, most
# within the cache line of its home slot (8 narrow slots a line), and the tables (the fit's largest memory: one per
# column, as many slots as distinct keys) take 1.5x less room than at 1/2.


@_jit
def _count_limit(capacity):
    """The most keys a count table of ``capacity`` slots holds (3/4 of them)."""
    return capacity - capacity // 4


@_jit
def _count(tab, keys, valid, start, size):
    """Count present keys from position ``start`` until the end or until the table holds ``_count_limit`` keys; returns
    (position reached, number of keys in the table)."""
    mask = np.uint64(len(tab) - 1)
    limit = _count_limit(len(tab))
    n = len(keys)
    far = len(tab) > _NEAR
    for i in range(start, n):
        if size >= limit:
            return i, size
        if far and i + _PREFETCH < n:
            prefetch(tab, (_slot(keys[i + _PREFETCH], mask), 0))
        if valid is not None and not valid[i]:
            continue
        k = keys[i]
        j = _slot(k, mask)
        while tab[j, 1] != 0 and tab[j, 0] != k:
            j = (j + 1) & np.int64(mask)
        if tab[j, 1] == 0:
            tab[j, 0] = k
            size += 1
        tab[j, 1] += np.uint64(1)
    return n, size


@_jit
def _rehash(old, new):
    """Insert every used slot of ``old`` into the empty table ``new`` (keys are distinct)."""
    mask = np.uint64(len(new) - 1)
    for i in range(len(old)):  # no prefetch: slot order is kept, so the writes go forward in two streams
        if old[i, 1] != 0:
            k = old[i, 0]
            j = _slot(k, mask)
            while new[j, 1] != 0:
                j = (j + 1) & np.int64(mask)
            new[j, 0] = k
            new[j, 1] = old[i, 1]


@_jit
def _at_least(tab, threshold, size):
    keys = np.empty(size, np.uint64)
    counts = np.empty(size, np.int64)
    m = 0
    for i in range(len(tab)):
        if tab[i, 1] >= threshold:
            keys[m] = tab[i, 0]
            counts[m] = np.int64(tab[i, 1])
            m += 1
    return keys[:m], counts[:m]


# A narrow count table is one uint64 array of ``key << 32 | count`` words (8 bytes a slot), for keys below 2**32
# (decoded 8-hex-digit keys, small ints) and counts below 2**32; 0 is an empty slot (a counted key has count >= 1).


@_jit
def _count_narrow(tab, keys, valid, start, size):
    """``_count`` into a narrow table; returns (position reached, number of keys in the table, whether it stopped
    at a key of 2**32 or more, which the narrow table cannot hold)."""
    mask = np.uint64(len(tab) - 1)
    limit = _count_limit(len(tab))
    n = len(keys)
    far = len(tab) > 2 * _NEAR
    for i in range(start, n):
        if size >= limit:
            return i, size, False
        if far and i + _PREFETCH < n:
            prefetch(tab, _slot(np.uint64(keys[i + _PREFETCH]), mask))
        if valid is not None and not valid[i]:
            continue
        k = np.uint64(keys[i])
        if k > _LOW:
            return i, size, True
        tag = k << _S32
        j = _slot(k, mask)
        while True:
            e = tab[j]
            if e == 0:
                tab[j] = tag | np.uint64(1)
                size += 1
                break
            if (e & _HIGH) == tag:
                tab[j] = e + np.uint64(1)
                break
            j = (j + 1) & np.int64(mask)
    return n, size, False


@_jit
def _rehash_narrow(old, new):
    """``_rehash`` of narrow tables."""
    mask = np.uint64(len(new) - 1)
    for i in range(len(old)):
        e = old[i]
        if e != 0:
            j = _slot(e >> _S32, mask)
            while new[j] != 0:
                j = (j + 1) & np.int64(mask)
            new[j] = e


@_jit
def _at_least_narrow(tab, threshold, size):
    keys = np.empty(size, np.uint64)
    counts = np.empty(size, np.int64)
    m = 0
    for i in range(len(tab)):
        e = tab[i]
        if e != 0 and (e & _LOW) >= threshold:
            keys[m] = e >> _S32
            counts[m] = np.int64(e & _LOW)
            m += 1
    return keys[:m], counts[:m]


class KeyCounter:
    """Counts occurrences of uint64 keys in memory proportional to the number of distinct keys (load factor at most
    3/4, at least 3/8 as it grows), whatever the number of rows.

    The table is *narrow* (8 bytes a slot: key and count in one word) while every key counted is below 2**32 and
    fewer than 2**32 keys were given; the first key or batch beyond that makes it *wide* (16 bytes a slot: a uint64
    key and a uint64 count). Decoded 8-hex-digit keys (Criteo's) stay narrow: half the memory, half the pages to
    fault in. The table doubles when it is 3/4 full. Given ``rows``, the number of keys it will be given in all
    (missing ones included), it is sized once the first batch is counted for the distinct keys those rows are
    expected to hold (``projected_distinct``), so that it does not double again and again while it fills: each
    doubling writes a new table, twice the size of the last, in fresh memory. A wrong guess only costs memory (a
    table larger than needed, at most ``PROJECTION_LIMIT`` times the first batch's distinct keys) or time (the
    doublings it was to spare); the counts are the same."""

    def __init__(self, rows: int | None = None) -> None:
        self.table: np.ndarray = np.zeros(1024, np.uint64)  # narrow: (capacity,); wide: (capacity, 2)
        self.size = 0
        self._rows = rows  # the keys to count in all, until the first batch is counted
        self._given = 0  # the keys given so far (missing ones included): a bound on every count

    @property
    def wide(self) -> bool:
        """Whether the table holds 16-byte slots (a key of 2**32 or more was counted, or 2**32 keys were given)."""
        return self.table.ndim == 2

    def add(self, keys: np.ndarray, valid: np.ndarray | None) -> None:
        """Count each present key once."""
        self._given += len(keys)
        if self._given > _NARROW_COUNTS and not self.wide:
            self._widen()
        rows, self._rows = self._rows, None
        if rows is None or len(keys) < 2 or rows <= len(keys):
            self._add_keys(keys, valid)
            return
        half = len(keys) // 2
        self._add_keys(keys[:half], None if valid is None else valid[:half])
        at_half = self.size
        self._add_keys(keys[half:], None if valid is None else valid[half:])
        self._grow(projected_distinct(at_half, self.size, len(keys), rows))

    def _add_keys(self, keys: np.ndarray, valid: np.ndarray | None) -> None:
        i = 0
        while i < len(keys):
            if self.wide:
                i, self.size = _count(self.table, keys, valid, i, self.size)
            else:
                i, self.size, beyond = _count_narrow(self.table, keys, valid, i, self.size)
                if beyond:
                    self._widen()
                    continue
            if i < len(keys):
                self._grow(self.size + 1)

    def _grow(self, need: int) -> None:
        """Make room for ``need`` keys (``_count_limit``)."""
        cap = len(self.table)
        while _count_limit(cap) < need:
            cap *= 2
        if cap != len(self.table):
            new = np.zeros((cap, 2) if self.wide else cap, np.uint64)
            (_rehash if self.wide else _rehash_narrow)(self.table, new)
            self.table = new

    def _widen(self) -> None:
        """Make the table wide (as many slots, 16 bytes each), its keys and counts put in by ``_table_insert`` (which
        stores value + 1: each count goes in as count - 1). Once per table at most."""
        used = self.table[self.table != 0]
        new = np.zeros((len(self.table), 2), np.uint64)
        _table_insert(new, used >> _S32, (used & _LOW).astype(np.int64) - 1)
        self.table = new

    def at_least(self, threshold: int) -> tuple[np.ndarray, np.ndarray]:
        """(keys, counts) of the keys counted at least ``threshold`` times, ascending by key (so that a stable
        sort by count, as a vocabulary needs, has half the work left)."""
        at_least = _at_least if self.wide else _at_least_narrow
        keys, counts = at_least(self.table, np.uint64(max(threshold, 1)), self.size)
        order = np.argsort(keys)
        return keys[order], counts[order]


#: The most keys a narrow table is given (a bound on its counts, which it holds in 32 bits).
_NARROW_COUNTS = (1 << 32) - 1

#: ``projected_distinct`` expects at most this many times the distinct keys of the first batch.
PROJECTION_LIMIT = 16


def projected_distinct(at_half: int, distinct: int, batch: int, rows: int) -> int:
    """The distinct keys expected in ``rows`` rows, from the ``distinct`` keys of a first batch of ``batch`` rows
    (``at_half`` of them in its first half). Heaps' law: the distinct keys of ``n`` rows grow as ``n ** a``; the
    exponent ``a`` (in [0, 1]) is the one the two halves show, ``log2(distinct / at_half)``. At most ``rows``,
    and at most ``PROJECTION_LIMIT`` times ``distinct``."""
    if distinct == 0:
        return 0
    a = 1.0 if at_half == 0 else min(1.0, max(0.0, math.log2(distinct / at_half)))
    return int(min(distinct * (rows / batch) ** a, rows, PROJECTION_LIMIT * distinct))


# ---------------------------------------------------------------- lists


def first_x(offsets: np.ndarray, x: int) -> tuple[np.ndarray, np.ndarray]:
    """Keep the first ``x`` elements of each list: returns (element indices to keep, new offsets)."""
    return gather_ranges(offsets[:-1], np.minimum(np.diff(offsets), x))
