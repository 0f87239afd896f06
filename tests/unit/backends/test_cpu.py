"""etl.backends.cpu against plain-Python references (hashing formulas from etl.backends.hashing, which
test_hashing.py checks against an independent implementation)."""

from __future__ import annotations

import bisect
import math
import random
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from etl.backends import cpu, hashing
from etl.batch import Strings
from etl.io.parquet import column_from_arrow
from etl.schema import ColumnSpec

M64 = 2**64
EDGE_KEYS = [0, 1, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1]
HEXCHARS = set("0123456789abcdefABCDEF")


# ---------------------------------------------------------------- helpers


ARROW_STRING_TYPES = {False: pa.string(), True: pa.large_string(), "view": pa.string_view()}


def strings_arrow(items: list[str | None], large: bool | str = False, slice_from: int = 0):
    """Strings + valid built through pyarrow buffers (as the readers do), optionally from a sliced array.
    ``large``: False → string, True → large_string, "view" → string_view."""
    pad = [f"pad{i}" for i in range(slice_from)]
    arr = pa.array(pad + items, ARROW_STRING_TYPES[large]).slice(slice_from)
    col = column_from_arrow(arr, ColumnSpec("c", "categorical", "string", "string"))
    assert isinstance(col.values, Strings)
    return col.values, col.valid


def strings_direct(items: list[str]) -> Strings:
    bs = [s.encode() for s in items]
    offs = np.zeros(len(bs) + 1, np.int64)
    np.cumsum([len(b) for b in bs], out=offs[1:])
    data = np.frombuffer(b"".join(bs), np.uint8) if bs and offs[-1] else np.zeros(0, np.uint8)
    return Strings.from_offsets(data, offs)


def rand_keys(n: int, rng: np.random.Generator) -> np.ndarray:
    k = rng.integers(0, 2**64 - 1, size=n, dtype=np.uint64, endpoint=True)
    k[: min(n, len(EDGE_KEYS))] = EDGE_KEYS[: min(n, len(EDGE_KEYS))]
    return k


def ref_hex(s: str, width: int | None) -> int | None:
    """Documented hex decode: 1..16 digits (exactly width when given) of 0-9a-fA-F, else invalid (None)."""
    if not 1 <= len(s) <= 16 or (width and len(s) != width) or any(ch not in HEXCHARS for ch in s):
        return None
    v = 0
    for ch in s.lower():
        v = v * 16 + "0123456789abcdef".index(ch)
    return v


def ref_int_text(s: str) -> int | None:
    """Documented decimal decode: optional sign then 1..20 digits, a value in [-2**63, 2**64 - 1] → its uint64 word."""
    body = s[1:] if s[:1] in ("+", "-") else s
    if not 1 <= len(body) <= 20 or any(ch not in "0123456789" for ch in body):
        return None
    v = int(body) * (-1 if s[:1] == "-" else 1)
    if not -(2**63) <= v < 2**64:
        return None
    return v % M64


def check_decoded(keys, bad, items, ref):
    assert keys.dtype == np.uint64 and len(keys) == len(items)
    expect_bad = [x is not None and ref(x) is None for x in items]
    if any(expect_bad):
        assert bad is not None
        assert bad.tolist() == expect_bad
    else:
        assert bad is None
    for i, x in enumerate(items):
        if x is not None and ref(x) is not None:
            assert int(keys[i]) == ref(x), (i, x)


# ---------------------------------------------------------------- decode_hex


HEX_CASES = ["68fd1e64", "68FD1E64", "00000000", "ffffffff", "FFFFFFFF", "0", "a", "ffffffffffffffff",
             "8000000000000000", "zz123456", "123456789", "1234567", "", "12 34567", "0x123456", "-1234567",
             "1234567g", "G", "fffffffffffffffff", None, "aBcDeF01"]  # fmt: skip


@pytest.mark.parametrize("width", [None, 1, 8, 16])
@pytest.mark.parametrize("large", [False, True, "view"])
def test_decode_hex_vs_reference(width, large):
    items = HEX_CASES
    s, valid = strings_arrow(items, large=large, slice_from=3)
    keys, bad = cpu.decode_hex(s, valid, width)
    check_decoded(keys, bad, items, lambda x: ref_hex(x, width))


