"""etl.backends.tensor against etl.backends.cpu (bit for bit: keys compared as uint64 words, ids with their
dtype) and against the plain-Python formulas of etl.backends.hashing.

Every test runs on each device of ``DEVICES``: "cpu" always, "cuda" when torch sees a GPU, so the same file
checks a GPU machine. The one function that is not bit-identical is ``log1p`` (see ``test_log1p``)."""

from __future__ import annotations

import random
import threading
import warnings

import numpy as np
import pyarrow as pa
import pytest
import torch

from etl.backends import cpu, hashing
from etl.backends import tensor as tb
from etl.batch import Batch, Column, Strings
from etl.io.parquet import column_from_arrow
from etl.ops.categorical import Categorify, Decode, Hash, HashedCross
from etl.ops.dense import Bucketize, Clamp, FillMissing, Log1p, Normalize
from etl.ops.lists import FirstX
from etl.schema import ColumnSpec

M64 = 2**64
EDGE_KEYS = [0, 1, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**63 + 1, 2**64 - 2, 2**64 - 1]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def dev(request) -> str:
    return request.param


# ---------------------------------------------------------------- helpers


def T(x, dev):
    return tb.to_device(x, dev)


def N(x):
    return tb.to_numpy(x)


def assert_keys_equal(t: torch.Tensor, ref: np.ndarray) -> None:
    assert t.dtype == torch.int64
    np.testing.assert_array_equal(N(t).view(np.uint64), np.asarray(ref).view(np.uint64))


def assert_ids_equal(t: torch.Tensor, ref: np.ndarray) -> None:
    got = N(t)
    assert got.dtype == ref.dtype
    np.testing.assert_array_equal(got, ref)


def assert_same_bits(t: torch.Tensor, ref: np.ndarray) -> None:
    got = N(t)
    assert got.dtype == np.float64 and ref.dtype == np.float64
    np.testing.assert_array_equal(got.view(np.int64), ref.view(np.int64))


def assert_decoded_equal(keys: torch.Tensor, bad: torch.Tensor | None, ref_keys: np.ndarray, ref_bad: np.ndarray | None) -> None:
    """Same bad rows; the same keys on every other row (a malformed value's key is unspecified)."""
    assert_mask_equal(bad, ref_bad)
    ok = np.ones(len(ref_keys), bool) if ref_bad is None else ~ref_bad
    assert_keys_equal(keys[T(ok, keys.device)], ref_keys[ok])


def assert_mask_equal(t: torch.Tensor | None, ref: np.ndarray | None) -> None:
    if ref is None:
        assert t is None
    else:
        assert t is not None and t.dtype == torch.bool
        np.testing.assert_array_equal(N(t), ref)


def rand_keys(n: int, rng: np.random.Generator) -> np.ndarray:
    k = rng.integers(0, M64 - 1, size=n, dtype=np.uint64, endpoint=True)
    k[: min(n, len(EDGE_KEYS))] = EDGE_KEYS[: min(n, len(EDGE_KEYS))]
    return k


def rand_valid(n: int, rng: np.random.Generator, p: float = 0.2) -> np.ndarray:
    return rng.random(n) >= p


def layouts(items: list[str | None]) -> list[tuple[np.ndarray | None, Strings]]:
    """(valid, numpy Strings) of ``items`` (None = missing) in three layouts: int64 offsets; starts/ends with
    hex-digit junk between and around the strings, in shuffled buffer order, null rows pointing at junk; and Arrow
    string_view (through the readers; int32-offset string when a value is longer than 12 bytes)."""
    valid = None if all(s is not None for s in items) else np.array([s is not None for s in items])
    bs = [(s or "").encode() for s in items]
    offs = np.zeros(len(bs) + 1, np.int64)
    np.cumsum([len(b) for b in bs], out=offs[1:])
    flat = Strings.from_offsets(np.frombuffer(b"".join(bs), np.uint8) if offs[-1] else np.zeros(0, np.uint8), offs)

    rnd = random.Random(len(items))
    order = list(range(len(bs)))
    rnd.shuffle(order)
    buf, starts, ends = bytearray(b"7f"), [0] * len(bs), [0] * len(bs)
    for i in order:
        b = bs[i] if items[i] is not None else b"zz9"
        starts[i] = len(buf)
        buf += b
        ends[i] = len(buf)
        buf += b"0aF"[: rnd.randrange(4)]
    buf += b"12"
    gapped = Strings(np.frombuffer(bytes(buf), np.uint8), np.array(starts, np.int64), np.array(ends, np.int64))

    col = column_from_arrow(pa.array(items, pa.string_view()), ColumnSpec("c", "categorical", "string", "string"))
    return [(valid, flat), (valid, gapped), (col.valid, col.values)]


# ---------------------------------------------------------------- uint64 arithmetic on int64


