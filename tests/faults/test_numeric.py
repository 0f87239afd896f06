"""Numeric edges, exactly: Normalize refuses to fit a mean or std beyond the float64 range, artifacts never hold
``Infinity``/``NaN``, and values beyond the float32 range are invalid output (``RowError`` or quarantine), on both
backends."""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from etl.backends import cpu, tensor
from etl.batch import Batch
from etl.errors import ArtifactError, FitError, RowError
from etl.io.parquet import batch_from_arrow
from etl.pipeline import Pipeline
from etl.schema import parse_schema

SCHEMA = parse_schema(
    {
        "name": "numbers",
        "columns": [{"name": "label", "role": "label", "dtype": "int64"}, {"name": "x", "role": "dense", "dtype": "float64"}],
    }
)
BACKENDS = {"cpu": cpu, "tensor": tensor}


def pipeline(ops: list[dict], xp=cpu) -> Pipeline:
    return Pipeline({"name": "numbers", "ops": ops}, SCHEMA, xp=xp)


def shard(tmp_path: Path, values: list[float | None]) -> Path:
    p = tmp_path / "part-0.parquet"
    pq.write_table(pa.table({"label": [0] * len(values), "x": pa.array(values, pa.float64())}), p)
    return p


# ---------------------------------------------------------------- Normalize fit


OVERFLOWING = {
    "one 1e308 outlier": [1.0, 2.0, 1e308],
    "two 1e308": [1e308, 1e308],
    "1e308 both signs": [1e308, -1e308, 1e308],
    "1e200 (variance overflows)": [1e200, 1.0],
    "-1.7e308 and 1.7e308": [-1.7e308, 1.7e308],
}


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("case", sorted(OVERFLOWING))
def test_normalize_refuses_a_std_beyond_float64(tmp_path, case, backend):
    pipe = pipeline([{"op": "Normalize", "columns": ["x"]}], BACKENDS[backend])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy reports the overflow it computes
        with pytest.raises(FitError, match="Normalize: column 'x': mean or std beyond the float64 range"):
            pipe.fit([shard(tmp_path, OVERFLOWING[case])])


def test_normalize_fits_large_but_finite_values_and_constant_columns(tmp_path):
    pipe = pipeline([{"op": "Normalize", "columns": ["x"]}])
    pipe.fit([shard(tmp_path, [1e150, -1e150, None])])
    assert pipe.ops[0].mean == {"x": 0.0} and pipe.ops[0].std == {"x": 1e150}
    pipe = pipeline([{"op": "Normalize", "columns": ["x"]}])
    pipe.fit([shard(tmp_path, [5.0, 5.0])])
    assert pipe.ops[0].std == {"x": 1.0}  # a constant column is divided by 1


def test_save_never_writes_infinity_or_nan(tmp_path):
    pipe = pipeline([{"op": "Normalize", "columns": ["x"]}])
    pipe.fit([shard(tmp_path, [1.0, 2.0])])
    for bad in (math.inf, math.nan):
        pipe.ops[0].std["x"] = bad
        with pytest.raises(ArtifactError, match="NaN or infinite"):
            pipe.save(tmp_path / "art")
        assert not (tmp_path / "art" / "pipeline.json").exists()
    pipe.ops[0].std["x"] = 0.5
    pipe.save(tmp_path / "art")
    assert json.loads((tmp_path / "art" / "pipeline.json").read_text())["ops"][0]["state"]["std"] == {"x": 0.5}


# ---------------------------------------------------------------- float32 output


F32_MAX = float(np.finfo(np.float32).max)
HALF_ULP = 2.0**103  # half the float32 spacing at float32 max
FILL = [{"op": "FillMissing", "columns": ["x"], "value": 0}]
OVERFLOWS_FLOAT32 = {  # value -> where it comes from
    "1e39": ([1e39], FILL),
    "-1e39": ([-1e39], FILL),
    "1e308": ([1e308], FILL),
    "-1.7e308": ([-1.7e308], FILL),
    "float32 max + half an ulp (rounds to inf)": ([F32_MAX + HALF_ULP], FILL),
    "1e39 after Clamp(min=0)": ([1e39], FILL + [{"op": "Clamp", "columns": ["x"], "min": 0}]),
    "1e30 / std 1e-10 (Normalize)": ([1e30], FILL + [{"op": "Normalize", "columns": ["x"]}]),
}


def table(values: list[float | None]) -> pa.Table:
    return pa.table({"label": [0] * len(values), "x": pa.array(values, pa.float64())})


def fitted_pipeline(ops: list[dict], xp=cpu) -> Pipeline:
    pipe = pipeline(ops, xp)
    for op in pipe.ops:
        if op.fittable:
            op.mean, op.std = {"x": 0.0}, {"x": 1e-10}
    return pipe


def on_tensors(batch: Batch) -> Batch:
    cols = {c: replace(col, values=tensor.to_device(col.values, "cpu"), valid=tensor.to_device(col.valid, "cpu"))
            for c, col in batch.columns.items()}
    return replace(batch, columns=cols)


@pytest.mark.parametrize("case", sorted(OVERFLOWS_FLOAT32))
def test_float32_overflow_raises_row_error(case):
    values, ops = OVERFLOWS_FLOAT32[case]
    rows = [1.0, None] + values + [2.5]
    for xp in (cpu, tensor):
        pipe = fitted_pipeline(ops, xp)
        batch = batch_from_arrow(table(rows), SCHEMA, "in.parquet")
        with pytest.raises(RowError, match="row 2, column 'x': value overflows float32 after the transform"):
            pipe.transform(batch if xp is cpu else on_tensors(batch), xp=xp)


@pytest.mark.parametrize("case", sorted(OVERFLOWS_FLOAT32))
def test_float32_overflow_is_quarantined(case):
    values, ops = OVERFLOWS_FLOAT32[case]
    pipe = fitted_pipeline(ops)
    t = pipe.transform(batch_from_arrow(table([1.0] + values + [None]), SCHEMA, "in.parquet"), "quarantine")
    assert t.batch.num_rows == 2 and t.num_rejected == 1
    out = pipe.to_arrow(t.batch)
    assert np.isfinite(out.column("x").to_numpy()).all()


@pytest.mark.filterwarnings("ignore:invalid value encountered in log1p:RuntimeWarning")
def test_nan_after_the_transform_is_still_reported_as_nan():
    pipe = fitted_pipeline(FILL + [{"op": "Log1p", "columns": ["x"]}])
    with pytest.raises(RowError, match="row 1, column 'x': value is NaN or infinite after the transform"):
        pipe.transform(batch_from_arrow(table([1.0, -5.0, 1e39]), SCHEMA, "in.parquet"))


def test_largest_float32_values_pass():
    edge = [F32_MAX, -F32_MAX, float(np.nextafter(F32_MAX + HALF_ULP, 0)), 1e38]  # the third rounds down to the max
    for xp in (cpu, tensor):
        pipe = fitted_pipeline(FILL, xp)
        batch = batch_from_arrow(table(edge), SCHEMA, "in.parquet")
        out = pipe.transform(batch if xp is cpu else on_tensors(batch), xp=xp).batch
        assert np.isfinite(xp.to_numpy(xp.as_float32(out["x"].values))).all()
