"""Every op on small batches against plain-Python references (hash formulas from etl.backends.hashing,
which test_hashing.py checks against an independent implementation)."""

from __future__ import annotations

import bisect
import inspect
import math
import random
import re
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import yaml

from etl.backends import cpu, hashing
from etl.batch import Batch, Column
from etl.io.parquet import column_from_arrow
from etl.ops import REGISTRY, InvalidRows
from etl.ops.categorical import Categorify, Decode, Hash, HashedCross
from etl.ops.dense import Bucketize, Clamp, FillMissing, Log1p, Normalize
from etl.ops.lists import FirstX
from etl.pipeline.groupby import PARAMS as GROUPBY_PARAMS
from etl.pipeline.groupby import Groupby
from etl.pipeline.stages import REGISTRY as STAGES
from etl.schema import ColumnSpec

M64 = 2**64
XP = cpu


# ---------------------------------------------------------------- helpers


def spec(name, role="categorical", dtype="string", encoding="hex", width=None, separator=None):
    if role == "list" and separator is None:
        separator = "|"
    return ColumnSpec(name, role, dtype, encoding, width, separator)


def col_from(items, s: ColumnSpec, arrow_type=None) -> Column:
    if arrow_type is None:
        base = {"string": pa.string(), "int64": pa.int64(), "float64": pa.float64()}[s.dtype]
        arrow_type = pa.list_(base) if s.is_list else base
    return column_from_arrow(pa.array(items, arrow_type), s)


def batch_of(**cols: Column) -> Batch:
    n = len(next(iter(cols.values())))
    return Batch(dict(cols), n)


def bound(op, *specs: ColumnSpec):
    op.bind({s.name: s for s in specs})
    return op


def values_of(col: Column, i: int):
    """Python view of row i of a non-list column (None when missing)."""
    if col.valid is not None and not col.valid[i]:
        return None
    return col.values[i].item()


def rows_of(col: Column) -> list[list]:
    return [col.values[col.offsets[i] : col.offsets[i + 1]].tolist() for i in range(len(col))]


def fit(op, batches):
    stats = op.new_stats(XP)
    for b in batches:
        op.partial_fit(stats, b, XP)
    op.finalize(stats, XP)
    return op


def fit_in_order(op, batches, order):
    """Fit with the batches in the given order (fitting threads update a column's accumulator in any order)."""
    return fit(op, [batches[i] for i in order])


def ref_hash_id(key: int, seed: int, n: int) -> int:
    return 2 + hashing.reduce(hashing.hash64(key, seed), n)


def test_registry_has_every_op():
    assert set(REGISTRY) == {"FillMissing", "Clamp", "Log1p", "Normalize", "Bucketize", "Decode", "Hash",
                             "Categorify", "HashedCross", "FirstX", "DateParts", "History", "TargetEncode", "Expr"}  # fmt: skip
    for name, cls in REGISTRY.items():
        assert cls.name == name


# ---------------------------------------------------------------- FillMissing / Clamp / Log1p


DENSE = [5, None, -3, 0, None, 2**40, 7]


@pytest.mark.parametrize("value", [0, 0.5, -1])
def test_fill_missing(value):
    for dtype in ("int64", "float64"):
        s = spec("x", "dense", dtype, None)
        b = batch_of(x=col_from(DENSE, s))
        out = FillMissing(["x"], value=value).transform(b, XP)["x"]
        assert out.valid is None and out.values.dtype == np.float64
        assert out.values.tolist() == [float(value) if v is None else float(v) for v in DENSE]


def test_fill_missing_nan_raises_invalid_rows_with_mask():
    items = [1.0, float("nan"), None, float("inf"), -float("inf"), 2.0]
    s = spec("x", "dense", "float64", None)
    b = batch_of(x=col_from(items, s), y=col_from([1.0] * 6, s))
    with pytest.raises(InvalidRows) as ei:
        FillMissing(["y", "x"]).transform(b, XP)
    assert ei.value.column == "x"
    assert ei.value.mask.tolist() == [False, True, False, True, True, False]
    assert "NaN" in ei.value.reason


def test_fill_missing_nan_under_null_is_fine():
    vals = np.array([1.0, np.nan])
    out = FillMissing(["x"], 3).transform(batch_of(x=Column(vals, np.array([True, False]))), XP)["x"]
    assert out.values.tolist() == [1.0, 3.0]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), "0", None, True, [0]])
def test_fill_missing_bad_value(value):
    with pytest.raises(ValueError):
        FillMissing(["x"], value=value)


@pytest.mark.parametrize("lo,hi", [(0, None), (None, 6), (-1, 1), (2, 2)])
def test_clamp(lo, hi):
    s = spec("x", "dense", "int64", None)
    c = col_from(DENSE, s)
    out = Clamp(["x"], min=lo, max=hi).transform(batch_of(x=c), XP)["x"]
    assert out.valid.tolist() == [v is not None for v in DENSE]
    for i, v in enumerate(DENSE):
        if v is not None:
            ref = float(v)
            if lo is not None:
                ref = max(ref, lo)
            if hi is not None:
                ref = min(ref, hi)
            assert out.values[i] == ref