def test_decode_hex_width8_specific():
    items = ["68fd1e64", "68FD1E64", "zz123456", "123456789", "", None, "0000000a"]
    s, valid = strings_arrow(items)
    keys, bad = cpu.decode_hex(s, valid, 8)
    assert bad.tolist() == [False, False, True, True, True, False, False]
    assert int(keys[0]) == 0x68FD1E64 == int(keys[1])
    assert int(keys[6]) == 10


def test_decode_hex_random_vs_reference():
    rng = random.Random(5)
    items = []
    for _ in range(3000):
        r = rng.random()
        if r < 0.1:
            items.append(None)
        elif r < 0.2:
            items.append("".join(rng.choice("0123456789abcdefxyzG -") for _ in range(rng.randrange(0, 18))))
        else:
            items.append("".join(rng.choice("0123456789abcdefABCDEF") for _ in range(8)))
    s, valid = strings_arrow(items)
    keys, bad = cpu.decode_hex(s, valid, 8)
    check_decoded(keys, bad, items, lambda x: ref_hex(x, 8))
    keys, bad = cpu.decode_hex(s, valid, None)
    check_decoded(keys, bad, items, lambda x: ref_hex(x, None))


def test_decode_hex_direct_strings_no_nulls_and_empty():
    items = ["1", "ff", "DEADBEEF"]
    keys, bad = cpu.decode_hex(strings_direct(items), None, None)
    assert bad is None and keys.tolist() == [1, 255, 0xDEADBEEF]
    keys, bad = cpu.decode_hex(strings_direct([]), None, 8)
    assert len(keys) == 0 and bad is None


def test_decode_hex_empty_string_is_bad():
    keys, bad = cpu.decode_hex(strings_direct([""]), None, None)
    assert bad is not None and bad.tolist() == [True]


# ---------------------------------------------------------------- decode_int_text


INT_TEXT = ["0", "-0", "+0", "1", "-1", "+17", "42", "-42", "9223372036854775807", "-9223372036854775807",
            "-9223372036854775808", "0000000000000000001", "00000000000000000001", "000000000000000000001", "", "+",
            "-", "1.5", "1e3", "18446744073709551615", "18446744073709551616", "9223372036854775808", "10000169349117863715",
            "-18446744073709551615", "99999999999999999999", "28446744073709551615", "18446744073709551620",
            " 1", "1 ", "--1", "+-1", "abc", "12a", None, "4294967295"]  # fmt: skip


@pytest.mark.parametrize("large", [False, True, "view"])
def test_decode_int_text_vs_reference(large):
    s, valid = strings_arrow(INT_TEXT, large=large, slice_from=2)
    keys, bad = cpu.decode_int_text(s, valid)
    check_decoded(keys, bad, INT_TEXT, ref_int_text)
    assert int(keys[INT_TEXT.index("-1")]) == 2**64 - 1


def test_decode_int_text_random():
    rng = random.Random(9)
    items = [None if rng.random() < 0.1 else str(rng.randrange(-(2**63), 2**64)) for _ in range(2000)]
    s, valid = strings_arrow(items)
    keys, bad = cpu.decode_int_text(s, valid)
    check_decoded(keys, bad, items, ref_int_text)


def test_decode_int_text_unsigned_64_bit_range():
    items = ["18446744073709551615", "9223372036854775808", "10000169349117863715", "-1", "-9223372036854775808"]
    keys, bad = cpu.decode_int_text(strings_direct(items), None)
    assert bad is None
    assert keys.tolist() == [2**64 - 1, 2**63, 10000169349117863715, 2**64 - 1, 2**63]  # negatives: two's complement


def test_decode_int_text_out_of_range_is_bad():
    items = ["18446744073709551616", "99999999999999999999", "-9999999999999999999", "-9223372036854775809", "1" + "0" * 20]
    keys, bad = cpu.decode_int_text(strings_direct(items), None)
    assert bad is not None and bad.tolist() == [True] * 5


# ---------------------------------------------------------------- decode_string / decode_int


def test_decode_string_vs_string_key():
    items = ["", "a", "Adventure", "Children's", "Sci-Fi", "\u00e9t\u00e9", None, "(no genres listed)", "a" * 300]
    for large in (False, True, "view"):
        s, valid = strings_arrow(items, large=large, slice_from=1)
        keys = cpu.decode_string(s, valid)
        assert keys.dtype == np.uint64
        for i, x in enumerate(items):
            if x is not None:
                assert int(keys[i]) == hashing.string_key(x.encode("utf-8"))
    keys = cpu.decode_string(strings_direct([]), None)
    assert len(keys) == 0


