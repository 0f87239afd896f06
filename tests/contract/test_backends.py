"""Every op on every available backend gives the same bits.

Backends: the CPU backend (numpy + numba, the reference), the torch backend on CPU tensors, and the torch backend
on CUDA when a GPU is present. Each op runs on random batches with missing values, negatives and edge values
(0, 2**32 - 1, 2**63, 2**64 - 1, empty batches), and whole pipelines run on the real Criteo sample. Ids, hash
buckets and keys must be bit-identical, dense values identical; the one allowed difference is ``Log1p``, where
a device's float64 log1p may differ from numpy's in the last bit, so its results are compared after rounding
to float32 (what the pipeline outputs) within 1 ulp. Invalid values must be reported for the same rows.
Fitting on any backend gives the same fitted state (the statistics are reduced on the host)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from etl.backends import cpu, tensor
from etl.batch import Batch, Column, Strings
from etl.errors import ConfigError
from etl.io.parquet import batch_from_arrow, column_from_arrow
from etl.ops import REGISTRY, InvalidRows, Op
from etl.ops.categorical import Categorify, Decode, Hash, HashedCross
from etl.ops.dates import DateParts
from etl.ops.dense import Bucketize, Clamp, FillMissing, Log1p, Normalize
from etl.ops.expr import Expr
from etl.ops.history import History
from etl.ops.lists import FirstX
from etl.ops.target import TargetEncode
from etl.pipeline import Pipeline
from etl.schema import ColumnSpec, parse_schema
from tests.conftest import REPO, run_etl

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
EDGE_KEYS = [0, 1, 2**32 - 1, 2**63 - 1, 2**63, 2**64 - 1]
ROWS = [0, 1, 1_000]
COVERED: set[str] = set()  # ops exercised below; the last test checks every registered op is


def covers(*ops: type[Op]):
    COVERED.update(op.name for op in ops)
    return lambda f: f


# ---------------------------------------------------------------- data


def spec(name: str, role: str = "categorical", dtype: str = "string", encoding: str | None = "hex", width: int | None = None) -> ColumnSpec:
    return ColumnSpec(name, role, dtype, encoding, width, "|" if role == "list" else None)


def arrow_col(values: list, s: ColumnSpec, typ: pa.DataType) -> Column:
    return column_from_arrow(pa.array(values, typ), s)


def dense_values(n: int, seed: int) -> list:
    rng = random.Random(seed)
    pool = [0.0, -0.0, 1.0, -1.0, 0.5, 1e-300, -1e300, 3.4e38, 2.0**53, 17.25, -3.0, 1e6]
    return [None if rng.random() < 0.2 else (rng.choice(pool) if rng.random() < 0.4 else rng.uniform(-50, 1e4)) for _ in range(n)]


def keys_values(n: int, seed: int) -> list:
    rng = random.Random(seed)
    return [None if rng.random() < 0.15 else (rng.choice(EDGE_KEYS) if rng.random() < 0.3 else rng.getrandbits(64)) for _ in range(n)]


def hex_texts(n: int, seed: int, width: int | None) -> list:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        if rng.random() < 0.15:
            out.append(None)
            continue
        k = rng.choice(EDGE_KEYS) if rng.random() < 0.3 else rng.getrandbits(32 if width else 64)
        digits = width or rng.randint(1, 16)
        text = format(k & ((1 << (4 * digits)) - 1), f"0{digits}x")
        out.append(text.upper() if rng.random() < 0.2 else text)
    return out


def key_column(n: int, seed: int) -> Column:
    v = keys_values(n, seed)
    return Column(np.array([0 if k is None else k for k in v], np.uint64), np.array([k is not None for k in v], np.bool_))


def dense_column(n: int, seed: int) -> Column:
    return arrow_col(dense_values(n, seed), spec("x", "dense", "float64", None), pa.float64())


# ---------------------------------------------------------------- running an op on a backend


def on_backend(batch: Batch, device: str | None) -> Batch:
    return batch if device is None else tensor.batch_to(batch, device)


def run(op: Op, batch: Batch, device: str | None) -> dict[str, Column] | InvalidRows:
    """The op's output columns on the CPU backend (device None) or the torch backend on ``device``, as numpy."""
    xp = cpu if device is None else tensor
    try:
        out = op.transform(on_backend(batch, device), xp)
    except InvalidRows as e:
        return e
    return {c: Column(*(None if a is None else xp.to_numpy(a) for a in (col.values, col.valid, col.offsets))) for c, col in out.items()}