def test_clamp_validation():
    with pytest.raises(ValueError):
        Clamp(["x"])
    with pytest.raises(ValueError):
        Clamp(["x"], min=2, max=1)


def test_log1p_and_dlrm_chain():
    s = spec("x", "dense", "int64", None)
    b = batch_of(x=col_from(DENSE, s))
    for op in (FillMissing(["x"], 0), Clamp(["x"], min=0), Log1p(["x"])):
        b = b.with_columns(op.transform(b, XP))
    ref = [math.log1p(max(0 if v is None else v, 0)) for v in DENSE]
    assert b["x"].values.tolist() == ref
    assert b["x"].values.astype(np.float32).tolist() == np.array(ref, np.float32).tolist()
    out = Log1p(["x"]).transform(batch_of(x=col_from([1.0, None, 0.0], spec("x", "dense", "float64", None))), XP)["x"]
    assert out.valid.tolist() == [True, False, True] and out.values[0] == math.log1p(1.0) and out.values[2] == 0.0


# ---------------------------------------------------------------- Normalize


def _dense_batches(rng: np.random.Generator, n_batches=5, loc=100.0, scale=30.0):
    out = []
    for _ in range(n_batches):
        n = int(rng.integers(1, 60))
        v = rng.normal(loc, scale, n)
        valid = rng.random(n) > 0.2
        out.append(batch_of(x=Column(v, valid), k=Column(rng.integers(-50, 50, n).astype(np.int64))))
    return out


def test_normalize_fit_matches_numpy_population_std():
    rng = np.random.default_rng(0)
    batches = _dense_batches(rng)
    op = fit(Normalize(["x", "k"]), batches)
    xs = np.concatenate([b["x"].values[b["x"].valid] for b in batches])
    ks = np.concatenate([b["k"].values for b in batches]).astype(np.float64)
    assert op.mean["x"] == pytest.approx(xs.mean(), rel=1e-12)
    assert op.std["x"] == pytest.approx(xs.std(ddof=0), rel=1e-9)
    assert op.mean["k"] == pytest.approx(ks.mean(), rel=1e-12, abs=1e-12)
    assert op.std["k"] == pytest.approx(ks.std(ddof=0), rel=1e-9)
    out = op.transform(batches[0], XP)
    b0 = batches[0]["x"]
    for i in range(len(b0)):
        if b0.valid[i]:
            assert out["x"].values[i] == pytest.approx((b0.values[i] - xs.mean()) / xs.std(), rel=1e-9, abs=1e-12)
    assert out["x"].valid.tolist() == b0.valid.tolist()


def test_normalize_fit_is_order_invariant():
    rng = np.random.default_rng(1)
    batches = _dense_batches(rng, 7)
    a = fit(Normalize(["x"]), batches)
    b = fit_in_order(Normalize(["x"]), batches, [6, 2, 0, 5, 4, 3, 1])
    c = fit_in_order(Normalize(["x"]), batches, [1, 3, 5, 0, 2, 4, 6])
    assert a.mean == b.mean == c.mean and a.std == b.std == c.std


def test_normalize_constant_column_divides_by_one():
    op = fit(Normalize(["x"]), [batch_of(x=Column(np.full(4, 3.0)))])
    assert op.mean == {"x": 3.0} and op.std == {"x": 1.0}
    assert op.transform(batch_of(x=Column(np.array([3.0, 5.0]))), XP)["x"].values.tolist() == [0.0, 2.0]


def test_normalize_no_values_raises():
    op = Normalize(["x"])
    with pytest.raises(ValueError, match="'x'"):
        fit(op, [batch_of(x=Column(np.array([1.0, 2.0]), np.array([False, False])))])


def test_normalize_state_round_trip():
    op = fit(Normalize(["x"]), _dense_batches(np.random.default_rng(2)))
    doc, tables = op.state()
    assert tables == {}
    op2 = Normalize(["x"])
    assert not op2.is_fitted
    op2.load_state(doc, tables)
    assert op2.is_fitted and op2.mean == op.mean and op2.std == op.std


def test_normalize_state_keeps_the_collapse_warning():
    values = np.array([float(v) for v in range(1, 51)] + [1e39])
    op = fit(Normalize(["x", "k"]), [batch_of(x=Column(values), k=Column(np.arange(51.0)))])
    doc, tables = op.state()
    assert sorted(doc) == ["mean", "std", "warnings"] and list(doc["warnings"]) == ["x"]
    op2 = Normalize(["x", "k"])
    op2.load_state(doc, tables)
    assert op2.fit_warnings() == op.fit_warnings() and op2.fit_warnings()[0].startswith("Normalize: column 'x': normalized values collapse")
    for bad in ({"y": "text"}, {"x": 1}, ["x"]):
        with pytest.raises(ValueError, match="Normalize: warnings is"):
            Normalize(["x", "k"]).load_state({**doc, "warnings": bad}, tables)
    assert sorted(fit(Normalize(["k"]), [batch_of(k=Column(np.arange(51.0)))]).state()[0]) == ["mean", "std"]  # no warning, no key


