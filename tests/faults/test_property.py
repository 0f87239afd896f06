"""Property-based fault test: random schemas × random values (nulls, numeric extremes, unicode, huge strings,
malformed hex) through ``etl preprocess`` with ``on_error="quarantine"``.

For every generated case: rows_in = rows_out + rows_quarantined, the quarantine file holds exactly the rows a
plain reference rejects, and every output value equals the reference's, computed here row by row in plain
Python (the hashes and the vocabulary order re-implemented from their documented definitions)."""

from __future__ import annotations

import math
import re
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from etl.io.processed import read_manifest
from etl.pipeline import Pipeline
from etl.preprocess import preprocess
from etl.schema import parse_schema

M64 = (1 << 64) - 1
FLOAT32_MAX = float(np.finfo(np.float32).max)


# --- reference hashes, from the definitions in the README ----------------------------------------------------------

def fmix64(k: int) -> int:
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & M64
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & M64
    return k ^ (k >> 33)


def string_key(text: str) -> int:
    h = 0xCBF29CE484222325
    for byte in text.encode():
        h = ((h ^ byte) * 0x100000001B3) & M64
    return fmix64(h)


def hash_id(key: int, seed: int, buckets: int) -> int:
    h = fmix64(key ^ fmix64(((seed + 1) * 0x9E3779B97F4A7C15) & M64))
    return 2 + (((h >> 32) * buckets) >> 32)


# --- generated cases -----------------------------------------------------------------------------------------------

EXTREMES = st.sampled_from([0.0, -0.0, 1e308, -1e308, 1e39, -1e39, FLOAT32_MAX, 3.4028236e38, 5e-324, -1.0, -0.5, -2.0])
FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), EXTREMES, EXTREMES)
INTS = st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from([0, -1, 2**63 - 1, -(2**63), 2**53 + 1]))
HEX8 = st.one_of(
    st.integers(0, 2**32 - 1).map(lambda v: f"{v:08x}"),
    st.integers(0, 2**32 - 1).map(lambda v: f"{v:08X}"),
    st.sampled_from(["0000abcd", "0000ABCD", "ffffffff"]),
    st.sampled_from(["0000abcd", "0000ABCD", "ffffffff"]),
    st.text(max_size=9),  # mostly malformed
)
TEXT = st.one_of(st.text(max_size=12), st.text(min_size=1000, max_size=4000), st.sampled_from(["a", "b", "", "é中🙂"]))


@dataclass
class Case:
    dense: list[tuple[str, str]]          # (name, dtype)
    cats: list[tuple[str, str, str]]      # (name, dtype, encoding)
    label_dtype: str
    clamp: bool
    log1p: bool
    categorify: bool                      # else Hash
    freq_threshold: int
    buckets: int
    rows: list[dict[str, Any]]
    row_group_size: int
    workers: int


@st.composite
def cases(draw: st.DrawFn) -> Case:
    dense = [(f"d{i}", draw(st.sampled_from(["int64", "float64"]))) for i in range(draw(st.integers(1, 3)))]
    kinds = st.sampled_from([("string", "string"), ("int64", "int"), ("string", "hex")])
    cats = [(f"c{i}", *draw(kinds)) for i in range(draw(st.integers(1, 3)))]
    label_dtype = draw(st.sampled_from(["int64", "float64"]))
    label = st.sampled_from([0, 1, 1, None] if label_dtype == "int64" else [0.0, 1.0, 1.0, 0.0, math.nan, math.inf, -math.inf, None])
    values = {"int64": INTS, "float64": FLOATS, "string": TEXT, "int": INTS, "hex": HEX8}
    row = st.fixed_dictionaries({
        "label": label,
        **{n: st.one_of(values[t], values[t], st.none()) for n, t in dense},
        **{n: st.one_of(values[e], values[e], st.none()) for n, _, e in cats},
    })
    rows = draw(st.lists(row, min_size=1, max_size=40))
    return Case(
        dense, cats, label_dtype,
        clamp=draw(st.booleans()), log1p=draw(st.booleans()), categorify=draw(st.booleans()),
        freq_threshold=draw(st.integers(1, 2)), buckets=draw(st.integers(1, 50)),
        rows=rows, row_group_size=draw(st.integers(1, len(rows))), workers=draw(st.integers(1, 2)),
    )


def build(case: Case, directory: Path) -> tuple[Pipeline, Path]:
    """The case's schema, pipeline and raw shard."""
    columns = [{"name": "label", "role": "label", "dtype": case.label_dtype}]
    columns += [{"name": n, "role": "dense", "dtype": t} for n, t in case.dense]
    columns += [{"name": n, "role": "categorical", "dtype": t, "encoding": e} | ({"width": 8} if e == "hex" else {}) for n, t, e in case.cats]
    schema = parse_schema({"name": "random", "columns": columns})
    ops: list[dict[str, Any]] = [{"op": "FillMissing", "columns": "@dense", "value": 0}]
    if case.clamp:
        ops.append({"op": "Clamp", "columns": "@dense", "min": 0})
    if case.log1p:
        ops.append({"op": "Log1p", "columns": "@dense"})
    ops.append({"op": "Decode", "columns": "@categorical"})
    if case.categorify:
        ops.append({"op": "Categorify", "columns": "@categorical", "freq_threshold": case.freq_threshold})
    else:
        ops.append({"op": "Hash", "columns": "@categorical", "num_buckets": case.buckets, "seed": 3})
    pipeline = Pipeline({"name": "random", "ops": ops}, schema)
    types = {"int64": pa.int64(), "float64": pa.float64(), "string": pa.string()}
    table = pa.table({
        "label": pa.array([r["label"] for r in case.rows], types[case.label_dtype]),
        **{n: pa.array([r[n] for r in case.rows], types[t]) for n, t in case.dense},
        **{n: pa.array([r[n] for r in case.rows], types[t]) for n, t, _ in case.cats},
    })
    shard = directory / "raw.parquet"
    pq.write_table(table, shard, row_group_size=case.row_group_size)
    return pipeline, shard