def test_word_arithmetic_matches_python_reference(dev):
    """Logical shifts, wrapping products, fmix64, reduce, hash64 and cross_key on int64 tensors give the same
    64-bit words as hashing.py's Python integers."""
    rng = np.random.default_rng(1)
    keys = [int(k) for k in rand_keys(200, rng)] + EDGE_KEYS
    t = T(np.array(keys, np.uint64), dev)

    def words(x):
        return [int(v) for v in N(x).view(np.uint64)]

    for s in range(1, 64):
        assert words(tb._lsr(t, s)) == [k >> s for k in keys]
    for c in (hashing.C1, hashing.C2, hashing.FNV_PRIME, hashing.GOLDEN, 2**63, 2**64 - 1, 3):
        assert words(t * tb._s64(c)) == [(k * c) % M64 for k in keys]
    assert words(tb._fmix64_(t.clone())) == [hashing.fmix64(k) for k in keys]
    for seed in (0, 1, 12345):
        h = tb._hash64(t, seed)
        assert words(h) == [hashing.hash64(k, seed) for k in keys]
        for n in (1, 2, 3, 1000, 2**31 - 1, 2**31):
            r = tb._reduce(h, n)
            assert N(r).tolist() == [hashing.reduce(hashing.hash64(k, seed), n) for k in keys]
    k2 = T(np.array(keys[::-1], np.uint64), dev)
    k3 = T(np.array(keys[3:] + keys[:3], np.uint64), dev)
    h, valid = tb.cross_keys([t, k2, k3], [None, None, None], 7)
    assert valid is None
    assert words(h) == [hashing.cross_key([a, b, c], 7) for a, b, c in zip(keys, keys[::-1], keys[3:] + keys[:3])]
    with pytest.raises(ValueError):
        tb._lsr(t, 0)


# ---------------------------------------------------------------- hash and cross


@pytest.mark.parametrize("n", [1, 10, 1000, 2**31])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_hash_ids_and_bucket_ids(dev, n, dtype):
    rng = np.random.default_rng(n)
    keys = rand_keys(3000, rng)
    for valid in (None, rand_valid(len(keys), rng)):
        for seed in (0, 42):
            got = tb.hash_ids(T(keys, dev), T(valid, dev), seed, n, dtype)
            assert_ids_equal(got, cpu.hash_ids(keys, valid, seed, n, dtype))
        assert_ids_equal(tb.bucket_ids(T(keys, dev), T(valid, dev), n, dtype), cpu.bucket_ids(keys, valid, n, dtype))
    ref = np.array([2 + hashing.reduce(hashing.hash64(k, 3), n) for k in EDGE_KEYS])
    np.testing.assert_array_equal(N(tb.hash_ids(T(np.array(EDGE_KEYS, np.uint64), dev), None, 3, n, dtype)), ref)
    empty = np.zeros(0, np.uint64)
    assert_ids_equal(tb.hash_ids(T(empty, dev), None, 0, n, dtype), cpu.hash_ids(empty, None, 0, n, dtype))


def test_hash_ids_checks_buckets_and_dtype(dev):
    k = T(np.arange(3, dtype=np.uint64), dev)
    for bad in (0, 2**31 + 1):
        with pytest.raises(ValueError):
            tb.hash_ids(k, None, 0, bad, np.int64)
        with pytest.raises(ValueError):
            tb.bucket_ids(k, None, bad, np.int64)
    with pytest.raises(ValueError):
        tb.hash_ids(k, None, 0, 10, np.float32)
    assert tb.hash_ids(k, None, 0, 10, torch.int32).dtype == torch.int32


def test_cross_keys(dev):
    rng = np.random.default_rng(5)
    n = 2000
    cols = [rand_keys(n, rng) for _ in range(4)]
    valids = [None, rand_valid(n, rng), None, rand_valid(n, rng)]
    for m in (2, 3, 4):
        for vs in (valids[:m], [None] * m):
            h, v = tb.cross_keys([T(c, dev) for c in cols[:m]], [T(x, dev) for x in vs], 11)
            rh, rv = cpu.cross_keys(cols[:m], vs, 11)
            assert_keys_equal(h, rh)
            assert_mask_equal(v, rv)
    # the combined mask is a new tensor, never one of the inputs
    v0 = T(valids[1], dev)
    _, v = tb.cross_keys([T(cols[0], dev), T(cols[1], dev)], [None, v0], 0)
    assert v is not v0 and torch.equal(v, v0)
    empty = T(np.zeros(0, np.uint64), dev)
    h, v = tb.cross_keys([empty, empty], [None, None], 0)
    assert len(h) == 0 and v is None


def test_strided_columns_of_a_matrix(dev):
    """Columns of a [rows, k] tensor (how a device batch holds its key and number columns) give the results of
    contiguous copies, without warnings."""
    rng = np.random.default_rng(12)
    keys = T(rand_keys(3000, rng).reshape(1000, 3), dev)
    valid = T(rand_valid(3000, rng).reshape(1000, 3), dev)
    numbers = T(rng.normal(0, 5, (1000, 3)), dev)
    table = tb.LookupTable(rand_keys(50, rng), np.arange(50) + 4)
    k, v, x = keys[:, 1], valid[:, 1], numbers[:, 2]
    kc, vc, xc = k.contiguous(), v.contiguous(), x.contiguous()
    assert not k.is_contiguous()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(tb.hash_ids(k, v, 1, 100, np.int32), tb.hash_ids(kc, vc, 1, 100, np.int32))
        assert torch.equal(table.lookup(k, v, 2, 2, 0, np.int64), table.lookup(kc, vc, 2, 2, 0, np.int64))
        assert torch.equal(tb.cross_keys([k, keys[:, 0]], [v, None], 3)[0], tb.cross_keys([kc, keys[:, 0].contiguous()], [vc, None], 3)[0])
        assert torch.equal(tb.bucketize(x, v, np.array([0.0, 1.0]), np.int32), tb.bucketize(xc, vc, np.array([0.0, 1.0]), np.int32))
        for f in (lambda a, m: tb.fill_null(a, m, 1.0), lambda a, m: tb.clamp(a, 0.0, None), lambda a, m: tb.normalize(a, 1.0, 2.0)):
            assert torch.equal(f(x, v), f(xc, vc))
        c1, c2 = tb.KeyCounter(), tb.KeyCounter()
        c1.add(k, v)
        c2.add(kc, vc)
        assert counts_of(c1, 1) == counts_of(c2, 1)