def assert_same(op: Op, batch: Batch, device: str, float32_ulps: int = 0) -> None:
    want, got = run(op, batch, None), run(op, batch, device)
    if isinstance(want, InvalidRows) or isinstance(got, InvalidRows):
        assert isinstance(want, InvalidRows) and isinstance(got, InvalidRows), (want, got)
        assert want.column == got.column and want.reason == got.reason
        np.testing.assert_array_equal(cpu.to_numpy(want.mask), tensor.to_numpy(got.mask))
        return
    assert want.keys() == got.keys()
    for c in want:
        w, g = want[c], got[c]
        for part in ("valid", "offsets"):
            a, b = getattr(w, part), getattr(g, part)
            assert (a is None) == (b is None), (c, part)
            if a is not None:
                np.testing.assert_array_equal(a, b, err_msg=f"{c}.{part}")
        wv, gv = w.values, g.values
        if isinstance(wv, Strings):
            assert isinstance(gv, Strings) and wv.to_list() == gv.to_list(), c
            continue
        if wv.dtype == np.uint64:  # keys: compared as bits
            assert gv.dtype == np.int64, gv.dtype
            gv = gv.view(np.uint64)
        assert wv.dtype == gv.dtype, (c, wv.dtype, gv.dtype)
        if w.valid is not None:  # values under missing entries are unspecified
            wv, gv = wv[w.valid], gv[w.valid]
        if float32_ulps:
            a32, b32 = wv.astype(np.float32), gv.astype(np.float32)
            np.testing.assert_array_equal(np.isnan(a32), np.isnan(b32))
            diff = np.abs(a32.view(np.int32).astype(np.int64) - b32.view(np.int32).astype(np.int64))
            assert diff[~np.isnan(a32)].max(initial=0) <= float32_ulps, c
        else:
            np.testing.assert_array_equal(wv, gv, err_msg=c)


# ---------------------------------------------------------------- dense ops


@covers(FillMissing, Clamp, Normalize)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", ROWS)
def test_dense_ops(device: str, n: int) -> None:
    ints = [None if v is None else int(max(min(v, 2.0**62), -(2.0**62))) for v in dense_values(n, 2)]
    batch = Batch({"x": dense_column(n, 1), "y": arrow_col(ints, spec("y", "dense", "int64", None), pa.int64())}, n)
    assert_same(FillMissing(["x", "y"], value=0.5), batch, device)
    assert_same(Clamp(["x", "y"], min=-1.0, max=1e6), batch, device)
    assert_same(Clamp(["x"], max=0.0), batch, device)
    norm = Normalize(["x", "y"])
    norm.mean, norm.std = {"x": 12.5, "y": -3.25}, {"x": 7.0, "y": 1.0}
    assert_same(norm, batch, device)


@covers(Log1p)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", ROWS)
def test_log1p_within_one_float32_ulp(device: str, n: int) -> None:
    x = np.abs(np.random.default_rng(3).standard_normal(n)) * np.random.default_rng(4).choice([1e-8, 1.0, 1e3, 1e9], n)
    assert_same(Log1p(["x"]), Batch({"x": Column(x)}, n), device, float32_ulps=1)


#: expressions whose every function is exactly rounded (IEEE 754), or a choice between values: the same bits
EXACT_EXPRESSIONS = [
    "x / (y + 1)", "x * y - 2.5 * x", "-x", "x ** 3 - y ** -2", "abs(x) + sqrt(abs(y))", "min(x, y)", "max(x, 0)", "min(0.0, x)",
    "where(x > 0 and not y == 0, x / y, -0.0)", "where(0 <= x < 1e4 or y != y, x, y)", "(x + y) / 0",
]  # fmt: skip