def test_decode_int_bits():
    v = np.array([0, 1, -1, 2**63 - 1, -(2**63), 4294967295, -42], np.int64)
    keys = cpu.decode_int(v)
    assert keys.dtype == np.uint64
    assert keys.tolist() == [int(x) % M64 for x in v.tolist()]
    assert len(cpu.decode_int(np.zeros(0, np.int64))) == 0


# ---------------------------------------------------------------- hash_ids / cross_keys


@pytest.mark.parametrize("n", [1, 2, 1000, 40_000_000, 2**31])
@pytest.mark.parametrize("seed", [0, 3])
def test_hash_ids_vs_reference(n, seed):
    rng = np.random.default_rng(n + seed)
    keys = rand_keys(500, rng)
    valid = rng.random(500) > 0.15
    for v in (valid, None):
        ids = cpu.hash_ids(keys, v, seed, n, np.int64)
        assert ids.dtype == np.int64
        for i, k in enumerate(keys.tolist()):
            want = 1 if (v is not None and not v[i]) else 2 + hashing.reduce(hashing.hash64(k, seed), n)
            assert int(ids[i]) == want
            assert 1 <= ids[i] <= n + 1


def test_hash_ids_int32_and_empty():
    keys = np.array(EDGE_KEYS, np.uint64)
    ids = cpu.hash_ids(keys, None, 0, 2**31 - 2, np.int32)
    assert ids.dtype == np.int32
    assert ids.tolist() == [2 + hashing.reduce(hashing.hash64(k, 0), 2**31 - 2) for k in EDGE_KEYS]
    assert len(cpu.hash_ids(np.zeros(0, np.uint64), None, 0, 5, np.int32)) == 0


@pytest.mark.parametrize("n", [0, -1, 2**31 + 1])
def test_hash_ids_bad_n(n):
    with pytest.raises(ValueError):
        cpu.hash_ids(np.zeros(3, np.uint64), None, 0, n, np.int64)


def test_cross_keys_vs_reference():
    rng = np.random.default_rng(1)
    for m in (2, 3):
        keys = [rand_keys(300, rng) for _ in range(m)]
        valids = [rng.random(300) > 0.1, None, rng.random(300) > 0.2][:m]
        h, valid = cpu.cross_keys(keys, valids, 7)
        assert h.dtype == np.uint64
        exp_valid = np.ones(300, bool)
        for v in valids:
            if v is not None:
                exp_valid &= v
        assert valid.tolist() == exp_valid.tolist()
        for i in range(300):
            assert int(h[i]) == hashing.cross_key([int(k[i]) for k in keys], 7)
    # inputs are not modified
    v0 = valids[0].copy()
    cpu.cross_keys(keys, valids, 7)
    assert valids[0].tolist() == v0.tolist()


def test_empty_inputs():
    e = np.zeros(0, np.uint64)
    h, valid = cpu.cross_keys([e, e], [None, np.zeros(0, bool)], 0)
    assert len(h) == 0 and len(valid) == 0
    keys, bad = cpu.decode_int_text(strings_direct([]), None)
    assert len(keys) == 0 and bad is None


def test_cross_keys_no_nulls_gives_none():
    a = np.array([1, 2], np.uint64)
    h, valid = cpu.cross_keys([a, a], [None, None], 0)
    assert valid is None
    assert h.tolist() == [hashing.cross_key([1, 1], 0), hashing.cross_key([2, 2], 0)]


# ---------------------------------------------------------------- LookupTable