def test_hot_path_does_not_synchronise(dev):
    """On CUDA, the per-batch functions of the device part queue work without waiting for the GPU (constants and
    tables are made resident by a first call; functions that return host values or error masks are left out)."""
    if dev == "cpu":
        pytest.skip("host synchronisation is a CUDA notion")
    rng = np.random.default_rng(13)
    keys, valid, x = T(rand_keys(1000, rng), dev), T(rand_valid(1000, rng), dev), T(rng.normal(0, 5, 1000), dev)
    idx = T(rng.integers(0, 1000, 500), dev)
    table = tb.LookupTable(rand_keys(50, rng), np.arange(50) + 4)
    bounds = np.array([0.0, 1.0])
    calls = [
        lambda: tb.fill_null(x, valid, 0.0),
        lambda: tb.clamp(x, 0.0, 3.0),
        lambda: tb.log1p(x),
        lambda: tb.normalize(x, 1.0, 2.0),
        lambda: tb.bucketize(x, valid, bounds, np.int32),
        lambda: tb.hash_ids(keys, valid, 0, 1000, np.int32),
        lambda: tb.bucket_ids(keys, valid, 1000, np.int64),
        lambda: tb.cross_keys([keys, keys], [valid, None], 1),
        lambda: table.lookup(keys, valid, 2, 3, 0, np.int32),
        lambda: tb.take(keys, idx),
        lambda: tb.decode_int(keys),
        lambda: tb.first_nonfinite([(x, valid), (x[:10], None)]),  # deferred below
        lambda: tb.first_nonfinite([(x, valid), (tb.log1p(x), None)]),  # aligned: stacked
        lambda: tb.as_float32(x),
        lambda: tb.column_to(Column(rng.integers(0, 9, 100), None, np.arange(0, 101, 5)), dev, staged=True),
    ]
    for f in calls:
        f()  # first calls make constants resident
    torch.cuda.synchronize()
    with tb.deferred_nonfinite(torch.device(dev)) as deferred:
        torch.cuda.set_sync_debug_mode("error")
        try:
            for f in calls:
                f()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    assert bool(deferred.flag[0]) == bool((~torch.isfinite(tb.log1p(x))).any())


def test_deferred_nonfinite_flags_instead_of_returning(dev):
    x = T(np.array([1.0, np.nan, 3.0]), dev)
    ok = T(np.array([1.0, 2.0, 3.0]), dev)
    hidden = T(np.array([True, False, True]), dev)
    assert tb.first_nonfinite([(ok, None), (x, None)])[0] == 1
    with tb.deferred_nonfinite(torch.device(dev)) as quiet:
        assert tb.first_nonfinite([(ok, None), (x, hidden)]) is None  # the NaN is under a missing entry
    assert quiet.flag.device == torch.device(dev) and not bool(quiet.flag[0])
    with tb.deferred_nonfinite(torch.device(dev)) as found:
        assert tb.first_nonfinite([(ok, None)]) is None and not bool(found.flag[0])
        assert tb.first_nonfinite([(ok, None), (x, None)]) is None
        assert tb.first_nonfinite([(ok, None)]) is None  # a later clean check keeps the flag
        assert tb.first_nonfinite([(x[:2], None), (ok, None)]) is None  # unaligned columns
    assert bool(found.flag[0])
    assert tb.first_nonfinite([(ok, None), (x, None)])[0] == 1  # outside the block: checks synchronise again


def test_deferred_nonfinite_is_per_thread(dev):
    x = T(np.array([np.inf]), dev)
    seen = []
    with tb.deferred_nonfinite(torch.device(dev)):
        thread = threading.Thread(target=lambda: seen.append(tb.first_nonfinite([(x, None)])))
        thread.start()
        thread.join()
    assert seen[0] is not None and seen[0][0] == 0


def test_column_to_staged_equals_column_to(dev):
    col = Column(np.array([3, 1, 2], np.uint64), np.array([True, False, True]), np.array([0, 1, 3], np.int64))
    plain, staged = tb.column_to(col, dev), tb.column_to(col, dev, staged=True)
    for a, b in zip((plain.values, plain.valid, plain.offsets), (staged.values, staged.valid, staged.offsets)):
        assert a.device == b.device and a.dtype == b.dtype and torch.equal(a, b)


# ---------------------------------------------------------------- decode


