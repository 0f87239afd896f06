"""Numeric edges, exactly: Normalize refuses to fit a mean or std beyond the float64 range, artifacts never hold
``Infinity``/``NaN``, and values beyond the float32 range are invalid output (``RowError`` or quarantine), on both
backends."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from etl.backends import cpu, tensor
from etl.errors import ArtifactError, FitError
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