@pytest.mark.parametrize("nkeys", [0, 1, 7, 5000])
@pytest.mark.parametrize("oov_n", [1, 3])
@pytest.mark.parametrize("keys_kind", ["64-bit", "32-bit", "32-bit, large ids"])
def test_lookup_table(nkeys, oov_n, keys_kind):
    """Every present key gets its id, every absent one (keys of 2**32 and more among them) the hash bucket, in a
    narrow table (32-bit keys and ids) as in a wide one."""
    rng = np.random.default_rng(nkeys + oov_n)
    table_keys = np.unique(rand_keys(nkeys, rng)) if nkeys else np.zeros(0, np.uint64)
    if keys_kind != "64-bit":
        table_keys = np.unique(table_keys & np.uint64(0xFFFFFFFF))
    ids = rng.permutation(len(table_keys)).astype(np.int64) + 2 + oov_n
    if keys_kind == "32-bit, large ids" and nkeys:
        ids[-1] = 2**32 - 1  # id + 1 no longer fits in 32 bits
    t = cpu.LookupTable(table_keys, ids)
    assert t.narrow == (len(table_keys) == 0 or (int(table_keys.max()) < 2**32 and int(ids.max()) < 2**32 - 1))
    assert t.narrow or keys_kind != "32-bit"
    assert t.table.itemsize * (1 if t.narrow else 2) * len(table_keys) <= t.table.nbytes // (2 if t.narrow else 4)  # load <= 1/2, 1/4
    mapping = dict(zip(table_keys.tolist(), ids.tolist()))
    queries = np.concatenate([table_keys, rand_keys(500, rng), np.array(EDGE_KEYS, np.uint64)])
    valid = rng.random(len(queries)) > 0.1
    seed = 5
    for v in (valid, None):
        out = t.lookup(queries, v, 2, oov_n, seed, np.int64)
        for i, k in enumerate(queries.tolist()):
            if v is not None and not v[i]:
                want = 1
            elif k in mapping:
                want = mapping[k]
            else:
                want = 2 + hashing.reduce(hashing.hash64(k, seed), oov_n)
            assert int(out[i]) == want, (i, k)
    out32 = t.lookup(queries, None, 2, oov_n, seed, np.int32)
    assert out32.dtype == np.int32
    assert len(t.lookup(np.zeros(0, np.uint64), None, 2, oov_n, seed, np.int32)) == 0


def test_lookup_table_edge_keys_present():
    keys = np.array(EDGE_KEYS, np.uint64)
    t = cpu.LookupTable(keys, np.arange(len(keys)) + 10)
    assert t.lookup(keys, None, 2, 1, 0, np.int64).tolist() == list(range(10, 10 + len(keys)))


# ---------------------------------------------------------------- KeyCounter


def test_key_counter_add_and_growth():
    rng = np.random.default_rng(3)
    kc = cpu.KeyCounter()
    ref = Counter()
    pool = rand_keys(6000, rng)
    for b in range(25):
        batch = pool[rng.zipf(1.3, size=800) % len(pool)] if b % 2 else pool[rng.integers(0, len(pool), 800)]
        valid = rng.random(800) > 0.2 if b % 3 else None
        kc.add(batch, valid)
        for i, k in enumerate(batch.tolist()):
            if valid is None or valid[i]:
                ref[k] += 1
    keys, counts = sorted_counts(kc)
    assert keys.dtype == np.uint64
    assert keys.tolist() == sorted(ref)  # ascending as unsigned
    assert counts.tolist() == [ref[k] for k in sorted(ref)]
    assert len(ref) > 1024  # growth beyond the initial capacity happened


def sorted_counts(kc: cpu.KeyCounter) -> tuple[np.ndarray, np.ndarray]:
    keys, counts = kc.at_least(1)
    order = np.argsort(keys)
    return keys[order], counts[order]