def hex_items(rng: random.Random, width: int | None) -> list[str | None]:
    digits = "0123456789abcdefABCDEF"
    items: list[str | None] = []
    for _ in range(400):
        n = width if width and rng.random() < 0.8 else rng.randint(1, 16)
        items.append("".join(rng.choice(digits) for _ in range(n)))
    items += [f"{k:016x}" for k in EDGE_KEYS] + [f"{k:X}" for k in EDGE_KEYS] + [f"{k:08x}" for k in EDGE_KEYS[:4]]
    items += ["", "g", "0x1f", "-1", "+1", " 1", "1 ", "ff ", "é", "ffffffffffffffff0", "12345678901234567", "0" * 17]
    items += ["1g345678", "abcdefgh", "ABCDEFG0", "FFFFFFFFFFFFFFFF", "0", "00000000", "\x00" * 8, "9/:@AFG`afg"]
    items += [None] * 30
    rng.shuffle(items)
    return items


@pytest.mark.parametrize("width", [None, 0, 1, 8, 16, 20])
def test_decode_hex(dev, width):
    items = hex_items(random.Random(width), width)
    for valid, s in layouts(items):
        keys, bad = tb.decode_hex(T(s, dev), T(valid, dev), width)
        assert_decoded_equal(keys, bad, *cpu.decode_hex(s, valid, width))
    good = [f"{k:016x}" for k in EDGE_KEYS]
    keys, bad = tb.decode_hex(T(layouts(good)[0][1], dev), None, 16)
    assert bad is None and N(keys).view(np.uint64).tolist() == EDGE_KEYS


def test_decode_hex_all_valid_and_empty(dev):
    valid, s = layouts(["1", "Ab", None, "ffffffff"])[1]
    keys, bad = tb.decode_hex(T(s, dev), T(valid, dev), None)
    assert bad is None and N(keys).tolist() == [1, 0xAB, 0, 0xFFFFFFFF]
    for valid, s in layouts([]):
        keys, bad = tb.decode_hex(T(s, dev), T(valid, dev), 8)
        assert len(keys) == 0 and keys.dtype == torch.int64 and bad is None
    keys, bad = tb.decode_hex(T(layouts([None, None])[0][1], dev), T(np.zeros(2, bool), dev), None)
    assert N(keys).tolist() == [0, 0] and bad is None  # nulls over an empty byte buffer


def int_text_items(rng: random.Random) -> list[str | None]:
    items: list[str | None] = []
    for _ in range(400):
        v = rng.choice([rng.randint(-(2**63), 2**63 - 1), rng.randint(-1000, 1000), rng.randint(0, 10**18)])
        items.append(rng.choice(["", "+"]) + str(v) if v >= 0 else str(v))
    items += [str(2**63 - 1), str(2**63), str(-(2**63)), str(-(2**63) - 1), "+" + str(2**63 - 1), "-0", "+0", "0"]
    items += ["9" * 19, "-" + "9" * 19, "1" + "0" * 19, "0" * 18 + "1", "0" * 19 + "1", "-" + "0" * 19, "18446744073709551615"]
    items += ["", "+", "-", "--1", "+-1", "1-", " 1", "1 ", "12a4", "a", "1.5", "1e3", "٣", "0x10", "-" + "9" * 18 + "a"]
    items += ["12345678901234567/8", "922337203685477580:", "9223372036854775807x"]
    items += [str(2**64 - 1), str(2**64), "1" + "9" * 19, "2" + "0" * 19, "1" + "0" * 20, "-" + str(2**64 - 1), "0" * 20]
    items += [str(rng.randint(2**63, 2**64 - 1)) for _ in range(50)] + ["1844674407370955161" + d for d in "0123456789"]
    items += [None] * 30
    rng.shuffle(items)
    return items


def test_decode_int_text(dev):
    items = int_text_items(random.Random(3))
    for valid, s in layouts(items):
        keys, bad = tb.decode_int_text(T(s, dev), T(valid, dev))
        assert_decoded_equal(keys, bad, *cpu.decode_int_text(s, valid))
    ok = ["0", "-1", str(-(2**63)), str(2**63 - 1), "+42", str(2**64 - 1), str(2**63)]
    keys, bad = tb.decode_int_text(T(layouts(ok)[1][1], dev), None)
    assert bad is None and N(keys).tolist() == [0, -1, -(2**63), 2**63 - 1, 42, -1, -(2**63)]  # uint64 words as int64 bits
    keys, bad = tb.decode_int_text(T(layouts([])[0][1], dev), None)
    assert len(keys) == 0 and bad is None


def test_decode_string(dev):
    rng = random.Random(9)
    alphabet = "abcXYZ019 ,|é€😀\x00"
    items: list[str | None] = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) for _ in range(500)]
    items += ["", "a", "x" * 300, "b" * 13, None, None, None]
    rng.shuffle(items)
    for valid, s in layouts(items):
        keys = tb.decode_string(T(s, dev), T(valid, dev))
        assert_keys_equal(keys, cpu.decode_string(s, valid))
    keys = tb.decode_string(T(layouts(["", "hello", "é"])[1][1], dev), None)
    assert N(keys).view(np.uint64).tolist() == [hashing.string_key(b) for b in (b"", b"hello", "é".encode())]
    for items in ([], [None, None], ["", ""]):
        valid, s = layouts(items)[0]
        assert_keys_equal(tb.decode_string(T(s, dev), T(valid, dev)), cpu.decode_string(s, valid))