def test_normalize_std_with_large_offset():
    """No catastrophic cancellation for values with a large offset (epoch timestamps, ms timestamps)."""
    rng = np.random.default_rng(4)
    for v in (1e9 + np.array([0.0, 1.0, 2.0]), 1.7e12 + rng.normal(0, 1e3, 500), 1e8 + np.array([0.1, 0.2, 0.3])):
        batches = [batch_of(x=Column(part)) for part in np.array_split(v, 3)]
        op = fit(Normalize(["x"]), batches)
        assert op.mean["x"] == pytest.approx(v.mean(), rel=1e-14)
        assert op.std["x"] == pytest.approx(v.std(), rel=1e-6)


# ---------------------------------------------------------------- Bucketize


def test_bucketize():
    bounds = [0.0, 1.5, 10.0]
    items = [-5.0, 0.0, 1.0, 1.5, None, 9.99, 10.0, 1e9]
    op = Bucketize(["x"], boundaries=bounds)
    out = op.transform(batch_of(x=col_from(items, spec("x", "dense", "float64", None))), XP)["x"]
    assert out.values.dtype == np.int32 and out.valid is None
    assert out.values.tolist() == [1 if v is None else 2 + bisect.bisect_right(bounds, v) for v in items]
    assert op.cardinalities() == {"x": 6}
    assert max(out.values) < 6


@pytest.mark.parametrize("bounds", [[], [1.0, 1.0], [2.0, 1.0], [[1.0, 2.0]]])
def test_bucketize_validation(bounds):
    with pytest.raises(ValueError):
        Bucketize(["x"], boundaries=bounds)


# ---------------------------------------------------------------- Decode


def test_decode_hex_column():
    s = spec("c", width=8)
    items = ["68fd1e64", None, "0000000A", "ffffffff"]
    op = bound(Decode(["c"]), s)
    out = op.transform(batch_of(c=col_from(items, s)), XP)["c"]
    assert out.values.dtype == np.uint64
    assert out.valid.tolist() == [True, False, True, True]
    assert [values_of(out, i) for i in range(4)] == [0x68FD1E64, None, 10, 0xFFFFFFFF]
    assert out.offsets is None and out.raw is None


def test_decode_int_column_and_int_text():
    s = spec("u", dtype="int64", encoding="int")
    op = bound(Decode(["u"]), s)
    out = op.transform(batch_of(u=col_from([1, -1, None, 2**63 - 1], s)), XP)["u"]
    assert [values_of(out, i) for i in range(4)] == [1, 2**64 - 1, None, 2**63 - 1]
    s2 = spec("t", dtype="string", encoding="int")
    op2 = bound(Decode(["t"]), s2)
    out2 = op2.transform(batch_of(t=col_from(["1", "-1", None, "+42"], s2)), XP)["t"]
    assert [values_of(out2, i) for i in range(4)] == [1, 2**64 - 1, None, 42]
    with pytest.raises(InvalidRows) as ei:
        op2.transform(batch_of(t=col_from(["1", "x1", None, "1.0"], s2)), XP)
    assert ei.value.mask.tolist() == [False, True, False, True] and "int text" in ei.value.reason


def test_decode_int_text_keeps_unsigned_64_bit_ids_exact():
    s = spec("t", dtype="string", encoding="int")
    op = bound(Decode(["t"]), s)
    items = [str(2**64 - 1), str(2**63), "10000169349117863715", "-1", str(-(2**63)), None]
    out = op.transform(batch_of(t=col_from(items, s)), XP)["t"]
    assert [values_of(out, i) for i in range(6)] == [2**64 - 1, 2**63, 10000169349117863715, 2**64 - 1, 2**63, None]
    with pytest.raises(InvalidRows) as ei:
        op.transform(batch_of(t=col_from(["1", str(2**64), str(-(2**63) - 1), "7"], s)), XP)
    assert ei.value.mask.tolist() == [False, True, True, False] and "[-2**63, 2**64 - 1]" in ei.value.reason


def test_decode_string_keeps_raw():
    s = spec("g", encoding="string")
    items = ["Comedy", None, "Drama", "Comedy"]
    out = bound(Decode(["g"]), s).transform(batch_of(g=col_from(items, s)), XP)["g"]
    for i, x in enumerate(items):
        assert values_of(out, i) == (None if x is None else hashing.string_key(x.encode()))
    assert out.raw.to_list()[0] == "Comedy" and out.raw.to_list()[2] == "Drama"