@covers(Expr)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("expr", EXACT_EXPRESSIONS)
def test_expr_gives_the_same_bits(device: str, n: int, expr: str) -> None:
    """Signed zeros, NaN and infinities included (compared as bits)."""
    ints = [None if v is None else int(max(min(v, 2.0**52), -(2.0**52))) for v in dense_values(n, 7)]
    batch = Batch({"x": dense_column(n, 6), "y": arrow_col(ints, spec("y", "dense", "int64", None), pa.int64())}, n)
    op = Expr(Expr.implied_columns({"expr": expr}), out="e", expr=expr)
    want, got = run(op, batch, None), run(op, on_backend(batch, device), device)
    assert isinstance(want, dict) and isinstance(got, dict)
    np.testing.assert_array_equal(want["e"].valid, got["e"].valid)
    valid = np.ones(n, np.bool_) if want["e"].valid is None else want["e"].valid
    np.testing.assert_array_equal(want["e"].values[valid].view(np.int64), got["e"].values[valid].view(np.int64))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", ROWS)
def test_expr_log1p_within_one_float32_ulp(device: str, n: int) -> None:
    x = np.abs(np.random.default_rng(3).standard_normal(n)) * np.random.default_rng(4).choice([1e-8, 1.0, 1e3, 1e9], n)
    assert_same(Expr(["x"], out="x", expr="log1p(x)"), Batch({"x": Column(x)}, n), device, float32_ulps=1)


@covers(Bucketize)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", ROWS)
def test_bucketize(device: str, n: int) -> None:
    batch = Batch({"x": dense_column(n, 5)}, n)
    assert_same(Bucketize(["x"], boundaries=[-1.0, 0.0, 0.5, 17.25, 1e4]), batch, device)