def test_decode_int_and_encode_hex(dev):
    rng = np.random.default_rng(4)
    v = rand_keys(100, rng).view(np.int64)
    keys = tb.decode_int(T(v, dev))
    assert_keys_equal(keys, cpu.decode_int(v))
    v32 = np.array([-5, 0, 7, 2**31 - 1, -(2**31)], np.int32)
    assert_keys_equal(tb.decode_int(T(v32, dev)), cpu.decode_int(v32))
    valid = rand_valid(100, rng)
    for width in (1, 8, 16):
        for k, vv in ((keys, T(valid, dev)), (N(keys).view(np.uint64), valid), (keys, None)):
            offsets, data = tb.encode_hex(k, vv, width)
            ro, rd = cpu.encode_hex(v.view(np.uint64), None if vv is None else valid, width)
            assert offsets.dtype == np.int32 and isinstance(data, np.ndarray)
            np.testing.assert_array_equal(offsets, ro)
            np.testing.assert_array_equal(data, rd)
    offsets, data = tb.encode_hex(keys, None, 16)
    back, bad = tb.decode_hex(T(Strings.from_offsets(data, offsets.astype(np.int64)), dev), None, 16)
    assert bad is None and torch.equal(back, keys)


# ---------------------------------------------------------------- dense


def dense_inputs(rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray | None]]:
    f = np.concatenate([rng.normal(0, 100, 500), [0.0, -0.0, 1.0, -1.0, 0.5, 10.0, -1.5, 2.5, 1e300, -1e300, 5e-324]])
    f_bad = np.concatenate([f, [np.nan, np.inf, -np.inf]])
    ints = rng.integers(-(2**62), 2**62, 300)
    ints[:4] = [0, -1, 2**63 - 1, -(2**63)]
    out = []
    for v in (f, f_bad, f[np.abs(f) < 1e30].astype(np.float32), ints, ints.astype(np.int32), np.zeros(0), np.zeros(0, np.int64)):
        out.append((v, None))
        out.append((v, rand_valid(len(v), rng)))
    return out


def test_fill_null_and_normalize(dev):
    for v, valid in dense_inputs(np.random.default_rng(0)):
        tv = T(v, dev)
        got = tb.fill_null(tv, T(valid, dev), -3.25)
        assert_same_bits(got, cpu.fill_null(v, valid, -3.25))
        assert got.data_ptr() != tv.data_ptr() or not len(v)  # a copy, never the input
        assert_same_bits(tb.normalize(tv, 12.5, 3.75), cpu.normalize(v, 12.5, 3.75))


@pytest.mark.parametrize(
    "lo, hi", [(0.0, None), (-0.0, None), (None, 0.0), (None, -0.0), (0, 10), (-1.5, 2.5), (0.0, 0.0), (-0.0, 0.0), (-1e300, None), (None, 1)]
)
def test_clamp_matches_numpy_including_signed_zeros(dev, lo, hi):
    for v, _ in dense_inputs(np.random.default_rng(1)):
        assert_same_bits(tb.clamp(T(v, dev), lo, hi), cpu.clamp(v, lo, hi))


def test_log1p(dev):
    """Not bit-identical: torch.log1p (SLEEF on CPU, CUDA's own on GPU) and np.log1p (SVML on AVX-512 machines,
    else the C library) are each accurate to about 1 ulp of ln(1 + x), and differ in the last float64 bit for
    about 1% of inputs (measured on CPU: never by more than 1 ulp; after rounding to float32: never). Checked: at
    most 2 float64 ulps apart on CPU, 4 on other devices; within 1 float32 ulp after the pipeline's float32
    rounding; identical at ±0, ±inf, NaN and -1."""
    rng = np.random.default_rng(2)
    v = np.concatenate([rng.random(20000) * 10, np.exp(rng.normal(0, 10, 20000)), rng.random(2000) * 1e-9])
    v = np.concatenate([v, [0.0, -0.0, np.inf, -1.0, np.nan, -0.5, 5e-324, 1e308]])
    with np.errstate(divide="ignore", invalid="ignore"):
        got, ref = N(tb.log1p(T(v, dev))), cpu.log1p(v)
    finite = np.isfinite(ref)
    assert np.array_equal(np.isnan(got), np.isnan(ref)) and np.array_equal(got[~finite & ~np.isnan(ref)], ref[~finite & ~np.isnan(ref)])
    ulps64 = np.abs(got[finite].view(np.int64) - ref[finite].view(np.int64))
    assert ulps64.max() <= (2 if dev == "cpu" else 4)
    ulps32 = np.abs(got[finite].astype(np.float32).view(np.int32).astype(np.int64) - ref[finite].astype(np.float32).view(np.int32))
    assert ulps32.max() <= 1
    assert np.signbit(got[v == 0]).tolist() == np.signbit(ref[v == 0]).tolist()
    ints = np.arange(-1, 1000)
    got_i = N(tb.log1p(T(ints, dev)))
    with np.errstate(divide="ignore"):
        ref_i = cpu.log1p(ints)
    assert got_i.dtype == np.float64 and got_i[0] == ref_i[0] == -np.inf
    assert np.abs(got_i[1:].view(np.int64) - ref_i[1:].view(np.int64)).max() <= 4