def test_decode_malformed_hex_raises_with_row_mask():
    s = spec("c", width=8)
    items = ["68fd1e64", "zz123456", None, "123456789", "1234567", "abcdef01"]
    with pytest.raises(InvalidRows) as ei:
        bound(Decode(["c"]), s).transform(batch_of(c=col_from(items, s)), XP)
    e = ei.value
    assert e.column == "c" and e.mask.tolist() == [False, True, False, True, True, False]
    assert "8 hex digits" in e.reason


def test_decode_list_column_keeps_offsets():
    s = spec("g", "list", encoding="hex")
    rows = [["a", "ff"], None, [], ["10", None, "7"]]
    out = bound(Decode(["g"]), s).transform(batch_of(g=col_from(rows, s)), XP)["g"]
    assert out.offsets.tolist() == [0, 2, 2, 2, 5]
    assert out.values.dtype == np.uint64
    assert out.valid.tolist() == [True, True, True, False, True]
    got = [None if not out.valid[i] else int(out.values[i]) for i in range(5)]
    assert got == [0xA, 0xFF, 0x10, None, 7]


def test_decode_list_string_keeps_raw_per_element():
    s = spec("g", "list", encoding="string")
    rows = [["Action", "Comedy"], ["Drama"]]
    out = bound(Decode(["g"]), s).transform(batch_of(g=col_from(rows, s)), XP)["g"]
    assert out.raw.to_list() == ["Action", "Comedy", "Drama"]
    assert out.values.tolist() == [hashing.string_key(x.encode()) for x in ("Action", "Comedy", "Drama")]


def test_decode_list_bad_row_if_any_element_bad():
    s = spec("g", "list", encoding="hex", width=2)
    rows = [["0a", "ff"], [], ["zz", "01"], None, ["01", "0102"], ["ab"]]
    with pytest.raises(InvalidRows) as ei:
        bound(Decode(["g"]), s).transform(batch_of(g=col_from(rows, s)), XP)
    assert ei.value.mask.tolist() == [False, False, True, False, True, False]


def test_decode_list_bad_element_with_trailing_empty_list():
    s = spec("g", "list", encoding="hex", width=2)
    rows = [["0a", "zz"], []]
    with pytest.raises(InvalidRows) as ei:
        bound(Decode(["g"]), s).transform(batch_of(g=col_from(rows, s)), XP)
    assert ei.value.mask.tolist() == [True, False]


def test_decode_hex_on_int_values_is_error():
    s = spec("c", dtype="string", encoding="hex")
    with pytest.raises(ValueError):
        bound(Decode(["c"]), s).transform(batch_of(c=Column(np.array([1, 2], np.int64))), XP)


# ---------------------------------------------------------------- Hash


@pytest.mark.parametrize("n,seed", [(1, 0), (10, 0), (1000, 7), (2**31, 1)])
def test_hash(n, seed):
    rng = np.random.default_rng(n)
    keys = rng.integers(0, 2**64 - 1, 200, dtype=np.uint64, endpoint=True)
    keys[:4] = [0, 2**63, 2**64 - 1, 2**32 - 1]
    valid = rng.random(200) > 0.1
    op = Hash(["c"], num_buckets=n, seed=seed)
    out = op.transform(batch_of(c=Column(keys, valid)), XP)["c"]
    assert out.valid is None and out.offsets is None
    assert out.values.dtype == (np.int32 if n + 2 <= 2**31 - 1 else np.int64)
    assert out.values.tolist() == [ref_hash_id(int(k), seed, n) if v else 1 for k, v in zip(keys, valid)]
    assert op.cardinalities() == {"c": n + 2}


def test_hash_list_keeps_offsets():
    keys = np.array([5, 6, 7, 8], np.uint64)
    offs = np.array([0, 2, 2, 4])
    out = Hash(["g"], num_buckets=50, seed=3).transform(batch_of(g=Column(keys, np.array([1, 1, 0, 1], bool), offs)), XP)["g"]
    assert out.offsets.tolist() == [0, 2, 2, 4]
    assert out.values.tolist() == [ref_hash_id(5, 3, 50), ref_hash_id(6, 3, 50), 1, ref_hash_id(8, 3, 50)]


@pytest.mark.parametrize("kw", [dict(num_buckets=0), dict(num_buckets=2**31 + 1), dict(num_buckets=2.5),
                                dict(num_buckets=10, seed=-1), dict(num_buckets=10, seed="1")])  # fmt: skip
def test_hash_validation(kw):
    with pytest.raises(ValueError):
        Hash(["c"], **kw)


def test_hash_on_raw_values_is_error():
    s = spec("c")
    with pytest.raises(ValueError, match="Decode"):
        Hash(["c"], num_buckets=10).transform(batch_of(c=col_from(["ab"], s)), XP)


# ---------------------------------------------------------------- HashedCross