# --- the reference -------------------------------------------------------------------------------------------------

def ref_key(value: Any, encoding: str) -> int | None:
    """The key of a raw value; None when missing; raises ValueError when malformed."""
    if value is None:
        return None
    if encoding == "int":
        return value & M64
    if encoding == "hex":
        if not re.fullmatch(r"[0-9a-fA-F]{8}", value):
            raise ValueError(value)
        return int(value, 16)
    return string_key(value)


def ref_dense(value: Any, case: Case) -> float:
    """The dense output of a raw value (float64, before the float32 cast); raises ValueError when invalid."""
    x = 0.0 if value is None else float(value)
    if not math.isfinite(x):
        raise ValueError(value)
    if case.clamp:
        x = max(x, 0.0)
    if case.log1p:
        x = float(np.log1p(np.float64(x)))
    return x


def label_ok(value: Any) -> bool:
    return value is not None and math.isfinite(value)


def reference(case: Case) -> tuple[list[int], dict[str, list[Any]]]:
    """The rows kept (their numbers) and the expected output columns."""
    encodings = {n: e for n, _, e in case.cats}

    def keys(row: dict[str, Any]) -> dict[str, int | None] | None:
        try:
            return {n: ref_key(row[n], e) for n, e in encodings.items()}
        except ValueError:
            return None

    # fit counts the keys of the rows with a label whose every categorical value decodes (the Decode op feeds it)
    counts: dict[str, Counter[int]] = {n: Counter() for n in encodings}
    for row in case.rows:
        k = keys(row) if label_ok(row["label"]) else None
        for n in encodings:
            if k is not None and k[n] is not None:
                counts[n][k[n]] += 1
    vocab = {}
    for n, cnt in counts.items():  # ids from 3 (2 is the out-of-vocabulary bucket): count descending, key ascending
        order = sorted((k for k, c in cnt.items() if c >= case.freq_threshold), key=lambda k: (-cnt[k], k))
        vocab[n] = {key: 3 + i for i, key in enumerate(order)}
    kept: list[int] = []
    out: dict[str, list[Any]] = {"label": [], **{n: [] for n, _ in case.dense}, **{n: [] for n in encodings}}
    for i, row in enumerate(case.rows):
        if not label_ok(row["label"]):
            continue
        k = keys(row)
        if k is None:
            continue
        try:
            dense = {n: ref_dense(row[n], case) for n, _ in case.dense}
        except ValueError:
            continue
        if any(math.isnan(v) or not math.isfinite(np.float32(v)) for v in dense.values()):
            continue  # NaN (log1p below -1), or beyond float32 after the transform
        kept.append(i)
        out["label"].append(np.float32(row["label"]))
        for n, v in dense.items():
            out[n].append(np.float32(v))
        for n in encodings:
            key = k[n]
            if key is None:
                out[n].append(1)
            elif case.categorify:
                out[n].append(vocab[n].get(key, 2))  # one out-of-vocabulary bucket: id 2
            else:
                out[n].append(hash_id(key, 3, case.buckets))
    return kept, out


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cases())
def test_random_schemas_and_values_are_accounted_and_equal_the_reference(case: Case) -> None:
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"), tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        pipeline, shard = build(case, directory)
        out = directory / "out"
        summary = preprocess(pipeline, [shard], out, workers=case.workers, on_error="quarantine")
        kept, expected = reference(case)
        assert summary.rows_in == len(case.rows) == summary.rows_out + summary.rows_quarantined
        assert summary.rows_out == len(kept)
        (entry,) = read_manifest(out).files
        assert (entry.rows_in, entry.rows_out, entry.rows_quarantined) == (len(case.rows), len(kept), len(case.rows) - len(kept))
        rejected = sorted(set(range(len(case.rows))) - set(kept))
        if rejected:
            assert entry.quarantine is not None
            q = pq.read_table(out / entry.quarantine)
            assert q["_row"].to_pylist() == rejected
            for name in ["label", *(n for n, _ in case.dense), *(n for n, _, _ in case.cats)]:
                got, want = q[name].to_pylist(), [case.rows[i][name] for i in rejected]
                assert [repr(v) for v in got] == [repr(v) for v in want], name  # as they were (NaN included)
        else:
            assert entry.quarantine is None
        table = pq.read_table(out / entry.output)
        assert table.num_rows == len(kept)
        for name, want in expected.items():
            got = table[name].to_numpy(zero_copy_only=False)
            np.testing.assert_array_equal(got, np.array(want, dtype=got.dtype), err_msg=name)