def test_moments_is_the_cpu_result(dev):
    for v, valid in dense_inputs(np.random.default_rng(3)):
        with np.errstate(over="ignore", invalid="ignore"):
            assert repr(tb.moments(T(v, dev), T(valid, dev))) == repr(cpu.moments(v, valid))  # repr: nan == nan
    assert tb.moments(T(np.zeros(3), dev), T(np.zeros(3, bool), dev)) is None


def test_magnitudes_is_the_cpu_result(dev):
    for v, valid in dense_inputs(np.random.default_rng(3)):
        got, ref = tb.magnitudes(T(v, dev), T(valid, dev)), cpu.magnitudes(v, valid)
        assert (got is None) == (ref is None)
        if ref is not None:
            assert got[0].tolist() == ref[0].tolist() and repr(got[1:]) == repr(ref[1:])


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_bucketize(dev, dtype):
    boundaries = np.array([-1.0, 0.0, 0.5, 10.0, 1e300])
    for v, valid in dense_inputs(np.random.default_rng(4)):
        with np.errstate(over="ignore", invalid="ignore"):
            v = np.concatenate([v, boundaries]).astype(v.dtype) if len(v) else v
        valid = None if valid is None else np.concatenate([valid, np.ones(len(v) - len(valid), bool)])
        assert_ids_equal(tb.bucketize(T(v, dev), T(valid, dev), boundaries, dtype), cpu.bucketize(v, valid, boundaries, dtype))
    v = np.array([np.nan, -np.inf, np.inf, -0.0])
    assert N(tb.bucketize(T(v, dev), None, boundaries, dtype)).tolist() == [7, 2, 7, 4]


def test_nonfinite_mask(dev):
    for v, valid in dense_inputs(np.random.default_rng(5)):
        assert_mask_equal(tb.nonfinite_mask(T(v, dev), T(valid, dev)), cpu.nonfinite_mask(v, valid))
    v = np.array([1.0, np.nan, np.inf, 2.0])
    assert tb.nonfinite_mask(T(v, dev), T(np.array([True, False, False, True]), dev)) is None
    assert N(tb.nonfinite_mask(T(v, dev), None)).tolist() == [False, True, True, False]


# ---------------------------------------------------------------- host data and moving to a device