def _cross_batch():
    a = Column(np.array([1, 2, 3, 2**64 - 1, 5], np.uint64), np.array([1, 1, 0, 1, 1], bool))
    b = Column(np.array([10, 20, 30, 40, 0], np.uint64), np.array([1, 0, 1, 1, 1], bool))
    c = Column(np.array([7, 7, 7, 7, 7], np.uint64))
    return batch_of(a=a, b=b, c=c)


def test_hashed_cross_shape_and_nulls():
    op = HashedCross(["a", "b"], num_buckets=100, seed=2)
    assert op.outputs == ["a_x_b"] and op.cardinalities() == {"a_x_b": 102}
    out = op.transform(_cross_batch(), XP)
    assert list(out) == ["a_x_b"]
    ids = out["a_x_b"].values
    assert ids.dtype == np.int32 and out["a_x_b"].valid is None
    assert ids[1] == 1 and ids[2] == 1  # any input missing → 1
    assert all(2 <= x < 102 for x in ids[[0, 3, 4]])
    named = HashedCross(["a", "b", "c"], num_buckets=100, name="abc")
    assert named.outputs == ["abc"] and list(named.transform(_cross_batch(), XP)) == ["abc"]


def test_hashed_cross_documented_formula():
    b = _cross_batch()
    op = HashedCross(["a", "b", "c"], num_buckets=1000, seed=4)
    ids = op.transform(b, XP)["a_x_b_x_c"].values
    for i in (0, 3, 4):
        keys = [int(b[c].values[i]) for c in ("a", "b", "c")]
        assert ids[i] == 2 + hashing.reduce(hashing.cross_key(keys, 4), 1000)


def test_hashed_cross_negative_seed_rejected():
    with pytest.raises(ValueError):
        HashedCross(["a", "b"], num_buckets=10, seed=-1)


def test_hashed_cross_validation():
    with pytest.raises(ValueError):
        HashedCross(["a"], num_buckets=10)
    with pytest.raises(ValueError):
        HashedCross(["a", "b"], num_buckets=0)
    b = _cross_batch().with_columns({"l": Column(np.array([1, 2, 3, 4, 5], np.uint64), None, np.array([0, 1, 2, 3, 4, 5]))})
    with pytest.raises(ValueError, match="list"):
        HashedCross(["a", "l"], num_buckets=10).transform(b, XP)


# ---------------------------------------------------------------- Categorify


def _cat_batches(seed=0, n_batches=6, pool=40, width=8):
    """Zipf-ish hex keys with nulls; returns (batches, specs, Counter of keys, null count)."""
    rng = random.Random(seed)
    s = spec("c", width=width)
    batches, cnt, nulls = [], Counter(), 0
    for _ in range(n_batches):
        items = []
        for _ in range(rng.randrange(5, 60)):
            if rng.random() < 0.1:
                items.append(None)
                nulls += 1
            else:
                r = min(int(rng.paretovariate(1.0)), pool)
                h = f"{r * 0x9E3779B1 % 16**width:0{width}x}"
                items.append(h.upper() if rng.random() < 0.3 else h)
                cnt[int(h, 16)] += 1
        b = batch_of(c=col_from(items, s))
        batches.append(b.with_columns(bound(Decode(["c"]), s).transform(b, XP)))
    return batches, s, cnt, nulls


def ref_vocab(cnt: Counter, t: int, max_size, B: int) -> dict[int, int]:
    kept = sorted((-c, k) for k, c in cnt.items() if c >= t)
    if max_size is not None:
        kept = kept[:max_size]
    return {k: 2 + B + i for i, (_, k) in enumerate(kept)}


@pytest.mark.parametrize("t,max_size,B,seed", [(1, None, 1, 0), (3, None, 1, 0), (2, 5, 3, 9), (1, 0, 2, 1), (1000, None, 4, 2)])
def test_categorify_semantics(t, max_size, B, seed):
    batches, s, cnt, nulls = _cat_batches(seed=t + B)
    op = bound(Categorify(["c"], freq_threshold=t, max_size=max_size, oov_buckets=B, seed=seed), s)
    fit(op, batches)
    vocab = ref_vocab(cnt, t, max_size, B)
    v = op.vocab["c"]
    assert v.column_names == ["key", "raw", "count", "id"]
    assert v.schema.field("key").type == pa.uint64() and v.schema.field("id").type == pa.int64()
    assert v.column("key").to_pylist() == list(vocab)
    assert v.column("id").to_pylist() == list(vocab.values())
    assert v.column("count").to_pylist() == [cnt[k] for k in vocab]
    assert v.column("raw").to_pylist() == [f"{k:08x}" for k in vocab]
    assert v.schema.metadata[b"nulls"] == str(nulls).encode()
    assert op.cardinalities() == {"c": 2 + B + len(vocab)}
    if t > 1:
        assert any(c < t for c in cnt.values())  # the threshold really drops something

    unseen = [0, 2**64 - 1, 123456789, 2**63]
    keys = np.array(list(cnt) + unseen, np.uint64)
    valid = np.array([True] * len(keys) + [False])
    keys = np.append(keys, np.uint64(5))
    out = op.transform(batch_of(c=Column(keys, valid)), XP)["c"]
    assert out.values.dtype == np.int32 and out.valid is None
    for i, k in enumerate(keys.tolist()):
        if not valid[i]:
            want = 1
        elif k in vocab:
            want = vocab[k]
        else:
            want = 2 + hashing.reduce(hashing.hash64(k, seed), B)
        assert out.values[i] == want, (i, k)
        assert 1 <= out.values[i] < op.cardinalities()["c"]


