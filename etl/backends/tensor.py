"""The torch backend: an ``etl.backends.Backend`` with the functions of ``etl.backends.cpu`` (same arguments and
semantics, the same bits out) on torch tensors, on CPU or CUDA. Every tensor a function creates is on the device of its inputs.

Data representation:

- uint64 keys are **int64 tensors holding the same 64 bits** (key ``k`` ↔ the int64 two's complement of ``k``;
  torch has no usable uint64 arithmetic). Unsigned semantics are done honestly on int64: logical right shift is
  an arithmetic shift with the sign-extended bits masked off (``_lsr``); ``*`` on int64 wraps modulo 2**64 on CPU
  and CUDA, which is the uint64 product; the constants of ``etl.backends.hashing`` (and ``seed_word``) are passed
  as their signed int64 equivalents; ``reduce(h, n) = (lsr(h, 32) * n) >> 32`` stays below 2**63, so it is exact.
- valid masks: bool tensors, or None when nothing is missing.
- dense results: float64 tensors (any numeric input dtype). Ids: int32 or int64 tensors, the torch dtype of the
  numpy ``out_dtype`` argument.
- text: the same ``etl.batch.Strings`` dataclass holding tensors: ``data`` uint8, ``starts``/``ends`` int64.
- list offsets: int64 tensors.

Host values (fitted statistics, counted vocabularies, rendered text) are numpy, computed by ``etl.backends.cpu``
where the two backends must agree byte for byte. ``to_device``/``column_to``/``batch_to`` move host batches in.

Where the results differ from the CPU backend:

- ``log1p``: torch's and numpy's float64 log1p may differ in the last bit (see ``log1p``), and so may anything
  computed from its results (a ``Normalize`` fitted after ``Log1p``). Everything else is bit-identical, and fitted
  state is reduced on the host by the CPU code.
- ``is_keys`` is True for any int64 tensor: an undecoded int64 column looks like keys here.
- the key of a malformed text value (one that ``decode_*`` marks bad) is unspecified, as it is on the CPU.

Loops run over byte positions (at most 16, 19 or the longest string) or over the columns of a cross, never over
rows. Host synchronisation happens only where a function returns a host value or an error mask, or needs a
data-dependent size (``first_x``, ``take`` on text, ``decode_string``'s longest string, ``KeyCounter``);
``first_nonfinite`` does not inside ``deferred_nonfinite`` (the device path's non-finite checks).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import operator
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import overload

import numpy as np
import torch

from etl.backends import cpu
from etl.backends.dates import DEFAULTS, MAX_SECONDS, MIN_SECONDS, SECONDS_PER_DAY, DateFormat
from etl.backends.hashing import C1, C2, FNV_OFFSET, FNV_PRIME, check_buckets, seed_word
from etl.batch import Batch, Column, Strings
from etl.ids import FIRST, MISSING

_I64_MIN = -(1 << 63)
_MAX_HEX_DIGITS = 16
_MAX_DEC_DIGITS = 20
_LOW_MAX = 2**64 - 1 - 10**19  # the last 19 digits of 2**64 - 1
#: a ``KeyCounter`` compacts once its pending parts hold more than 2 × max(distinct keys, this) keys
COMPACT_MIN = 1 << 16


def _s64(x: int) -> int:
    """The int64 holding the same 64 bits as the uint64 ``x``."""
    return x - (1 << 64) if x >= 1 << 63 else x


_C1 = _s64(C1)
_C2 = _s64(C2)
_FNV_OFFSET = _s64(FNV_OFFSET)
_FNV_PRIME = _s64(FNV_PRIME)


def _lsr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of the uint64 words held in int64 ``x`` by ``s`` (1 .. 63) bits (a new tensor)."""
    if not 1 <= s <= 63:
        raise ValueError(f"shift must be 1 .. 63, got {s}")
    out = x >> s
    out &= (1 << (64 - s)) - 1
    return out