def test_to_device_and_back(dev):
    k = rand_keys(50, np.random.default_rng(6))
    t = T(k, dev)
    assert t.dtype == torch.int64 and t.device.type == dev
    assert N(t).dtype == np.int64 and np.array_equal(N(t).view(np.uint64), k)
    if dev == "cpu":
        assert t.data_ptr() == k.ctypes.data  # zero copy
    ro = np.frombuffer(b"abcdef", np.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert N(T(ro, dev)).tobytes() == b"abcdef"  # read-only Arrow buffers: no warning
    assert N(T(np.arange(10)[::-2], dev)).tolist() == list(range(9, -1, -2))  # negative strides
    assert T(None, dev) is None and N(None) is None
    a = np.arange(3.0)
    assert N(a) is a and tb.to_device(t, dev) is t
    for dt in (np.float32, np.float64, np.int32, np.bool_):
        assert N(T(np.zeros(2, dt), dev)).dtype == dt


def test_strings_move_take_and_is_keys(dev):
    items = ["ab", "", "cde", None, "f" * 20, "é"]
    for _valid, s in layouts(items):
        ts = T(s, dev)
        assert ts.starts.dtype == torch.int64 and ts.ends.dtype == torch.int64 and ts.data.dtype == torch.uint8
        back = N(ts)
        assert isinstance(back.data, np.ndarray) and back.to_list() == s.to_list()
        idx = np.array([5, 0, 0, 2, 1, 4], np.int64)
        taken = tb.take(ts, T(idx, dev))
        assert N(taken).to_list() == s.take(idx).to_list()
        assert torch.equal(taken.starts[1:], taken.ends[:-1])  # compacted
        assert not tb.is_keys(ts)
        assert len(tb.take(ts, T(np.zeros(0, np.int64), dev))) == 0
    k = T(np.arange(5, dtype=np.uint64), dev)
    assert tb.is_keys(k) and not tb.is_keys(T(np.arange(5.0), dev)) and not tb.is_keys(np.arange(5, dtype=np.uint64))
    assert N(tb.take(k, T(np.array([4, 1]), dev))).tolist() == [4, 1]


def test_column_and_batch_to(dev):
    valid, s = layouts(["a", None, "b"])[0]
    col = Column(s, valid, np.array([0, 1, 3], np.int64), s)
    b = Batch({"x": col, "y": Column(np.arange(2, dtype=np.uint64))}, 2, "f.parquet", 3, np.array([10, 11]))
    moved = tb.batch_to(b, dev)
    assert (moved.source, moved.row_group, moved.num_rows) == ("f.parquet", 3, 2)
    assert moved.row_ids is b.row_ids
    x = moved["x"]
    assert isinstance(x.values, Strings) and x.values.data.device.type == dev and x.raw.starts.device.type == dev
    assert N(x.valid).tolist() == valid.tolist() and N(x.offsets).tolist() == [0, 1, 3]
    assert moved["y"].valid is None and moved["y"].values.dtype == torch.int64


# ---------------------------------------------------------------- vocabulary lookup


@pytest.mark.parametrize("vocab_size", [0, 1, 9, 3000])
def test_lookup_table(dev, vocab_size):
    rng = np.random.default_rng(vocab_size)
    vocab = np.unique(rand_keys(vocab_size, rng))[:vocab_size] if vocab_size else np.zeros(0, np.uint64)
    rng.shuffle(vocab)
    ids = np.arange(len(vocab), dtype=np.int64) + 9
    queries = np.concatenate([vocab, rand_keys(2000, rng), np.array(EDGE_KEYS, np.uint64)])
    rng.shuffle(queries)
    valid = rand_valid(len(queries), rng)
    ref_table, table = cpu.LookupTable(vocab, ids), tb.LookupTable(vocab, ids)
    for oov_n in (1, 7):
        for dtype in (np.int32, np.int64):
            for vv in (None, valid):
                got = table.lookup(T(queries, dev), T(vv, dev), 2, oov_n, 5, dtype)
                assert_ids_equal(got, ref_table.lookup(queries, vv, 2, oov_n, 5, dtype))
    empty = np.zeros(0, np.uint64)
    assert_ids_equal(table.lookup(T(empty, dev), None, 2, 3, 0, np.int64), ref_table.lookup(empty, None, 2, 3, 0, np.int64))
    assert list(table._on) == [torch.device(dev) if dev == "cpu" else torch.device(dev, 0)]  # built once per device


def test_lookup_table_duplicate_key_last_wins_and_validation(dev):
    keys = np.array([5, 2**64 - 1, 5, 0], np.uint64)
    ids = np.array([10, 11, 12, 13])
    q = np.array([5, 2**64 - 1, 0, 6], np.uint64)
    ref = cpu.LookupTable(keys, ids).lookup(q, None, 2, 4, 0, np.int64)
    assert_ids_equal(tb.LookupTable(keys, ids).lookup(T(q, dev), None, 2, 4, 0, np.int64), ref)
    assert ref[0] == 12
    with pytest.raises(ValueError):
        tb.LookupTable(keys, ids[:2])


# ---------------------------------------------------------------- counting


def counts_of(counter, threshold: int) -> dict[int, int]:
    keys, counts = counter.at_least(threshold)
    assert keys.dtype == np.uint64 and counts.dtype == np.int64 and isinstance(keys, np.ndarray)
    out = dict(zip(keys.tolist(), counts.tolist()))
    assert len(out) == len(keys)
    return out


@pytest.mark.parametrize("compact_min", [tb.COMPACT_MIN, 4])
def test_key_counter(dev, compact_min, monkeypatch):
    monkeypatch.setattr(tb, "COMPACT_MIN", compact_min)
    rng = np.random.default_rng(7)
    pool = rand_keys(300, rng)
    a, ref_a = tb.KeyCounter(), cpu.KeyCounter()
    for i in range(12):
        keys = pool[rng.integers(0, len(pool) if i % 3 else 40, 500)]
        valid = rand_valid(len(keys), rng) if i % 2 else None
        a.add(T(keys, dev), T(valid, dev))
        ref_a.add(keys, valid)
        if i == 7:
            for t in (1, 2, 5, 30):
                assert counts_of(a, t) == counts_of(ref_a, t)
    a.add(T(np.zeros(0, np.uint64), dev), None)
    a.add(T(pool[:3], dev), T(np.zeros(3, bool), dev))
    for t in (0, 1, 3, 10**9):
        assert counts_of(a, t) == counts_of(ref_a, t)
    if compact_min == 4:
        assert len(a._keys) == 1 and a._pending <= 2 * max(a._distinct, 4)


def test_key_counter_empty_and_bounded(dev, monkeypatch):
    c = tb.KeyCounter()
    assert counts_of(c, 1) == {}
    monkeypatch.setattr(tb, "COMPACT_MIN", 8)
    for _ in range(50):
        c.add(T(np.arange(20, dtype=np.uint64) + 2**63, dev), None)
        assert sum(len(k) for k in c._keys) <= 2 * 20 + 20
    assert counts_of(c, 1) == {2**63 + i: 50 for i in range(20)}


# ---------------------------------------------------------------- lists


@pytest.mark.parametrize("x", [1, 2, 5, 100])
def test_first_x_and_gather_ranges(dev, x):
    rng = np.random.default_rng(x)
    lengths = rng.integers(0, 8, 300)
    lengths[:5] = 0
    for offsets in (np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64), np.zeros(1, np.int64), np.array([0, 0, 0], np.int64)):
        idx, new_offsets = tb.first_x(T(offsets, dev), x)
        ridx, roffsets = cpu.first_x(offsets, x)
        assert_ids_equal(idx, ridx.astype(np.int64))
        assert_ids_equal(new_offsets, roffsets)
    offsets32 = np.array([0, 3, 3, 7], np.int32)
    idx, new_offsets = tb.first_x(T(offsets32, dev), 2)
    assert N(idx).tolist() == [0, 1, 3, 4] and N(new_offsets).tolist() == [0, 2, 2, 4]


# ---------------------------------------------------------------- the ops on this backend