def test_categorify_ties_by_key_ascending():
    keys = np.array([9, 3, 7, 3, 9, 7, 1, 2**64 - 1, 2**63], np.uint64)
    op = bound(Categorify(["c"]), spec("c", width=None))
    fit(op, [batch_of(c=Column(keys))])
    assert op.vocab["c"].column("key").to_pylist() == [3, 7, 9, 1, 2**63, 2**64 - 1]
    assert op.vocab["c"].column("id").to_pylist() == [3, 4, 5, 6, 7, 8]
    # hex without a schema width renders 16 lowercase digits
    assert op.vocab["c"].column("raw").to_pylist() == [f"{k:016x}" for k in (3, 7, 9, 1, 2**63, 2**64 - 1)]


def test_categorify_threads_transforming_at_once_build_the_lookup_tables_once(monkeypatch):
    keys = np.array([9, 3, 7, 3, 9, 7], np.uint64)
    op = fit(bound(Categorify(["c"]), spec("c", width=None)), [batch_of(c=Column(keys))])
    builds, real = [], XP.LookupTables

    def slow_build(tables):
        builds.append(tables)
        time.sleep(0.05)  # the other thread arrives while this one builds
        return real(tables)

    monkeypatch.setattr(XP, "LookupTables", slow_build)
    start = threading.Barrier(2)
    outs: list[np.ndarray] = []

    def transform() -> None:
        start.wait()
        outs.append(op.transform(batch_of(c=Column(keys)), XP)["c"].values)

    threads = [threading.Thread(target=transform) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1
    assert len(outs) == 2 and np.array_equal(outs[0], outs[1])


def test_categorify_vocabulary_table_is_exactly_the_documented_table():
    # counts 2, 2, 2, 1, 1 (ties broken by key ascending) and one missing value
    keys = np.array([9, 3, 7, 3, 9, 7, 2**64 - 1, 0, 5], np.uint64)
    op = fit(bound(Categorify(["c"]), spec("c", width=None)), [batch_of(c=Column(keys, np.arange(9) != 8))])
    expected = pa.table(
        {
            "key": pa.array([3, 7, 9, 0, 2**64 - 1], pa.uint64()),
            "raw": pa.array([f"{k:016x}" for k in (3, 7, 9, 0, 2**64 - 1)], pa.string()),
            "count": pa.array([2, 2, 2, 1, 1], pa.int64()),
            "id": pa.array([3, 4, 5, 6, 7], pa.int64()),
        }
    ).replace_schema_metadata({"nulls": "1"})
    assert op.vocab["c"].equals(expected, check_metadata=True)
    assert [c.num_chunks for c in op.vocab["c"].columns] == [1, 1, 1, 1]


def test_categorify_fit_is_order_invariant():
    batches, s, _, _ = _cat_batches(seed=5, n_batches=8)
    mk = lambda: bound(Categorify(["c"], freq_threshold=2, oov_buckets=2), s)  # noqa: E731
    a = fit(mk(), batches)
    b = fit_in_order(mk(), batches, [7, 1, 3, 0, 5, 2, 6, 4])
    c = fit_in_order(mk(), batches[::-1], [0, 1, 2, 3, 4, 5, 6, 7])
    assert a.vocab["c"].equals(b.vocab["c"]) and a.vocab["c"].equals(c.vocab["c"])
    assert a.vocab["c"].schema.metadata == b.vocab["c"].schema.metadata


def test_categorify_int_keys_raw_is_signed_decimal():
    s = spec("u", dtype="int64", encoding="int")
    b = batch_of(u=col_from([-1, 5, -1, None, 2**63 - 1, 5, -1], s))
    b = b.with_columns(bound(Decode(["u"]), s).transform(b, XP))
    op = fit(bound(Categorify(["u"]), s), [b])
    assert op.vocab["u"].column("raw").to_pylist() == ["-1", "5", str(2**63 - 1)]
    assert op.vocab["u"].column("key").to_pylist() == [2**64 - 1, 5, 2**63 - 1]


def test_categorify_list_column_string_raw():
    s = spec("g", "list", encoding="string")
    rows = [["Comedy", "Drama"], None, ["Drama"], ["Action", "Drama", "Comedy"], []]
    b = batch_of(g=col_from(rows, s))
    b = b.with_columns(bound(Decode(["g"]), s).transform(b, XP))
    op = fit(bound(Categorify(["g"], oov_buckets=1), s), [b])
    assert op.vocab["g"].column("raw").to_pylist() == sorted(["Drama", "Comedy", "Action"],
        key=lambda x: (-sum(r.count(x) for r in rows if r), hashing.string_key(x.encode())))  # fmt: skip
    assert op.vocab["g"].column("raw").to_pylist()[0] == "Drama"
    ids = {r: i for r, i in zip(op.vocab["g"].column("raw").to_pylist(), op.vocab["g"].column("id").to_pylist())}
    out = op.transform(b, XP)["g"]
    assert out.offsets.tolist() == [0, 2, 2, 3, 6, 6]
    assert rows_of(out) == [[ids[x] for x in r] for r in [rows[0], [], rows[2], rows[3], []]]


def test_categorify_list_null_elements_get_1():
    keys = np.array([4, 4, 9], np.uint64)
    col = Column(keys, np.array([True, False, True]), np.array([0, 2, 3]))
    op = fit(bound(Categorify(["g"]), spec("g", "list", encoding="int", dtype="int64")), [batch_of(g=col)])
    out = op.transform(batch_of(g=col), XP)["g"]
    assert rows_of(out) == [[3, 1], [4]]


def test_categorify_state_round_trip():
    batches, s, _, _ = _cat_batches(seed=3)
    op = fit(bound(Categorify(["c"], oov_buckets=3, seed=5), s), batches)
    doc, tables = op.state()
    op2 = bound(Categorify(["c"], oov_buckets=3, seed=5), s)
    assert not op2.is_fitted
    op2.load_state(doc, tables)
    assert op2.cardinalities() == op.cardinalities() == doc["cardinalities"]
    for b in batches:
        assert op2.transform(b, XP)["c"].values.tolist() == op.transform(b, XP)["c"].values.tolist()
    with pytest.raises(ValueError):
        Categorify(["c"]).load_state(doc, {})
    with pytest.raises(ValueError):
        Categorify(["c"]).load_state(doc, {"c": tables["c"].select(["key", "id"])})


@pytest.mark.parametrize("kw", [dict(freq_threshold=0), dict(freq_threshold=1.5), dict(max_size=-1), dict(max_size=2.0),
                                dict(oov_buckets=0), dict(oov_buckets=2**31 + 1), dict(oov_buckets="2")])  # fmt: skip
def test_categorify_validation(kw):
    with pytest.raises(ValueError):
        Categorify(["c"], **kw)


def test_categorify_negative_seed_rejected():
    with pytest.raises(ValueError):
        Categorify(["c"], seed=-1)


def test_categorify_on_raw_is_error():
    s = spec("c")
    op = bound(Categorify(["c"]), s)
    with pytest.raises(ValueError, match="Decode"):
        op.partial_fit(op.new_stats(XP), batch_of(c=col_from(["ab"], s)), XP)


# ---------------------------------------------------------------- FirstX


@pytest.mark.parametrize("x", [1, 2, 3])
def test_first_x_on_raw_keys_and_ids(x):
    s = spec("g", "list", encoding="string")
    rows = [["a", "b", "c", "d"], None, ["e"], [None, "f", "g"], []]
    col = col_from(rows, s)
    out = FirstX(["g"], x=x).transform(batch_of(g=col), XP)["g"]
    ref_rows = [(r or [])[:x] for r in rows]
    got = out.values.to_list()
    assert [got[out.offsets[i] : out.offsets[i + 1]] for i in range(5)] == [[y or "" for y in r] for r in ref_rows]
    assert out.valid.tolist() == [y is not None for r in ref_rows for y in r]
    # on decoded keys (with raw kept)
    dec = bound(Decode(["g"]), s).transform(batch_of(g=col), XP)["g"]
    out2 = FirstX(["g"], x=x).transform(batch_of(g=dec), XP)["g"]
    assert out2.raw.to_list() == [y or "" for r in ref_rows for y in r]
    assert out2.offsets.tolist() == out.offsets.tolist()
    # on ids
    ids = Column(np.arange(10, 18, dtype=np.int32), None, np.array([0, 4, 4, 5, 8, 8]))
    out3 = FirstX(["g"], x=x).transform(batch_of(g=ids), XP)["g"]
    assert rows_of(out3) == [list(range(10, 14))[:x], [], [14], [15, 16, 17][:x], []]
    assert out3.valid is None


def test_first_x_validation():
    for x in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError):
            FirstX(["g"], x=x)
    with pytest.raises(ValueError, match="not a list"):
        FirstX(["g"], x=2).transform(batch_of(g=Column(np.array([1, 2]))), XP)