@pytest.mark.parametrize("device", DEVICES)
def test_nonfinite_values_are_reported_for_the_same_rows(device: str) -> None:
    x = np.array([1.0, np.nan, 2.0, np.inf, -np.inf, 0.0])
    valid = np.array([True, True, True, False, True, True])
    assert_same(FillMissing(["x"]), Batch({"x": Column(x, valid)}, 6), device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("second", [np.float64, np.float32])
def test_the_first_column_with_nonfinite_values_is_reported(device: str, second) -> None:
    """Several columns checked at once (stacked when aligned, one by one when their dtypes differ): the first bad
    column in the op's order is reported, with the same rows, on every backend."""
    a = np.array([1.0, 2.0, 3.0, 4.0])
    b = np.array([np.inf, 2.0, np.nan, 4.0]).astype(second)
    c = np.array([np.nan, 1.0, 1.0, 1.0])
    batch = Batch({"a": Column(a), "b": Column(b, np.array([True, True, True, False])), "c": Column(c)}, 4)
    op = FillMissing(["a", "b", "c"])
    assert_same(op, batch, device)
    e = run(op, batch, device)
    assert isinstance(e, InvalidRows) and e.column == "b" and tensor.to_numpy(e.mask).tolist() == [True, False, True, False]
    assert run(FillMissing(["a"]), batch, device)["a"].values.tolist() == a.tolist()


# ---------------------------------------------------------------- decode


@covers(Decode)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("width", [8, None])
@pytest.mark.parametrize("typ", [pa.string(), pa.large_string(), pa.string_view()])
def test_decode_hex(device: str, n: int, width: int | None, typ: pa.DataType) -> None:
    s = spec("c", width=width)
    op = Decode(["c"])
    op.bind({"c": s})
    assert_same(op, Batch({"c": arrow_col(hex_texts(n, 6, width), s, typ)}, n), device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("width", [8, None])
def test_decode_reports_the_same_malformed_rows(device: str, width: int | None) -> None:
    texts = ["0000abcd", "xyz", None, "", "0123456789abcdef0", "ABCDEF12", "12 4", "g0000000", "1234567"]
    s = spec("c", width=width)
    op = Decode(["c"])
    op.bind({"c": s})
    assert_same(op, Batch({"c": arrow_col(texts, s, pa.string())}, len(texts)), device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", ROWS)
def test_decode_int_and_text_and_strings(device: str, n: int) -> None:
    rng = random.Random(7)
    ints = [None if rng.random() < 0.1 else rng.choice([0, -1, 2**63 - 1, -(2**63), 2**32 - 1, rng.randint(-(2**63), 2**63 - 1)]) for _ in range(n)]
    int_texts = [None if v is None else (f"+{v}" if v >= 0 and rng.random() < 0.2 else str(v)) for v in ints]
    unsigned = [2**64 - 1, 2**63, 10000169349117863715, rng.randint(2**63, 2**64 - 1)]  # integer text: up to 2**64 - 1
    int_texts = [str(rng.choice(unsigned)) if t is not None and rng.random() < 0.2 else t for t in int_texts]
    words = [None if rng.random() < 0.1 else rng.choice(["", "a", "Ünïcødé ✓", "x" * 40, str(rng.random())]) for _ in range(n)]
    specs = {"i": spec("i", dtype="int64", encoding="int"), "t": spec("t", encoding="int"), "s": spec("s", encoding="string")}
    op = Decode(list(specs))
    op.bind(specs)
    columns = {"i": arrow_col(ints, specs["i"], pa.int64()), "t": arrow_col(int_texts, specs["t"], pa.string())}
    batch = Batch(columns | {"s": arrow_col(words, specs["s"], pa.string())}, n)
    assert_same(op, batch, device)
    bad = ["18446744073709551616", "-9223372036854775809", "--1", "1e3", "", "99999999999999999999", "+", "-0", "1" + "0" * 20]
    one = Decode(["t"])
    one.bind(specs)
    assert_same(one, Batch({"t": arrow_col(bad, specs["t"], pa.string())}, len(bad)), device)


# ---------------------------------------------------------------- hash, cross, categorify


@covers(Hash)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("buckets,seed", [(1, 0), (1_000, 7), (40_000_000, 0), (2**31, 123)])
def test_hash(device: str, n: int, buckets: int, seed: int) -> None:
    assert_same(Hash(["k"], num_buckets=buckets, seed=seed), Batch({"k": key_column(n, 8)}, n), device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", ROWS)
def test_hash_of_several_columns_at_once(device: str, n: int) -> None:
    """Aligned columns are hashed together on the torch backend: the same ids as one by one."""
    batch = Batch({"a": key_column(n, 20), "b": key_column(n, 21), "c": Column(key_column(n, 22).values)}, n)
    assert_same(Hash(["a", "b", "c"], num_buckets=1_000_003, seed=9), batch, device)


@covers(History)
@pytest.mark.parametrize("device", DEVICES)
def test_history_takes_the_ids_of_either_backend(device: str) -> None:
    """History's state runs on the host whatever the backend: fed the ids the ops before it make on the torch
    backend (read back), it gives the lists it gives from the CPU backend's; a one-batch transform refuses it on
    both."""
    n = 1_000
    rng = np.random.default_rng(5)
    schema = parse_schema({"name": "e", "columns": [{"name": "label", "role": "label", "dtype": "int64"},
                                                     {"name": "u", "role": "categorical", "dtype": "int64"},
                                                     {"name": "i", "role": "categorical", "dtype": "int64"},
                                                     {"name": "t", "role": "dense", "dtype": "int64"}]})  # fmt: skip
    doc = {"ops": [{"op": "Decode", "columns": ["u", "i"]}, {"op": "Hash", "columns": ["u", "i"], "num_buckets": 97},
                   {"op": "History", "columns": ["i"], "key": "u", "time": "t", "max_len": 4}]}  # fmt: skip
    pipe = Pipeline(doc, schema)
    op = pipe.ops[-1]
    assert isinstance(op, History)
    order = np.lexsort((rng.integers(0, 50, n), rng.integers(0, 30, n)))
    users, items, times = rng.integers(0, 30, n)[order], rng.integers(-5, 10**12, n), np.sort(rng.integers(0, 50, n))
    table = pa.table({"label": rng.integers(0, 2, n), "u": users, "i": items, "t": times})
    batch = batch_from_arrow(table, schema)
    lists = []
    for xp, start in ((cpu, batch), (tensor, tensor.batch_to(batch, device))):
        out = pipe.run_ops(start, pipe.ops[:2], "raise", xp, labels=True, output=False).batch
        host = out if xp is cpu else tensor_batch_to_numpy(out)
        hashes, usable, _ = op.key_hashes(batch["u"])
        state = op.new_stream_state(op.state_spec().name)
        op.check_sources(start, xp)
        checked = op.with_sources(host, hashes, usable)
        step = state.advance(op.carried(checked), record=False)
        lists.append([step.outputs[name].tolist() for name in op.outputs])
        with pytest.raises(ConfigError, match="etl preprocess"):
            pipe.run_ops(start, pipe.ops, "raise", xp, labels=True, output=True)
    assert lists[0] == lists[1] and sum(lists[0][1]) > 0


@covers(HashedCross)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", ROWS)
def test_hashed_cross(device: str, n: int) -> None:
    batch = Batch({"a": key_column(n, 9), "b": key_column(n, 10), "c": key_column(n, 11)}, n)
    assert_same(HashedCross(["a", "b"], num_buckets=10_007, seed=3), batch, device)
    assert_same(HashedCross(["a", "b", "c"], num_buckets=2**31, name="abc"), batch, device)


def fitted_categorify(keys: Column, device: str | None, **params) -> Categorify:
    op = Categorify(["k"], **params)
    op.bind({"k": spec("k")})
    xp = cpu if device is None else tensor
    stats = op.new_stats(xp)
    half = len(keys) // 2
    for rows in (np.arange(half), np.arange(half, len(keys))):  # two batches: counts accumulate
        op.partial_fit(stats, on_backend(Batch({"k": keys.take(rows)}, len(rows)), device), xp)
    op.finalize(stats, xp)
    return op


@covers(Categorify)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("params", [{}, {"freq_threshold": 2, "oov_buckets": 5, "seed": 4}, {"max_size": 10}])
def test_categorify_fit_and_transform(device: str, params: dict) -> None:
    rng = np.random.default_rng(12)
    pool = np.array(EDGE_KEYS + [int(x) for x in rng.integers(0, 2**63, 50, dtype=np.int64)], np.uint64)
    keys = Column(pool[rng.zipf(1.5, 3_000) % len(pool)], rng.random(3_000) > 0.1)
    ref = fitted_categorify(keys, None, **params)
    assert fitted_categorify(keys, device, **params).vocab["k"].equals(ref.vocab["k"])  # same fitted state
    fresh = key_column(2_000, 13)  # mostly unseen keys: out-of-vocabulary buckets
    for n in ROWS:
        assert_same(ref, Batch({"k": keys.take(np.arange(n))}, n), device)
        assert_same(ref, Batch({"k": fresh.take(np.arange(n))}, n), device)


@pytest.mark.parametrize("device", DEVICES)
def test_categorify_of_several_columns_at_once(device: str) -> None:
    """Columns with tables of very different sizes (one empty, one holding the padding key 2**63 - 1) are looked up
    in groups on the torch backend: the same ids as one by one."""
    rng = np.random.default_rng(16)
    cols = {}
    for name, distinct in (("big", 3_000), ("mid", 900), ("small", 12), ("tiny", 3), ("none", 1)):
        pool = np.concatenate([np.array([2**63 - 1, 0], np.uint64), rng.integers(0, 2**63, distinct, dtype=np.int64).view(np.uint64)])
        cols[name] = Column(pool[rng.integers(0, len(pool), 20_000)], rng.random(20_000) > 0.05)
    op = Categorify(list(cols), freq_threshold=2)
    op.bind({c: spec(c) for c in cols})
    stats = op.new_stats(cpu)
    fit = dict(cols)
    fit["none"] = Column(np.zeros(0, np.uint64))  # nothing seen: an empty vocabulary
    op.partial_fit(stats, _ragged(fit), cpu)
    op.finalize(stats, cpu)
    assert op.vocab["none"].num_rows == 0 and op.vocab["big"].num_rows > 1_000
    fresh = {c: key_column(5_000, 23 + i) for i, c in enumerate(cols)}
    for data in (cols, fresh):
        for n in ROWS:
            assert_same(op, Batch({c: col.take(np.arange(n)) for c, col in data.items()}, n), device)


def _ragged(cols: dict[str, Column]) -> Batch:
    """A batch object holding columns of unequal lengths (enough for partial_fit, which reads them one by one)."""
    return Batch(cols, max(len(c) for c in cols.values()))


@pytest.mark.parametrize("device", DEVICES)
def test_normalize_fit_is_the_same_on_every_backend(device: str) -> None:
    rng = np.random.default_rng(14)
    col = Column(rng.standard_normal(5_000) * 1e3 + 7.5, rng.random(5_000) > 0.2)
    fitted = []
    for dev in (None, device):
        op, xp = Normalize(["x"]), (cpu if dev is None else tensor)
        stats = op.new_stats(xp)
        for rows in np.array_split(np.arange(5_000), 3):
            op.partial_fit(stats, on_backend(Batch({"x": col.take(rows)}, len(rows)), dev), xp)
        op.finalize(stats, xp)
        fitted.append((op.mean, op.std))
    assert fitted[0] == fitted[1]


@covers(TargetEncode)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fold_by", [None, "u"])
def test_target_encode(device: str, fold_by: str | None) -> None:
    """Fitted on either backend: the same statistics; then full and out-of-fold encodings and the folds (of the
    fold_by id, or of the file and row) bit for bit, categories unseen at fit included."""
    rng = np.random.default_rng(17)
    n = 3_000
    ids = {"u": rng.integers(0, 70, n).astype(np.int32), "i": rng.integers(2, 2**31 - 1, n).astype(np.int64) % 500}
    label = Column(rng.integers(0, 2, n).astype(np.float64))
    params = {"target": "label", "kfold": 5, "fold_by": fold_by, "seed": 3, "smoothing": 2.5, "export_fold": True}
    fitted = []
    for dev in (None, device):
        op, xp = TargetEncode(["i", ["u", "i"]], **params), (cpu if dev is None else tensor)
        stats = op.new_stats(xp)
        for rows in np.array_split(np.arange(n), 3):
            part = Batch({c: Column(v[rows]) for c, v in ids.items()} | {"label": label.take(rows)}, len(rows), "s3://b/day-1.parquet", 0, rows)
            op.partial_fit(stats, on_backend(part, dev), xp)
        op.finalize(stats, xp)
        fitted.append(op)
    for name in fitted[0].names:
        for field in ("keys", "folds", "counts", "units", "fold_counts", "fold_units"):
            np.testing.assert_array_equal(getattr(fitted[0].stats[name], field), getattr(fitted[1].stats[name], field))
    op = fitted[0]
    fresh = {"u": rng.integers(0, 90, n).astype(np.int32), "i": rng.integers(0, 600, n)}  # some never seen
    for data in (ids, fresh):
        for rows in (np.arange(0), np.arange(1), np.arange(n)):
            batch = Batch({c: Column(v[rows]) for c, v in data.items()}, len(rows), "/data/day-1.parquet", 0, rows + 10)
            assert_same(op, batch, device)
            want, got = op.transform_training(batch, cpu), op.transform_training(on_backend(batch, device), tensor)
            assert want.keys() == got.keys()
            for c in want:
                np.testing.assert_array_equal(want[c].values, tensor.to_numpy(got[c].values), err_msg=c)
    ordered = TargetEncode(["i"], target="label", mode="ordered")  # its values are the loader's, on the host
    for xp, dev in ((cpu, None), (tensor, device)):
        with pytest.raises(ConfigError, match="mode: ordered"):
            ordered.transform(on_backend(Batch({"i": Column(ids["i"])}, n), dev), xp)


# ---------------------------------------------------------------- lists


@covers(FirstX)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", ROWS)
def test_lists(device: str, n: int) -> None:
    rng = random.Random(15)
    rows = [None if rng.random() < 0.1 else [rng.choice(["00ab", "ffff", "0", None, "1234"]) for _ in range(rng.randint(0, 6))] for _ in range(n)]
    s = spec("g", role="list", width=None)
    raw = arrow_col(rows, s, pa.list_(pa.string()))
    assert_same(FirstX(["g"], x=3), Batch({"g": raw}, n), device)
    decode = Decode(["g"])
    decode.bind({"g": s})
    keys = decode.transform(Batch({"g": raw}, n), cpu)["g"]
    batch = Batch({"g": keys}, n)
    assert_same(FirstX(["g"], x=2), batch, device)
    assert_same(Hash(["g"], num_buckets=97), batch, device)


# ---------------------------------------------------------------- dates


def date_parts_op(fmt: str, s: ColumnSpec, parts: list[str] | None = None) -> DateParts:
    op = DateParts([s.name], format=fmt, parts=parts or ["year", "month", "day", "hour", "minute", "weekday"])
    op.bind({s.name: s})
    return op


def assert_same_dates(op: DateParts, batch: Batch, device: str) -> None:
    """``assert_same`` for a batch of dates only."""
    assert not isinstance(run(op, batch, None), InvalidRows)
    assert_same(op, batch, device)


def random_seconds(n: int, seed: int) -> list:
    rng = random.Random(seed)
    edges = [-62_135_596_800, 253_402_300_799, 0, -1, 86_399, 86_400, 951_782_400]
    return [None if rng.random() < 0.1 else (rng.choice(edges) if rng.random() < 0.2 else rng.randint(-62_135_596_800, 253_402_300_799))
            for _ in range(n)]  # fmt: skip


@covers(DateParts)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("typ", [pa.string(), pa.large_string(), pa.string_view()])
def test_date_parts_of_text(device: str, n: int, typ: pa.DataType) -> None:
    s = spec("t", encoding="string")
    texts = []
    for t in random_seconds(n, 30):
        d = None if t is None else divmod(t, 86_400)
        texts.append(None if d is None else (np.datetime64(d[0], "D").astype(str).rjust(10, "0") + f" {d[1] // 3600:02d}:{d[1] // 60 % 60:02d}"))
    assert_same_dates(date_parts_op("%Y-%m-%d %H:%M", s), Batch({"t": arrow_col(texts, s, typ)}, n), device)
    seconds = [None if t is None else str(t) for t in random_seconds(n, 31)]
    assert_same_dates(date_parts_op("unix", s), Batch({"t": arrow_col(seconds, s, typ)}, n), device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", ROWS)
def test_date_parts_of_integers(device: str, n: int) -> None:
    s = spec("t", dtype="int64", encoding="int")
    rng = random.Random(32)
    hours = [int(f"{rng.randrange(100):02d}{rng.randint(1, 12):02d}{rng.randint(1, 28):02d}{rng.randrange(24):02d}") for _ in range(n)]
    hours = [None if rng.random() < 0.1 else h for h in hours]
    op = date_parts_op("%y%m%d%H", s, ["hour", "weekday", "day", "month", "year"])
    assert_same_dates(op, Batch({"t": arrow_col(hours, s, pa.int64())}, n), device)
    assert_same_dates(date_parts_op("unix", s), Batch({"t": arrow_col(random_seconds(n, 33), s, pa.int64())}, n), device)


@pytest.mark.parametrize("device", DEVICES)
def test_date_parts_report_the_same_invalid_rows(device: str) -> None:
    text = spec("t", encoding="string")
    texts = ["2014-10-21 00:00", "2014-02-30 00:00", None, "2014-13-01 00:00", "2014-10-21 24:00", "", "2014-10-21T00:00", "2016-02-29 23:59"]
    assert_same(date_parts_op("%Y-%m-%d %H:%M", text), Batch({"t": arrow_col(texts, text, pa.string())}, len(texts)), device)
    seconds = ["0", "-62135596801", "253402300800", "1e9", None, "+5", "9223372036854775808"]
    assert_same(date_parts_op("unix", text), Batch({"t": arrow_col(seconds, text, pa.string())}, len(seconds)), device)
    ints = spec("t", dtype="int64", encoding="int")
    values = [14102100, 14023000, -1, 100000000, None, 14022923, 2**63 - 1, -(2**63)]
    assert_same(date_parts_op("%y%m%d%H", ints, ["hour"]), Batch({"t": arrow_col(values, ints, pa.int64())}, len(values)), device)
    assert_same(date_parts_op("unix", ints, ["hour"]), Batch({"t": arrow_col(values[:6] + [253402300800], ints, pa.int64())}, 7), device)


# ---------------------------------------------------------------- whole pipelines on the real Criteo sample


@pytest.fixture(scope="module")
def criteo_raw(criteo_8k: Path, tmp_path_factory) -> pa.Table:
    out = tmp_path_factory.mktemp("criteo-contract")
    run_etl("convert", criteo_8k / "train.csv", "--schema", REPO / "schemas/criteo.yaml", "--out", out)
    return pa.concat_tables([pq.read_table(p) for p in sorted(out.glob("*.parquet"))])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["criteo", "criteo_hash"])
def test_real_criteo_pipelines(criteo_raw: pa.Table, name: str, device: str, tmp_path: Path) -> None:
    """Fitted on the host; then every op on the host, versus the host part then the device part on the torch
    backend, versus every op (decode included) on the torch backend."""
    path = REPO / f"pipelines/{name}.yaml"
    pipe = Pipeline.from_file(path)
    shard = tmp_path / "train.parquet"
    pq.write_table(criteo_raw, shard)
    pipe.fit([shard])
    batch = batch_from_arrow(criteo_raw, pipe.schema, str(shard))
    want = pipe.transform(batch).batch
    host = pipe.transform(batch, part="host").batch
    split = pipe.transform(tensor.batch_to(host, device), part="device", xp=tensor).batch
    whole = pipe.transform(tensor.batch_to(batch, device), xp=tensor).batch
    for got in (split, whole):
        for c in pipe.output_columns:
            w, g = want[c].values, tensor.to_numpy(got[c].values)
            if c.startswith("I"):  # Log1p: within 1 float32 ulp (see the module docstring)
                diff = np.abs(w.astype(np.float32).view(np.int32).astype(np.int64) - g.astype(np.float32).view(np.int32).astype(np.int64))
                assert diff.max() <= 1, c
            else:
                assert w.dtype == g.dtype, c
                np.testing.assert_array_equal(w, g, err_msg=c)


@pytest.mark.parametrize("device", DEVICES)
def test_real_movielens_sample_pipeline(movielens_sample: Path, device: str, tmp_path: Path) -> None:
    """DateParts on Unix seconds, its columns categorified with the others, a list column and Normalize: every op
    on the host, versus the host part then the device part, versus every op on the torch backend (bit for bit:
    no Log1p here)."""
    raw = tmp_path / "raw"
    run_etl("convert", movielens_sample, "--schema", REPO / "schemas/movielens_sample.yaml", "--out", raw)
    shards = sorted(raw.glob("*.parquet"))
    pipe = Pipeline.from_file(REPO / "pipelines/movielens_sample.yaml")
    pipe.fit(shards)
    table = pq.read_table(shards[0])
    batch = batch_from_arrow(table, pipe.schema, str(shards[0]))
    want = pipe.to_arrow(pipe.transform(batch).batch)
    host = pipe.transform(batch, part="host").batch
    split = pipe.transform(tensor.batch_to(host, device), part="device", xp=tensor).batch
    whole = pipe.transform(tensor.batch_to(batch, device), xp=tensor).batch
    for got in (split, whole):
        assert pipe.to_arrow(tensor_batch_to_numpy(got)).equals(want)


def tensor_batch_to_numpy(batch: Batch) -> Batch:
    """A transformed batch of the torch backend as numpy."""
    cols = {c: Column(*(tensor.to_numpy(a) for a in (col.values, col.valid, col.offsets))) for c, col in batch.columns.items()}
    return Batch(cols, batch.num_rows)


def test_every_op_is_covered() -> None:
    assert COVERED == set(REGISTRY), sorted(set(REGISTRY) - COVERED)


def test_strings_travel_in_both_layouts() -> None:
    """Both Arrow string layouts (offsets, and inline views) reach the torch backend as the same strings."""
    s = spec("c")
    for typ in (pa.string(), pa.string_view()):
        col = arrow_col(["ab", None, "0123456789abcdef", ""], s, typ)
        assert isinstance(col.values, Strings)
        moved = tensor.to_numpy(tensor.column_to(col, "cpu").values)
        assert moved.to_list() == col.values.to_list()