def _run_ops(xp, batch: Batch, dev: str | None) -> dict[str, np.ndarray]:
    """Decode → Categorify / Hash / HashedCross / FirstX and a dense chain, fitted and applied with ``xp``; the
    outputs as numpy."""
    specs = {
        "h": ColumnSpec("h", "categorical", "string", "hex", 8),
        "s": ColumnSpec("s", "categorical", "string", "string"),
        "i": ColumnSpec("i", "categorical", "int64", "int"),
        "t": ColumnSpec("t", "categorical", "string", "int"),
        "l": ColumnSpec("l", "list", "string", "hex", None, "|"),
    }
    if dev is not None:
        batch = tb.batch_to(batch, dev)
    decode = Decode(list(specs))
    decode.bind(specs)
    batch = batch.with_columns(decode.transform(batch, xp))
    first = FirstX(["l"], 2)
    batch = batch.with_columns(first.transform(batch, xp))
    cat = Categorify(["h", "s", "l"], freq_threshold=2, oov_buckets=3)
    cat.bind(specs)
    norm = Normalize(["d"])
    stats, nstats = cat.new_stats(xp), norm.new_stats(xp)
    cat.partial_fit(stats, batch, xp)
    norm.partial_fit(nstats, batch, xp)
    cat.finalize(stats, xp)
    norm.finalize(nstats, xp)
    out = {f"vocab_{c}": v for c, v in cat.vocab.items()}
    out["norm"] = (norm.mean, norm.std)
    ops = [
        HashedCross(["h", "i", "s"], 77, seed=1),
        cat,
        Hash(["i", "t"], 1000, seed=3),
        FillMissing(["d"], 0.0),
        Clamp(["d"], min=0.0),
        Bucketize(["d"], [0.5, 1.0, 100.0]),
        Normalize(["e"]),
    ]
    ops[-1].mean, ops[-1].std = {"e": 1.5}, {"e": 2.0}
    for op in ops:
        batch = batch.with_columns(op.transform(batch, xp))
    log = Log1p(["e"]).transform(batch, xp)["e"]
    for name, col in batch.columns.items():
        out[name] = (tb.to_numpy(col.values), tb.to_numpy(col.valid), tb.to_numpy(col.offsets))
    out["log"] = tb.to_numpy(log.values)
    return out


def test_ops_give_the_cpu_results(dev):
    rng = random.Random(8)
    n = 400
    hexes = [f"{rng.choice([1, 2, 3, 2**32 - 1, rng.randrange(2**32)]):08x}" if rng.random() > 0.1 else None for _ in range(n)]
    words = [rng.choice(["x", "yy", "é", "", "long text " * 3]) if rng.random() > 0.1 else None for _ in range(n)]
    ints = [rng.choice([0, -1, 2**63 - 1, -(2**63), rng.randrange(100)]) if rng.random() > 0.1 else None for _ in range(n)]
    texts = [None if v is None else str(v) for v in ints]
    lists = [[f"{rng.randrange(50):x}" for _ in range(rng.randrange(5))] if rng.random() > 0.1 else None for _ in range(n)]
    dense = [rng.choice([-2.0, -0.0, 0.0, 0.7, 3.0, 1e6]) if rng.random() > 0.1 else None for _ in range(n)]

    def col(items, arrow_type, s):
        return column_from_arrow(pa.array(items, arrow_type), s)

    string_spec = ColumnSpec("c", "categorical", "string", "string")
    list_spec = ColumnSpec("l", "list", "string", "hex", None, "|")
    float_spec = ColumnSpec("d", "dense", "float64")
    batch = Batch(
        {
            "h": col(hexes, pa.string(), string_spec),
            "s": col(words, pa.string_view(), string_spec),
            "i": col(ints, pa.int64(), ColumnSpec("i", "categorical", "int64", "int")),
            "t": col(texts, pa.large_string(), string_spec),
            "l": col(lists, pa.list_(pa.string()), list_spec),
            "d": col(dense, pa.float64(), float_spec),
            "e": col(dense, pa.float64(), float_spec),
        },
        n,
    )
    with np.errstate(invalid="ignore"):  # Log1p of -2
        got, ref = _run_ops(tb, batch, dev), _run_ops(cpu, batch, None)
    assert got.keys() == ref.keys()
    for name in ref:
        if name.startswith("vocab_") or name == "norm":
            assert got[name] == ref[name], name
        elif name == "log":
            finite = np.isfinite(ref[name])
            np.testing.assert_array_equal(got[name][finite].astype(np.float32), ref[name][finite].astype(np.float32))
        else:
            for g, r in zip(got[name], ref[name]):
                if isinstance(r, Strings):
                    assert g.to_list() == r.to_list(), name
                elif r is None:
                    assert g is None, name
                else:
                    assert g.dtype == (np.int64 if r.dtype == np.uint64 else r.dtype), name
                    np.testing.assert_array_equal(g.view(r.dtype) if r.dtype == np.uint64 else g, r, err_msg=name)


def test_tables_are_searched_in_groups_of_similar_sizes() -> None:
    """Largest first; a group grows while padding to its largest table stays under 2x its entries + slack."""
    assert tb._size_groups([1000, 900, 10, 0, 5000]) == [[4, 0, 1], [2, 3]]
    assert tb._size_groups([]) == []
    sizes = [int(x) for x in np.random.default_rng(0).zipf(1.3, 40) * 50]
    groups = tb._size_groups(sizes)
    assert sorted(i for g in groups for i in g) == list(range(40))
    for g in groups:
        assert len(g) == 1 or len(g) * max(sizes[i] for i in g) <= 2 * sum(sizes[i] for i in g) + tb._PAD_SLACK