def test_bind_keeps_only_schema_columns():
    op = Decode(["a", "new"])
    sa = spec("a")
    op.bind({"a": sa, "b": spec("b")})
    assert op.specs == {"a": sa}


# ---------------------------------------------------------------- documentation


def test_every_op_and_parameter_is_documented_with_a_valid_example():
    """pipelines/README.md has a section per op (and per reshaping stage, Groupby included) naming each of its
    parameters, and every op line in it builds."""
    text = (Path(__file__).resolve().parents[3] / "pipelines" / "README.md").read_text()
    sections = dict(re.findall(r"^### (\w+)\n(.*?)(?=^##)", text + "\n##", flags=re.S | re.M))
    assert set(sections) == set(REGISTRY) | set(STAGES) | {Groupby.name}
    assert all(f"`{p}`" in sections[Groupby.name] for p in GROUPBY_PARAMS)
    for name, cls in REGISTRY.items():
        params = [p.name for p in inspect.signature(cls.__init__).parameters.values()
                  if p.name not in ("self", "columns") and p.kind != p.VAR_KEYWORD]  # fmt: skip
        assert all(f"`{p}`" in sections[name] for p in params), name
    examples = re.findall(r"^- (\{op: .*\})", text, flags=re.M)
    assert {yaml.safe_load(e)["op"] for e in examples} == set(REGISTRY)
    for e in examples:
        doc = yaml.safe_load(e)
        cls = REGISTRY[doc.pop("op")]
        cols = doc.pop("columns") if "columns" in doc else cls.implied_columns(doc)  # Expr: the expression's columns
        cls(cols if isinstance(cols, list) else [cols], **doc)