def test_key_counter_fills_its_table_up_to_three_quarters_before_it_doubles():
    kc = cpu.KeyCounter()
    capacity = len(kc.table)
    kc.add(np.arange(capacity * 3 // 4, dtype=np.uint64), None)
    assert (len(kc.table), kc.size) == (capacity, capacity * 3 // 4)
    kc.add(np.array([capacity], np.uint64), None)
    assert len(kc.table) == 2 * capacity
    keys, counts = sorted_counts(kc)
    assert keys.tolist() == list(range(capacity * 3 // 4)) + [capacity] and set(counts.tolist()) == {1}


def test_key_counter_at_least():
    kc = cpu.KeyCounter()
    kc.add(np.array([1, 1, 1, 2, 2, 3], np.uint64), None)
    keys, counts = kc.at_least(2)
    assert sorted(zip(keys.tolist(), counts.tolist())) == [(1, 3), (2, 2)]


def test_key_counter_key_zero_and_edge_keys():
    kc = cpu.KeyCounter()
    kc.add(np.array([0, 0, 2**64 - 1, 5], np.uint64), None)
    kc.add(np.array([0, 0, 0, 7, 7] + [2**63] * 10, np.uint64), None)
    big = np.arange(100, 3100, dtype=np.uint64)
    for _ in range(4):
        kc.add(big, None)
    keys, counts = sorted_counts(kc)
    ref = {0: 5, 5: 1, 7: 2, 2**63: 10, 2**64 - 1: 1}
    ref.update({int(k): 4 for k in big})
    assert keys.tolist() == sorted(ref)
    assert counts.tolist() == [ref[k] for k in sorted(ref)]


def test_key_counter_large_splits_into_tables_and_counts_exactly():
    """Many distinct keys (tables far beyond L2, growth, prefetching paths): exact counts."""
    rng = np.random.default_rng(11)
    pool = rand_keys(150_000, rng)
    kc = cpu.KeyCounter()
    seen = []
    for b in range(6):
        batch = pool[rng.integers(0, len(pool), 60_000)] if b % 2 else pool[rng.zipf(1.2, 60_000) % len(pool)]
        valid = rng.random(len(batch)) > 0.1 if b % 3 else None
        kc.add(batch, valid)
        seen.append(batch if valid is None else batch[valid])
    ref_keys, ref_counts = np.unique(np.concatenate(seen), return_counts=True)
    keys, counts = kc.at_least(1)
    assert np.array_equal(keys, ref_keys) and np.array_equal(counts, ref_counts)
    assert kc.size == len(ref_keys)
    keys, counts = kc.at_least(3)
    assert np.array_equal(keys, ref_keys[ref_counts >= 3]) and np.array_equal(counts, ref_counts[ref_counts >= 3])


def test_key_counter_given_its_rows_is_sized_after_its_first_batch_and_counts_the_same():
    """Batches drawn from a pool of 30,000 keys: 12 batches of 20,000 rows. Sized for the rows to come once the
    first batch is counted, the table does not grow again; without the hint it doubles as it fills."""
    rng = np.random.default_rng(5)
    pool = rand_keys(30_000, rng)
    batches = [pool[rng.integers(0, len(pool), 20_000)] for _ in range(12)]
    valids = [rng.random(20_000) > 0.1 if b % 2 else None for b in range(12)]
    hinted, plain = cpu.KeyCounter(rows=12 * 20_000), cpu.KeyCounter()
    sizes = []
    for batch, valid in zip(batches, valids):
        hinted.add(batch, valid)
        plain.add(batch, valid)
        sizes.append((len(hinted.table), len(plain.table)))
    assert len({h for h, _ in sizes}) == 1 and len(hinted.table) >= 2 * hinted.size
    assert len({p for _, p in sizes}) > 1
    for got, want in zip(sorted_counts(hinted), sorted_counts(plain)):
        assert np.array_equal(got, want)


def test_key_counter_holds_32_bit_keys_in_8_byte_slots_and_counts_exactly():
    """Keys below 2**32 (decoded 8-hex-digit keys) stay in the narrow table through growth, sized by a hint."""
    rng = np.random.default_rng(8)
    pool = rng.integers(0, 2**32, 40_000, dtype=np.uint64)
    pool[:3] = [0, 1, 2**32 - 1]
    kc = cpu.KeyCounter(rows=8 * 10_000)
    seen = []
    for b in range(8):
        batch = pool[rng.zipf(1.3, 10_000) % len(pool)] if b % 2 else pool[rng.integers(0, len(pool), 10_000)]
        valid = rng.random(len(batch)) > 0.2 if b % 3 else None
        kc.add(batch, valid)
        seen.append(batch if valid is None else batch[valid])
    assert not kc.wide and kc.table.nbytes == 8 * len(kc.table) and len(kc.table) >= 2 * kc.size
    ref_keys, ref_counts = np.unique(np.concatenate(seen), return_counts=True)
    keys, counts = kc.at_least(1)
    assert keys.dtype == np.uint64 and counts.dtype == np.int64
    assert np.array_equal(keys, ref_keys) and np.array_equal(counts, ref_counts)
    keys, counts = kc.at_least(3)
    assert np.array_equal(keys, ref_keys[ref_counts >= 3]) and np.array_equal(counts, ref_counts[ref_counts >= 3])


def test_key_counter_widens_at_the_first_key_of_2_pow_32_mid_batch():
    kc = cpu.KeyCounter()
    small = np.arange(3000, dtype=np.uint64)
    kc.add(small, None)
    assert not kc.wide
    batch = np.array([5, 2**32, 5, 2**64 - 1, 7, 2**32], np.uint64)
    kc.add(batch, np.array([True, True, True, True, False, True]))
    assert kc.wide and kc.table.shape[1] == 2
    ref = {int(k): 1 for k in small}
    ref[5] += 2
    ref.update({2**32: 2, 2**64 - 1: 1})
    keys, counts = sorted_counts(kc)
    assert keys.tolist() == sorted(ref) and counts.tolist() == [ref[k] for k in sorted(ref)]


def test_key_counter_widens_before_its_counts_could_pass_32_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu, "_NARROW_COUNTS", 10)
    kc = cpu.KeyCounter()
    kc.add(np.full(6, 4, np.uint64), None)
    assert not kc.wide
    kc.add(np.full(6, 4, np.uint64), np.array([True] * 5 + [False]))  # 12 keys given: beyond the bound
    assert kc.wide
    keys, counts = kc.at_least(1)
    assert keys.tolist() == [4] and counts.tolist() == [11]


def test_key_counter_rows_hint_no_larger_than_the_first_batch_sizes_nothing():
    keys = np.arange(5000, dtype=np.uint64)
    kc, plain = cpu.KeyCounter(rows=5000), cpu.KeyCounter()
    kc.add(keys, None)
    plain.add(keys, None)
    assert len(kc.table) == len(plain.table) and kc.size == 5000


@pytest.mark.parametrize(
    ("at_half", "distinct", "batch", "rows", "expected"),
    [
        (500, 1000, 1000, 8000, 8000),  # every key new: distinct keys grow as the rows (exponent 1)
        (100, 100, 1000, 10**6, 100),  # no key new in the second half: no more to come (exponent 0)
        (700, 1000, 1000, 4000, int(1000 * 4 ** math.log2(1000 / 700))),  # in between
        (0, 10, 1000, 8000, 80),  # no key in the first half: exponent 1
        (500, 1000, 1000, 10**9, 16 * 1000),  # at most PROJECTION_LIMIT times the first batch's distinct keys
        (0, 0, 1000, 8000, 0),
    ],
)
def test_projected_distinct(at_half: int, distinct: int, batch: int, rows: int, expected: int) -> None:
    assert cpu.projected_distinct(at_half, distinct, batch, rows) == expected


def test_key_counter_empty_and_all_null():
    kc = cpu.KeyCounter()
    kc.add(np.zeros(0, np.uint64), None)
    kc.add(np.array([1, 2], np.uint64), np.array([False, False]))
    keys, counts = sorted_counts(kc)
    assert len(keys) == 0 and len(counts) == 0


# ---------------------------------------------------------------- lists, dense


@pytest.mark.parametrize("x", [1, 2, 3, 10])
def test_first_x(x):
    rng = np.random.default_rng(x)
    lens = rng.integers(0, 6, 200)
    lens[:3] = [0, 0, 5]
    offsets = np.zeros(len(lens) + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    for off in (offsets, offsets.astype(np.int32)):
        idx, new_off = cpu.first_x(off, x)
        ref_idx, ref_off = [], [0]
        for i in range(len(lens)):
            keep = list(range(offsets[i], offsets[i + 1]))[:x]
            ref_idx += keep
            ref_off.append(ref_off[-1] + len(keep))
        assert idx.tolist() == ref_idx
        assert new_off.tolist() == ref_off
    idx, new_off = cpu.first_x(np.zeros(1, np.int64), x)
    assert idx.tolist() == [] and new_off.tolist() == [0]


def test_bucketize_vs_bisect():
    rng = np.random.default_rng(0)
    b = np.array([-1.0, 0.0, 0.5, 10.0, 1e6])
    vals = np.concatenate([rng.normal(0, 5, 400), b, [-np.inf, np.inf, -1e9, 1e9]])
    valid = rng.random(len(vals)) > 0.1
    for v in (valid, None):
        ids = cpu.bucketize(vals, v, b, np.int32)
        assert ids.dtype == np.int32
        for i, x in enumerate(vals.tolist()):
            want = 1 if (v is not None and not v[i]) else 2 + bisect.bisect_right(b.tolist(), x)
            assert int(ids[i]) == want
    ids = cpu.bucketize(np.array([5, -3, 0], np.int64), None, b, np.int64)
    assert ids.tolist() == [2 + bisect.bisect_right(b.tolist(), x) for x in (5, -3, 0)]
    assert len(cpu.bucketize(np.zeros(0), None, b, np.int32)) == 0


def test_first_nonfinite():
    ok, bad = np.array([1.0, 2.0]), np.array([1.0, np.nan])
    assert cpu.first_nonfinite([]) is None
    assert cpu.first_nonfinite([(ok, None), (np.array([1, 2]), None)]) is None
    assert cpu.first_nonfinite([(bad, np.array([True, False]))]) is None  # the NaN is under a missing entry
    i, mask = cpu.first_nonfinite([(ok, None), (bad, None), (np.array([np.inf, 0.0]), None)])
    assert i == 1 and mask.tolist() == [False, True]


def test_nonfinite_mask():
    vals = np.array([0.0, np.nan, np.inf, -np.inf, 1.0, np.nan])
    valid = np.array([True, True, True, True, True, False])
    assert cpu.nonfinite_mask(vals, valid).tolist() == [False, True, True, True, False, False]
    assert cpu.nonfinite_mask(vals, None).tolist() == [False, True, True, True, False, True]
    assert cpu.nonfinite_mask(np.array([1.0, 2.0]), None) is None
    assert cpu.nonfinite_mask(np.array([np.nan]), np.array([False])) is None
    assert cpu.nonfinite_mask(np.array([1, 2], np.int64), None) is None
    assert cpu.nonfinite_mask(np.zeros(0), None) is None


def test_magnitudes_counts_present_values_by_sign_and_exponent():
    vals = np.array([1.0, 1.5, -3.0, 0.0, -0.0, 1e39, np.inf, np.nan, 5e-324, 7.0])
    valid = np.array([True, True, True, True, True, True, True, True, True, False])
    counts, low, high = cpu.magnitudes(vals, valid)
    assert counts.dtype == np.int64 and len(counts) == 4096 and counts.sum() == 9
    top = {int(t): int(counts[t]) for t in np.flatnonzero(counts)}
    # 1 and 1.5: exponent 1023; -3: sign and exponent 1024; zeros and the subnormal: exponent 0; 1e39: 1023 + 129;
    # inf and NaN: 2047
    assert top == {1023: 2, 2048 + 1024: 1, 0: 2, 2048: 1, 1023 + 129: 1, 2047: 2}
    assert cpu.magnitudes(vals[vals == vals], None)[1:] == (-3.0, np.inf)  # NaN aside (the fit refuses it anyway)
    counts, low, high = cpu.magnitudes(np.array([4, -9, 2**40], np.int64), None)
    assert (low, high) == (-9.0, 2.0**40) and counts[1025] == 1 and counts[2048 + 1026] == 1 and counts[1063] == 1
    assert cpu.magnitudes(np.array([1.0]), np.array([False])) is None and cpu.magnitudes(np.zeros(0), None) is None


def test_moments_and_normalize_warn_of_nothing():
    """Overflow and NaN in the fit's sums and in normalize are results the callers check (FitError, the output
    check), not warnings on stderr."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cpu.moments(np.array([1e308, -1e308, 1e308]), None)[2] == math.inf
        assert math.isnan(cpu.moments(np.array([1.0, np.inf]), None)[2])
        assert cpu.normalize(np.array([1e308]), -1e308, 1e-10).tolist() == [math.inf]


def test_fill_clamp_log1p_normalize():
    vals = np.array([5, -3, 0, 2**40, 7], np.int64)
    valid = np.array([True, True, False, True, True])
    filled = cpu.fill_null(vals, valid, 0.5)
    assert filled.dtype == np.float64
    assert filled.tolist() == [5.0, -3.0, 0.5, float(2**40), 7.0]
    assert vals[2] == 0  # input untouched
    assert cpu.fill_null(vals, None, 9.0).tolist() == [float(x) for x in vals.tolist()]
    c = cpu.clamp(filled, 0.0, None)
    assert c.tolist() == [max(x, 0.0) for x in filled.tolist()]
    assert cpu.clamp(filled, None, 6.0).tolist() == [min(x, 6.0) for x in filled.tolist()]
    assert cpu.clamp(filled, -1.0, 1.0).tolist() == [min(max(x, -1.0), 1.0) for x in filled.tolist()]
    lg = cpu.log1p(c)
    assert lg.tolist() == [math.log1p(x) for x in c.tolist()]
    nm = cpu.normalize(c, 2.0, 4.0)
    assert nm.tolist() == [(x - 2.0) / 4.0 for x in c.tolist()]