def _fmix64_(k: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's fmix64 on uint64 words held in int64, **in place** on ``k`` (which must be a fresh tensor)."""
    k ^= _lsr(k, 33)
    k *= _C1
    k ^= _lsr(k, 33)
    k *= _C2
    k ^= _lsr(k, 33)
    return k


def _reduce(h: torch.Tensor, n: int) -> torch.Tensor:
    """``((h >> 32) * n) >> 32`` on uint64 words held in int64: int64 in [0, n) (the product is below 2**63)."""
    out = _lsr(h, 32)
    out *= n
    out >>= 32
    return out


def _hash64(keys: torch.Tensor, seed: int) -> torch.Tensor:
    """``hash64(key, seed) = fmix64(key XOR seed_word(seed))`` (a new tensor)."""
    return _fmix64_(keys ^ _s64(seed_word(seed)))


def _resident(t: torch.Tensor) -> torch.Tensor:
    """``t``, a constant just copied to its device to be kept there (tables, digit weights): on CUDA, wait once for
    the copy, so that the constant can then be read from any stream without ordering it after the copy."""
    if t.is_cuda:
        torch.cuda.current_stream(t.device).synchronize()
    return t


def _torch_dtype(out_dtype: object) -> torch.dtype:
    """torch.int32 / torch.int64 for the numpy (or torch) id dtype ``out_dtype``."""
    if isinstance(out_dtype, torch.dtype):
        if out_dtype in (torch.int32, torch.int64):
            return out_dtype
    elif np.dtype(out_dtype) in (np.int32, np.int64):  # type: ignore[call-overload]  # any numpy dtype-like
        return torch.int32 if np.dtype(out_dtype) == np.int32 else torch.int64  # type: ignore[call-overload]
    raise ValueError(f"id dtype must be int32 or int64, got {out_dtype}")


def _ids(ids: torch.Tensor, valid: torch.Tensor | None, out_dtype: object) -> torch.Tensor:
    """``ids`` (int64, modified in place) with missing rows set to 1, as ``out_dtype``."""
    if valid is not None:
        ids.masked_fill_(~valid, MISSING)
    return ids.to(_torch_dtype(out_dtype))


# ---------------------------------------------------------------- dense


def fill_null(values: torch.Tensor, valid: torch.Tensor | None, value: float) -> torch.Tensor:
    """float64 copy of ``values`` with missing entries replaced by ``value``."""
    if valid is None:
        return values.to(torch.float64, copy=True)
    return torch.where(valid, values.to(torch.float64), float(value))


def clamp(values: torch.Tensor, lo: float | None, hi: float | None) -> torch.Tensor:
    """float64 values limited to [lo, hi] (a bound of None is open); NaN stays NaN.

    Signed zeros follow numpy's ``np.clip`` exactly: with one bound, a value equal to the bound becomes the bound
    (``np.maximum``/``np.minimum``: clip(-0.0, min=0.0) is +0.0); with both bounds, a value equal to a bound is
    kept as it is. ``torch.clamp`` keeps the value in both cases, hence the explicit comparisons."""
    v = values.to(torch.float64)
    if lo is not None and hi is not None:
        v = torch.where(v < lo, float(lo), v)
        return torch.where(v > hi, float(hi), v)
    if lo is not None:
        return torch.where(v <= lo, float(lo), v)
    if hi is not None:
        return torch.where(v >= hi, float(hi), v)
    return v.clone()


def log1p(values: torch.Tensor) -> torch.Tensor:
    """float64 ln(1 + x).

    Not always the same bits as the CPU backend: ``torch.log1p`` (SLEEF on CPU, CUDA's own on GPU) and
    ``np.log1p`` (SVML on AVX-512 machines, else the C library; so numpy's bits differ between machines too) are
    each accurate to about 1 ulp and differ in the last float64 bit for about 1% of inputs (measured on CPU
    tensors: never by more than 1 ulp). Rounded to float32, as the pipeline outputs them, they agree within 1 ulp
    (measured: identical on 3 million inputs). Exact at 0, -1 (-inf), inf and NaN."""
    return torch.log1p(values.to(torch.float64))


def normalize(values: torch.Tensor, mean: float, std: float) -> torch.Tensor:
    """float64 (x - mean) / std."""
    out = values.to(torch.float64) - float(mean)
    out /= float(std)
    return out


def moments(values: torch.Tensor, valid: torch.Tensor | None) -> tuple[int, float, float] | None:
    """(count, sum, sum of squared deviations from their mean) of the present values in float64, or None when no
    value is present. Computed on the host by ``etl.backends.cpu.moments`` (the values are copied there), so that
    fitted statistics, and the artifacts made from them, are the same bytes whatever the backend."""
    return cpu.moments(to_numpy(values), to_numpy(valid))


def magnitudes(values: torch.Tensor, valid: torch.Tensor | None) -> tuple[np.ndarray, float, float] | None:
    """The present values counted by sign and binary exponent, with their min and max (``etl.backends.cpu.magnitudes``,
    computed on the host like ``moments``)."""
    return cpu.magnitudes(to_numpy(values), to_numpy(valid))


@functools.lru_cache(maxsize=256)
def _float_tensor(raw: bytes, device: torch.device) -> torch.Tensor:
    """float64 tensor on ``device`` of the bytes ``raw`` (small constants, copied to the device once)."""
    return _resident(torch.from_numpy(np.frombuffer(raw, np.float64).copy()).to(device))


def bucketize(values: torch.Tensor, valid: torch.Tensor | None, boundaries: np.ndarray, out_dtype: object) -> torch.Tensor:
    """id = 2 + number of ``boundaries`` (sorted float64) <= value (right-closed buckets, as
    ``np.searchsorted(side="right")``; NaN is above every boundary); missing → 1."""
    b = _float_tensor(np.ascontiguousarray(boundaries, np.float64).tobytes(), values.device)
    ids = torch.searchsorted(b, values.to(torch.float64).contiguous(), right=True)
    ids += FIRST
    return _ids(ids, valid, out_dtype)


def nonfinite_mask(values: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor | None:
    """Rows whose present value is NaN or ±inf, or None when there are none (synchronises: it is an error check)."""
    if not isinstance(values, torch.Tensor) or not values.is_floating_point():
        return None
    bad = ~torch.isfinite(values)
    if valid is not None:
        bad &= valid
    return bad if bool(bad.any()) else None


def as_float32(values: torch.Tensor) -> torch.Tensor:
    """Float values rounded to float32 as the output holds them (beyond ±float32 max: ±inf); other values as
    they are."""
    if not isinstance(values, torch.Tensor) or not values.is_floating_point():
        return values
    return values.to(torch.float32)


#: the functions of ``elementwise`` on tensors (the arithmetic operators take a number on either side)
_ELEMENTWISE: dict[str, Callable[..., torch.Tensor]] = {
    "float64": lambda a: a.to(torch.float64, copy=True), "add": operator.add, "sub": operator.sub, "mul": operator.mul,
    "div": operator.truediv, "neg": operator.neg, "abs": torch.abs, "sqrt": torch.sqrt, "log1p": torch.log1p,
    "lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge, "eq": operator.eq, "ne": operator.ne,
    "isnan": torch.isnan, "and": torch.logical_and, "or": torch.logical_or, "not": torch.logical_not,
}  # fmt: skip


def elementwise(fn: str, *args: torch.Tensor | float) -> torch.Tensor:
    """``etl.backends.cpu.elementwise`` on tensors: the same bits (IEEE 754 float64 arithmetic and square root),
    but for ``log1p`` (see ``log1p``)."""
    if fn == "where":  # a number as a float64 tensor: torch.where would make float32 of two numbers
        cond, a, b = (x if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=torch.float64) for x in args)
        return torch.where(cond, a.to(cond.device), b.to(cond.device))
    return _ELEMENTWISE[fn](*args)


def first_nonfinite(columns: list[tuple[torch.Tensor, torch.Tensor | None]]) -> tuple[int, torch.Tensor] | None:
    """The first of ``columns`` (values, valid) holding a present NaN or ±inf, as (its index, its
    ``nonfinite_mask``), or None: one host synchronisation for all of them (aligned columns are checked as one
    stacked tensor).

    Inside ``deferred_nonfinite`` it does not synchronise: it records on the device whether any column holds
    such a value (``DeferredNonfinite.flag``) and returns None."""
    floats = [(i, v, m) for i, (v, m) in enumerate(columns) if isinstance(v, torch.Tensor) and v.is_floating_point()]
    if not floats:
        return None
    values = [v for _, v, _ in floats]
    if len(values) > 1 and _aligned(values):
        stacked = torch.stack(values)
        bad = ~torch.isfinite(stacked)
        valid = _stacked_valid([m for _, _, m in floats], stacked)
        if valid is not None:
            bad &= valid
        per_column = bad.any(dim=1)
        masks = list(bad.unbind(0))
    else:
        masks = [~torch.isfinite(v) if m is None else ~torch.isfinite(v) & m for _, v, m in floats]
        per_column = torch.stack([b.any() for b in masks])
    deferred = _deferred.get()
    if deferred is not None:
        deferred.flag |= per_column.any().to(deferred.flag.device)
        return None
    for (i, _, _), flag, mask in zip(floats, per_column.tolist(), masks):
        if flag:
            return i, mask
    return None


class DeferredNonfinite:
    """What ``deferred_nonfinite`` yields: ``flag``, a bool tensor of one element on the device, set once a
    ``first_nonfinite`` call inside the block saw a present NaN or ±inf."""

    def __init__(self, device: torch.device):
        self.flag = torch.zeros(1, dtype=torch.bool, device=device)


_deferred: contextvars.ContextVar[DeferredNonfinite | None] = contextvars.ContextVar("deferred_nonfinite", default=None)


@contextlib.contextmanager
def deferred_nonfinite(device: torch.device) -> Iterator[DeferredNonfinite]:
    """Within the block (in this thread), ``first_nonfinite`` queues its check on the device without waiting for
    it: the result is the yielded flag, which the caller examines later (and, when it is set, runs the checks
    again outside the block to find the row). Ops then go on with the values they would have refused."""
    deferred = DeferredNonfinite(device)
    token = _deferred.set(deferred)
    try:
        yield deferred
    finally:
        _deferred.reset(token)


# ---------------------------------------------------------------- host data


@overload
def to_numpy(x: torch.Tensor | np.ndarray) -> np.ndarray: ...
@overload
def to_numpy(x: Strings) -> Strings: ...
@overload
def to_numpy(x: None) -> None: ...
def to_numpy(x: torch.Tensor | Strings | np.ndarray | None) -> np.ndarray | Strings | None:
    """The tensor (or tensor strings) as numpy on the host, dtype kept (int64 keys stay int64: view them as
    uint64); numpy input and None pass through."""
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    if isinstance(x, Strings) and isinstance(x.data, torch.Tensor):
        return Strings(to_numpy(x.data), to_numpy(x.starts), to_numpy(x.ends))
    return x


def from_host(values: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """The host array as a tensor on the device of ``like`` (uint64 as int64 bits, as ``to_device``)."""
    return to_device(values, like.device)


class ValueTable:
    """A constant host table of values, copied once to each device that reads it, gathered by index."""

    def __init__(self, values: np.ndarray):
        self.values = values
        self._on: dict[torch.device, torch.Tensor] = {}

    def take(self, idx: torch.Tensor) -> torch.Tensor:
        """``values[idx]`` on the device of ``idx``."""
        table = self._on.get(idx.device)
        if table is None:
            table = self._on[idx.device] = _resident(to_device(self.values, idx.device))
        return table[idx]


def is_keys(values: torch.Tensor | Strings) -> bool:
    """Whether ``values`` are keys (an int64 tensor) rather than text. Raw int64 values look the same here (keys
    are their own bits), so unlike the CPU backend this cannot tell an undecoded int column from keys."""
    return isinstance(values, torch.Tensor) and values.dtype == torch.int64


def gather_ranges(starts: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions ``starts[i] .. starts[i] + lengths[i] - 1`` for every i, concatenated (int64), and the offsets of
    each range within that concatenation (int64, length n + 1), as ``etl.batch.gather_ranges``. Synchronises
    once, for the total length."""
    starts, lengths = starts.to(torch.int64), lengths.to(torch.int64)
    offsets = torch.zeros(len(starts) + 1, dtype=torch.int64, device=starts.device)
    torch.cumsum(lengths, 0, out=offsets[1:])
    total = int(offsets[-1])
    positions = torch.repeat_interleave(starts - offsets[:-1], lengths, output_size=total)
    positions += torch.arange(total, dtype=torch.int64, device=starts.device)
    return positions, offsets


def _take_strings(s: Strings, idx: torch.Tensor) -> Strings:
    starts = s.starts[idx]
    positions, offsets = gather_ranges(starts, s.ends[idx] - starts)
    return Strings(s.data[positions], offsets[:-1], offsets[1:])


def take(values: torch.Tensor | Strings, idx: torch.Tensor) -> torch.Tensor | Strings:
    """``values[idx]``; for text, the strings at positions ``idx`` compacted into a new buffer (``Strings.take``)."""
    return _take_strings(values, idx) if isinstance(values, Strings) else values[idx]


# ---------------------------------------------------------------- moving batches to a device


def _quiet_read_only_warning() -> None:
    """Arrow buffers are read-only numpy arrays; torch wraps them without a copy but warns once per process that
    writing to them is undefined. This backend never writes into its inputs, so the one warning is spent here."""
    a = np.zeros(1, np.uint8)
    a.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        torch.from_numpy(a)


_quiet_read_only_warning()


@overload
def to_device(x: np.ndarray | torch.Tensor, device: torch.device | str, *, staged: bool = False) -> torch.Tensor: ...
@overload
def to_device(x: Strings, device: torch.device | str, *, staged: bool = False) -> Strings: ...
@overload
def to_device(x: None, device: torch.device | str, *, staged: bool = False) -> None: ...
def to_device(x: np.ndarray | Strings | torch.Tensor | None, device: torch.device | str, *, staged: bool = False) -> torch.Tensor | Strings | None:
    """A numpy array (uint64 viewed as int64 first) or numpy ``Strings`` (offsets made int64) as tensors on
    ``device``; zero copy on CPU where the dtype allows. Tensors are moved; None stays None.

    ``staged``: to a CUDA device, copy numpy data into pinned host memory first and queue the host→device copy on
    the current stream without waiting for it (the pinned block is not reused before the copy is done)."""
    if x is None:
        return None
    if isinstance(x, Strings):
        return Strings(
            to_device(x.data, device, staged=staged),
            to_device(x.starts, device, staged=staged).to(torch.int64),
            to_device(x.ends, device, staged=staged).to(torch.int64),
        )
    if isinstance(x, torch.Tensor):
        return x.to(device)
    a = np.asarray(x)
    if a.dtype == np.uint64:
        a = a.view(np.int64)
    if any(st < 0 for st in a.strides):
        a = a.copy()
    host = torch.from_numpy(a)
    if staged and torch.device(device).type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


def column_to(col: Column, device: torch.device | str, *, staged: bool = False) -> Column:
    """The column with every field (values, valid, offsets, raw) on ``device`` (``staged``: see ``to_device``)."""
    return Column(to_device(col.values, device, staged=staged), to_device(col.valid, device, staged=staged),
                  to_device(col.offsets, device, staged=staged), to_device(col.raw, device, staged=staged))


def batch_to(batch: Batch, device: torch.device | str) -> Batch:
    """The batch with every column on ``device``; source, row group and row ids (numpy) are kept."""
    return replace(batch, columns={k: column_to(c, device) for k, c in batch.columns.items()})


# ---------------------------------------------------------------- decode


@functools.cache
def _digits(base: int, device: torch.device) -> torch.Tensor:
    """Byte → digit value in ``base`` (10 or 16; hex in either case), 0xFF for other bytes: int64 on ``device``."""
    lut = [0xFF] * 256
    for i, c in enumerate(b"0123456789abcdef"[:base]):
        lut[c] = i
    for i, c in enumerate(b"ABCDEF"[: base - 10]):
        lut[c] = 10 + i
    return _resident(torch.tensor(lut, dtype=torch.int64, device=device))


@functools.cache
def _weights(base: int, columns: int, device: torch.device) -> torch.Tensor:
    """``base ** (columns - 1 - j)`` for j < columns, as int64 bits (wrapped modulo 2**64: 10**19 does not fit in
    an int64): the weights of a right-aligned digit matrix."""
    weights = [(base ** (columns - 1 - j) + 2**63) % 2**64 - 2**63 for j in range(columns)]
    return _resident(torch.tensor(weights, dtype=torch.int64, device=device))


def _bounds(s: Strings) -> tuple[torch.Tensor, torch.Tensor]:
    return s.starts.to(torch.int64), s.ends.to(torch.int64)


def _byte_matrix(data: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``data[positions]`` as int64 with positions clamped into the buffer (callers mask what lies outside their
    strings); zeros when the buffer is empty."""
    if not len(data):
        return torch.zeros(positions.shape, dtype=torch.int64, device=positions.device)
    return data[positions.clamp(0, len(data) - 1)].to(torch.int64)


def _bad_or_none(bad: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor | None:
    if valid is not None:
        bad &= valid
    return bad if bool(bad.any()) else None


def _right_aligned_digits(s: Strings, ends: torch.Tensor, ndigits: torch.Tensor, base: int, columns: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The last ``ndigits[i]`` bytes of string i as digit values, right-aligned in an int64 [n, columns] matrix
    (column j has weight ``base ** (columns - 1 - j)``; 0 left of the digits), and which rows hold a byte that is
    not a digit among them."""
    j = torch.arange(columns, dtype=torch.int64, device=ends.device)
    inside = j >= (columns - ndigits)[:, None]
    digits = _digits(base, ends.device)[_byte_matrix(s.data, (ends - columns)[:, None] + j)]
    digits.masked_fill_(~inside, 0)
    return digits, (digits >= base).any(1)


def decode_hex(s: Strings, valid: torch.Tensor | None, width: int | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Hex text (1-16 digits of either case; exactly ``width`` when width is given) → int64 keys. Returns
    (keys, bad) where bad marks malformed present values (None if none); a malformed value's key is unspecified.
    Missing → key 0, never bad."""
    starts, ends = _bounds(s)
    w = width or 0
    columns = w if 0 < w <= _MAX_HEX_DIGITS else _MAX_HEX_DIGITS
    lens = ends - starts
    ok = (lens >= 1) & (lens <= _MAX_HEX_DIGITS)
    if w:
        ok &= lens == w
    digits, nondigit = _right_aligned_digits(s, ends, lens, 16, columns)
    digits *= _weights(16, columns, starts.device)  # 15 * 16**15 wraps to the right bits: the terms are disjoint
    keys = digits.sum(1)  # ... so their sum is their OR
    bad = nondigit | ~ok
    if valid is not None:
        keys.masked_fill_(~valid, 0)
    return keys, _bad_or_none(bad, valid)


def decode_int_text(s: Strings, valid: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Decimal integer text (optional sign, 1-20 digits, a value in [-2**63, 2**64 - 1]) → the value's uint64 word
    as int64 bits (a negative value: its two's complement). Anything else is marked bad (bad is None when nothing
    is); a malformed value's key is unspecified. Missing → 0, never bad."""
    starts, ends = _bounds(s)
    lens = ends - starts
    first = _byte_matrix(s.data, starts)
    signed = (lens > 0) & ((first == 45) | (first == 43))
    neg = signed & (first == 45)
    nd = lens - signed.to(torch.int64)
    ok = (nd >= 1) & (nd <= _MAX_DEC_DIGITS)
    digits, nondigit = _right_aligned_digits(s, ends, nd, 10, _MAX_DEC_DIGITS)
    lead = digits[:, 0].clone()  # the 20th digit from the right
    digits *= _weights(10, _MAX_DEC_DIGITS, starts.device)
    low = digits[:, 1:].sum(1)  # the last 19 digits: below 10**19 < 2**64, exact as uint64 bits
    mag = digits.sum(1)  # exact modulo 2**64 (10**19 as wrapped bits)
    # beyond 2**64 - 1 = 1 * 10**19 + _LOW_MAX: a 20th digit above 1, or 1 and the rest above _LOW_MAX (< 2**63,
    # so the unsigned comparison is the signed one when low >= 0; low < 0 is above it)
    over = (lead > 1) | ((lead == 1) & ((low < 0) | (low > _LOW_MAX)))
    # a negative value's magnitude is at most 2**63: as int64 bits, >= 0 or int64 min
    out_of_range = over | (neg & (mag < 0) & (mag != _I64_MIN))
    bad = ~ok | nondigit | out_of_range
    keys = torch.where(neg, -mag, mag)  # -(int64 min) wraps to itself: the bits of -2**63
    if valid is not None:
        keys.masked_fill_(~valid, 0)
    return keys, _bad_or_none(bad, valid)


def decode_string(s: Strings, valid: torch.Tensor | None) -> torch.Tensor:
    """Any text → ``string_key`` = fmix64(FNV-1a-64(bytes)) as int64. Missing → 0.

    One step per byte position up to the longest present string; the rows are ordered by length (longest
    first) so that step j touches only the strings longer than j (work proportional to the bytes)."""
    starts, ends = _bounds(s)
    n = len(starts)
    lens = ends - starts
    if valid is not None:
        lens = lens.masked_fill(~valid, 0)
    if not n:
        return torch.zeros(0, dtype=torch.int64, device=starts.device)
    order = torch.argsort(lens, descending=True)
    sorted_starts = starts[order]
    # active[j] = number of strings longer than j, for j < the longest length (one host sync)
    active = (n - torch.cumsum(torch.bincount(lens), 0))[:-1].tolist()
    h = torch.full((n,), _FNV_OFFSET, dtype=torch.int64, device=starts.device)
    for j, m in enumerate(active):
        hj = h[:m]
        hj ^= s.data[sorted_starts[:m] + j]
        hj *= _FNV_PRIME
    keys = torch.empty_like(h)
    keys[order] = _fmix64_(h)
    if valid is not None:
        keys.masked_fill_(~valid, 0)
    return keys


def decode_int(values: torch.Tensor) -> torch.Tensor:
    """Integer values → int64 keys: the same bits (no copy when already int64)."""
    return values.to(torch.int64)


def encode_hex(keys: torch.Tensor | np.ndarray, valid: torch.Tensor | np.ndarray | None, width: int) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of ``decode_hex`` on the host: exactly ``width`` lowercase hex digits per present key (the low
    ``4 * width`` bits); missing keys take no bytes. Returns numpy Arrow string buffers (int32 offsets, bytes),
    made by ``etl.backends.cpu.encode_hex``."""
    return cpu.encode_hex(np.asarray(to_numpy(keys)).view(np.uint64), to_numpy(valid), width)


# ---------------------------------------------------------------- dates (see etl.backends.dates)


def _floordiv(x: torch.Tensor, d: int) -> torch.Tensor:
    return torch.div(x, d, rounding_mode="floor")


def _days_from_civil(y: torch.Tensor, m: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """Day numbers (days since 1970-01-01) of proleptic Gregorian dates (Hinnant), int64."""
    y = y - (m <= 2).to(torch.int64)
    era = _floordiv(y, 400)
    yoe = y - era * 400
    doy = _floordiv(153 * torch.where(m > 2, m - 3, m + 9) + 2, 5) + d - 1
    doe = yoe * 365 + _floordiv(yoe, 4) - _floordiv(yoe, 100) + doy
    return era * 146097 + doe - 719468


def _civil_from_days(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(year, month, day) of day numbers ``z`` (Hinnant), int64."""
    z = z + 719468
    era = _floordiv(z, 146097)
    doe = z - era * 146097
    yoe = _floordiv(doe - _floordiv(doe, 1460) + _floordiv(doe, 36524) - _floordiv(doe, 146096), 365)
    doy = doe - (365 * yoe + _floordiv(yoe, 4) - _floordiv(yoe, 100))
    mp = _floordiv(5 * doy + 2, 153)
    d = doy - _floordiv(153 * mp + 2, 5) + 1
    m = torch.where(mp < 10, mp + 3, mp - 9)
    return yoe + era * 400 + (m <= 2).to(torch.int64), m, d


def _month_days(y: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    leap = ((y % 4 == 0) & ((y % 100 != 0) | (y % 400 == 0))).to(torch.int64)
    short = (m == 4) | (m == 6) | (m == 9) | (m == 11)
    return torch.where(m == 2, 28 + leap, torch.where(short, 30, 31))


def _parts_of_fields(f: list[torch.Tensor], short_year: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Parts [len(PARTS), n] of the fields ``f`` (year, month, day, hour, minute, second), and which rows are
    not a date."""
    y, m, d, hour, minute, second = f
    if short_year:
        y = y + torch.where(y < 69, 2000, 1900)
    ok = (y >= 1) & (y <= 9999) & (m >= 1) & (m <= 12) & (d >= 1) & (hour <= 23) & (minute <= 59) & (second <= 59)
    ok &= d <= _month_days(y, m)
    weekday = (_days_from_civil(y, m.clamp(1, 12), d) + 3) % 7
    return torch.stack([y, m, d, hour, minute, weekday]), ~ok


@functools.lru_cache(maxsize=64)
def _template(template: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """A format's template as an int64 tensor on ``device`` (copied there once)."""
    return _resident(torch.tensor(template, dtype=torch.int64, device=device))


def _fields_of_text(s: Strings, fmt: DateFormat) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The fields of text in ``fmt`` (int64 each), and which rows do not match its template."""
    starts, ends = _bounds(s)
    template = _template(fmt.template, starts.device)
    chars = _byte_matrix(s.data, starts[:, None] + torch.arange(fmt.length, dtype=torch.int64, device=starts.device))
    digit = (chars >= 48) & (chars <= 57)
    bad = ~torch.where(template >= 0, chars == template, digit).all(1) | (ends - starts != fmt.length)
    digits = chars - 48
    fields = []
    for start, width, default in zip(fmt.starts, fmt.widths, DEFAULTS):
        v = torch.full_like(starts, default if not width else 0)
        for j in range(start, start + width):
            v = v * 10 + digits[:, j]
        fields.append(v)
    return fields, bad


def _fields_of_ints(values: torch.Tensor, fmt: DateFormat) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The fields of integers read as ``fmt.length`` zero-padded digits, and which rows are out of range."""
    v = values.to(torch.int64)
    bad = (v < 0) | (v >= 10**fmt.length)
    fields = []
    for start, width, default in zip(fmt.starts, fmt.widths, DEFAULTS):
        fields.append((_floordiv(v, 10 ** (fmt.length - start - width)) % 10**width) if width else torch.full_like(v, default))
    return fields, bad


def _parts_of_seconds(seconds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Parts [len(PARTS), n] of Unix seconds, and which rows are beyond years 1-9999."""
    t = seconds.to(torch.int64)
    bad = (t < MIN_SECONDS) | (t > MAX_SECONDS)
    z = _floordiv(t, SECONDS_PER_DAY)
    r = t - z * SECONDS_PER_DAY
    y, m, d = _civil_from_days(z)
    return torch.stack([y, m, d, _floordiv(r, 3600), _floordiv(r, 60) % 60, (z + 3) % 7]), bad


def date_parts(values: torch.Tensor | Strings, valid: torch.Tensor | None, fmt: DateFormat) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The parts of each present value read with ``fmt``: int64 [len(PARTS), n] (row j: ``PARTS[j]``; 0 under
    missing values and values that are not a date), and bad: the present values that are not a date in ``fmt``
    (None when there are none; synchronises: it is an error check). ``values``: text, or integers."""
    if fmt.unix:
        text_bad = None
        if isinstance(values, Strings):
            values, text_bad = decode_int_text(values, valid)
        parts, bad = _parts_of_seconds(values)
        if text_bad is not None:
            bad |= text_bad
    else:
        fields, bad = _fields_of_text(values, fmt) if isinstance(values, Strings) else _fields_of_ints(values, fmt)
        parts, not_date = _parts_of_fields(fields, fmt.short_year)
        bad |= not_date
    zero = bad if valid is None else bad | ~valid
    parts.masked_fill_(zero, 0)
    return parts, _bad_or_none(bad, valid)


# ---------------------------------------------------------------- hash and cross


def hash_ids(keys: torch.Tensor, valid: torch.Tensor | None, seed: int, n: int, out_dtype: object) -> torch.Tensor:
    """id = 2 + reduce(hash64(key, seed), n); missing → 1."""
    check_buckets(n)
    ids = _reduce(_hash64(keys, seed), n)
    ids += FIRST
    return _ids(ids, valid, out_dtype)


def _aligned(arrays: list[torch.Tensor]) -> bool:
    """Whether ``arrays`` can be stacked into one [columns, n] tensor (same length, dtype and device)."""
    first = arrays[0]
    return all(a.shape == first.shape and a.dtype == first.dtype and a.device == first.device and a.ndim == 1 for a in arrays)


def _stacked_valid(valids: list[torch.Tensor | None], like: torch.Tensor) -> torch.Tensor | None:
    """The masks of stacked columns as one [columns, n] bool tensor (all present where a mask is None)."""
    if all(v is None for v in valids):
        return None
    return torch.stack([torch.ones(like.shape[1], dtype=torch.bool, device=like.device) if v is None else v for v in valids])


def hash_columns(keys: list[torch.Tensor], valids: list[torch.Tensor | None], seed: int, n: int, out_dtype: object) -> list[torch.Tensor]:
    """``hash_ids`` of several columns. Aligned columns are hashed as one [columns, n] tensor: one set of kernel
    launches for all of them instead of one per column."""
    check_buckets(n)
    if len(keys) < 2 or not _aligned(keys):
        return [hash_ids(k, v, seed, n, out_dtype) for k, v in zip(keys, valids)]
    stacked = torch.stack(keys)
    ids = _reduce(_hash64(stacked, seed), n)
    ids += FIRST
    return list(_ids(ids, _stacked_valid(valids, stacked), out_dtype).unbind(0))


def bucket_ids(hashes: torch.Tensor, valid: torch.Tensor | None, n: int, out_dtype: object) -> torch.Tensor:
    """id = 2 + reduce(hash, n) for values that are already hashes; missing → 1."""
    check_buckets(n)
    ids = _reduce(hashes, n)
    ids += FIRST
    return _ids(ids, valid, out_dtype)


def cross_keys(keys: list[torch.Tensor], valids: list[torch.Tensor | None], seed: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``cross_key`` of aligned key columns (int64); a row is missing when any input is missing."""
    if not keys:
        raise ValueError("cross_keys needs at least one key column")
    sw = _s64(seed_word(seed))
    h = _fmix64_(keys[0] ^ sw)
    for k in keys[1:]:
        h ^= k
        h ^= sw
        _fmix64_(h)
    valid = None
    for v in valids:
        if v is not None:
            valid = v.clone() if valid is None else (valid & v)
    return h, valid


# ---------------------------------------------------------------- vocabulary lookup (sorted keys)


class LookupTable:
    """uint64 keys → int64 ids, as sorted keys searched with ``torch.searchsorted``. The sorted table is copied to
    each device the first time a lookup runs there. Should a key appear twice, its last id wins (as in the CPU
    table)."""

    def __init__(self, keys: np.ndarray, ids: np.ndarray):
        k = np.asarray(keys).astype(np.uint64, copy=False).view(np.int64)
        v = np.asarray(ids).astype(np.int64, copy=False)
        if k.shape != v.shape or k.ndim != 1:
            raise ValueError(f"LookupTable needs two aligned 1-d arrays, got shapes {k.shape} and {v.shape}")
        order = np.argsort(k, kind="stable")  # signed order: any consistent order serves for membership
        self._keys, self._ids = k[order], v[order]
        self._on: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def _table(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        t = self._on.get(device)
        if t is None:
            t = self._on[device] = (_resident(torch.from_numpy(self._keys).to(device)), _resident(torch.from_numpy(self._ids).to(device)))
        return t

    def lookup(self, keys: torch.Tensor, valid: torch.Tensor | None, oov_base: int, oov_n: int, seed: int, out_dtype: object) -> torch.Tensor:
        """ids of ``keys``; an absent key gets ``oov_base + reduce(hash64(key, seed), oov_n)``, missing → 1."""
        tkeys, tids = self._table(keys.device)
        ids = _reduce(_hash64(keys, seed), oov_n)
        ids += oov_base
        if len(tkeys):
            pos = torch.searchsorted(tkeys, keys.contiguous(), right=True)
            pos -= 1  # the last table entry <= key
            pos.clamp_(min=0)
            ids = torch.where(tkeys[pos] == keys, tids[pos], ids)
        return _ids(ids, valid, out_dtype)


#: columns whose tables are searched together are padded to the largest of them; a group is kept while its
#: padded size stays below twice its real size plus this many entries
_PAD_SLACK = 1 << 12
_PAD_KEY = torch.iinfo(torch.int64).max


class LookupTables:
    """The vocabularies of several columns, looked up together. Tables of similar sizes form groups; a group's
    sorted keys are padded into one [columns, longest] tensor and searched with one batched ``searchsorted``, so
    a lookup of all columns costs a few kernel launches per group rather than per column. Ids as
    ``LookupTable.lookup``."""

    def __init__(self, tables: list[tuple[np.ndarray, np.ndarray]]):
        self.tables = [LookupTable(k, v) for k, v in tables]
        self.groups = _size_groups([len(t._keys) for t in self.tables])
        self._on: dict[torch.device, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = {}

    def _padded(self, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Per group: sorted keys and ids [columns, longest] (keys padded with the largest int64) and the index
        of each column's last real entry [columns, 1] (-1 for an empty table)."""
        out = self._on.get(device)
        if out is None:
            out = []
            for group in self.groups:
                width = max(len(self.tables[i]._keys) for i in group)
                keys = np.full((len(group), width), _PAD_KEY, np.int64)
                ids = np.zeros((len(group), width), np.int64)
                last = np.empty((len(group), 1), np.int64)
                for r, i in enumerate(group):
                    t = self.tables[i]
                    keys[r, : len(t._keys)], ids[r, : len(t._ids)], last[r, 0] = t._keys, t._ids, len(t._keys) - 1
                out.append((_resident(torch.from_numpy(keys).to(device)), _resident(torch.from_numpy(ids).to(device)),
                            _resident(torch.from_numpy(last).to(device))))
            self._on[device] = out
        return out

    def lookup(
        self, keys: list[torch.Tensor], valids: list[torch.Tensor | None], oov_base: int, oov_n: int, seed: int, out_dtypes: Sequence[object]
    ) -> list[torch.Tensor]:
        """ids of each column's ``keys`` in its table (absent key: ``oov_base + reduce(hash64(key, seed), oov_n)``;
        missing: 1). Columns of unequal lengths (lists) are looked up one by one."""
        if not _aligned(keys):
            return [t.lookup(k, v, oov_base, oov_n, seed, dt) for t, k, v, dt in zip(self.tables, keys, valids, out_dtypes)]
        out: dict[int, torch.Tensor] = {}  # column → its ids; the groups cover every column
        for group, (tkeys, tids, last) in zip(self.groups, self._padded(keys[0].device)):
            stacked = torch.stack([keys[i] for i in group])
            ids = _reduce(_hash64(stacked, seed), oov_n)
            ids += oov_base
            if tkeys.shape[1]:
                pos = torch.searchsorted(tkeys, stacked, right=True)
                pos -= 1  # the last entry <= key; beyond a column's real entries only padding (larger keys)
                pos = torch.minimum(pos, last).clamp_(min=0)
                found = torch.gather(tkeys, 1, pos) == stacked
                found &= last >= 0
                ids = torch.where(found, torch.gather(tids, 1, pos), ids)
            valid = _stacked_valid([valids[i] for i in group], stacked)
            if valid is not None:
                ids.masked_fill_(~valid, MISSING)
            dtypes = {_torch_dtype(out_dtypes[i]) for i in group}
            rows = ids.to(dtypes.pop()).unbind(0) if len(dtypes) == 1 else [ids[r].to(_torch_dtype(out_dtypes[i])) for r, i in enumerate(group)]
            out.update(zip(group, rows))
        return [out[i] for i in range(len(keys))]


def _size_groups(sizes: list[int]) -> list[list[int]]:
    """Column indices grouped by table size (largest first): a group grows while padding every table to the
    group's largest keeps it under twice the real entries plus ``_PAD_SLACK``."""
    order = sorted(range(len(sizes)), key=lambda i: -sizes[i])
    groups: list[list[int]] = []
    for i in order:
        g = groups[-1] if groups else None
        if g is not None and (len(g) + 1) * sizes[g[0]] <= 2 * (sum(sizes[j] for j in g) + sizes[i]) + _PAD_SLACK:
            g.append(i)
        else:
            groups.append([i])
    return groups


# ---------------------------------------------------------------- counting (fit)


class KeyCounter:
    """Counts occurrences of keys (int64 tensors) in memory proportional to the number of distinct keys.

    Each ``add`` keeps the distinct keys of its batch with their counts (``torch.unique``); once the kept parts
    hold more than twice the distinct keys counted so far (and more than ``2 * COMPACT_MIN``), they are compacted
    into one part (unique + ``index_add_``). The counter lives on the device of the first keys it is given."""

    def __init__(self, rows: int | None = None) -> None:  # ``rows``: a sizing hint this counter does not need
        self._keys: list[torch.Tensor] = []
        self._counts: list[torch.Tensor] = []
        self._pending = 0
        self._distinct = 0

    def add(self, keys: torch.Tensor, valid: torch.Tensor | None) -> None:
        """Count each present key once."""
        if valid is not None:
            keys = keys[valid]
        if len(keys):
            self._push(*torch.unique(keys, return_counts=True))

    def at_least(self, threshold: int) -> tuple[np.ndarray, np.ndarray]:
        """Host numpy (uint64 keys, int64 counts) of the keys counted at least ``threshold`` times (and at least
        once), in no particular order."""
        self._compact()
        if not self._keys:
            return np.zeros(0, np.uint64), np.zeros(0, np.int64)
        keys, counts = self._keys[0], self._counts[0]
        keep = counts >= max(threshold, 1)
        return to_numpy(keys[keep]).view(np.uint64), to_numpy(counts[keep])

    def _push(self, keys: torch.Tensor, counts: torch.Tensor) -> None:
        if self._keys and keys.device != self._keys[0].device:
            keys, counts = keys.to(self._keys[0].device), counts.to(self._keys[0].device)
        self._keys.append(keys)
        self._counts.append(counts)
        self._pending += len(keys)
        if self._pending > 2 * max(self._distinct, COMPACT_MIN):
            self._compact()

    def _compact(self) -> None:
        if len(self._keys) > 1:
            uniq, inverse = torch.unique(torch.cat(self._keys), return_inverse=True)
            counts = torch.zeros(len(uniq), dtype=torch.int64, device=uniq.device)
            counts.index_add_(0, inverse, torch.cat(self._counts))
            self._keys, self._counts = [uniq], [counts]
        self._pending = self._distinct = len(self._keys[0]) if self._keys else 0


# ---------------------------------------------------------------- lists


def first_x(offsets: torch.Tensor, x: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the first ``x`` elements of each list: returns (element indices to keep, new offsets), both int64."""
    offsets = offsets.to(torch.int64)
    return gather_ranges(offsets[:-1], torch.clamp(offsets[1:] - offsets[:-1], max=x))