# ---------------------------------------------------------------- columnwise ops on some of their columns


def _columnwise_cases() -> list[tuple[object, dict[str, Column]]]:
    """Each columnwise op of the registry on three columns (fitted when it fits), with a batch of them."""
    rng = np.random.default_rng(5)
    numbers = {c: Column(rng.normal(3, 2, 40), rng.random(40) < 0.8) for c in "abc"}
    keys = {c: Column(rng.integers(0, 6, 40).astype(np.uint64), rng.random(40) < 0.9) for c in "abc"}
    hexes = {c: col_from([f"{k:08x}" if k % 7 else None for k in rng.integers(0, 50, 40)], spec(c, width=8)) for c in "abc"}
    filled = {c: Column(np.nan_to_num(v.values)) for c, v in numbers.items()}
    cols = ["a", "b", "c"]
    return [
        (FillMissing(cols, value=1.5), {c: Column(v.values, v.valid) for c, v in numbers.items()}),
        (Clamp(cols, min=2.0, max=4.0), numbers),
        (Log1p(cols), {c: Column(np.abs(v.values), v.valid) for c, v in numbers.items()}),
        (fit(Normalize(cols), [batch_of(**filled)]), filled),
        (Bucketize(cols, boundaries=[1.0, 3.0, 5.0]), numbers),
        (bound(Decode(cols), *(spec(c, width=8) for c in cols)), hexes),
        (Hash(cols, num_buckets=17, seed=3), keys),
        (fit(bound(Categorify(cols, freq_threshold=2), *(spec(c) for c in cols)), [batch_of(**keys)]), keys),
        (FirstX(cols, x=2), {c: Column(np.arange(9, dtype=np.uint64), None, np.array([0, 3, 3, 9])) for c in cols}),
    ]


def test_the_columnwise_ops_are_those_tested_here() -> None:
    assert sorted(name for name, cls in REGISTRY.items() if cls.columnwise) == sorted(type(op).name for op, _ in _columnwise_cases())


@pytest.mark.parametrize("case", range(9))
def test_a_columnwise_op_on_some_columns_gives_them_the_values_of_the_whole_op(case: int) -> None:
    op, cols = _columnwise_cases()[case]
    whole = op.transform(batch_of(**cols), XP)
    part = op.on_columns(["c", "a", "zz"])
    assert part.columns == ["a", "c"]  # the op's order; columns it does not transform are left out
    assert op.columns == ["a", "b", "c"]  # the op itself is left whole
    got = part.transform(batch_of(a=cols["a"], c=cols["c"]), XP)  # "b" is not needed
    assert sorted(got) == ["a", "c"]
    for c in got:
        assert np.array_equal(got[c].values, whole[c].values)
        assert (got[c].valid is None) == (whole[c].valid is None)
        if got[c].valid is not None:
            assert np.array_equal(got[c].valid, whole[c].valid)


def test_on_columns_of_an_op_that_is_not_columnwise_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="not columnwise"):
        HashedCross(["a", "b"], num_buckets=10).on_columns(["a"])


def test_copies_of_categorify_on_the_same_columns_share_their_lookup_tables() -> None:
    keys = Column(np.arange(10, dtype=np.uint64) % 4)
    op = fit(bound(Categorify(["a", "b"]), spec("a"), spec("b")), [batch_of(a=keys, b=keys)])
    one, two = op.on_columns(["b"]), op.on_columns(["b"])
    assert two._lookup_tables(XP) is one._lookup_tables(XP)  # built once for the copies on ["b"]
    assert op._lookup_tables(XP) is not one._lookup_tables(XP)  # the whole op's tables are its own
