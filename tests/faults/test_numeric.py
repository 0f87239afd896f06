"""Numeric edges, exactly: Normalize refuses to fit a mean or std beyond the float64 range, artifacts never hold
``Infinity``/``NaN``, and values beyond the float32 range are invalid output (``RowError`` or quarantine), on both
backends; a column whose normalized values collapse on one outlier is reported in ``etl preprocess``'s summary and
its artifacts; no numpy warning reaches ``etl``'s stderr."""

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
        warnings.simplefilter("error")  # the overflow is the FitError, not a numpy warning besides
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


# ---------------------------------------------------------------- etl preprocess: the collapse warning, stderr


CLI_SCHEMA = "name: numbers\ncolumns:\n  - {name: label, role: label, dtype: int64}\n  - {name: C5, role: dense, dtype: float64}\n"


def cli_files(tmp_path: Path, values: list[float | None], ops: str, name: str = "raw") -> tuple[Path, Path]:
    """A shard of ``values`` in column C5 (in its own directory ``name``) and a pipeline of the ``ops`` (YAML flow
    items, one a line) in ``tmp_path``."""
    (tmp_path / "schema.yaml").write_text(CLI_SCHEMA)
    (tmp_path / "pipe.yaml").write_text("name: numbers\nschema: schema.yaml\nops:\n" + "".join(f"  - {op}\n" for op in ops.splitlines()))
    raw = tmp_path / name
    raw.mkdir()
    pq.write_table(pa.table({"label": pa.array([0] * len(values), pa.int64()), "C5": pa.array(values, pa.float64())}), raw / "part-00000.parquet")
    return raw, tmp_path / "pipe.yaml"


NORMALIZE = "{op: Normalize, columns: [C5]}"
COLLAPSE = ("warning: Normalize: column 'C5': normalized values collapse: std 1.39e+38 is dominated by max 1e+39; 50 of 51 non-zero "
            "values are normalized into one value (-0.1414214) (Clamp or Log1p before Normalize)")  # fmt: skip


def test_preprocess_reports_a_column_that_collapses_on_one_outlier(tmp_path):
    """Fifty ordinary values and one 1e39: the run succeeds (the values are valid), and says the column collapsed,
    in its summary and in the artifacts it writes (the same bytes on 1 and 2 workers, and from etl fit), and again
    in runs with those artifacts (following too)."""
    from tests.conftest import run_etl

    raw, pipe = cli_files(tmp_path, [float(v) for v in range(1, 51)] + [1e39], NORMALIZE)
    runs = {}
    for workers in (1, 2):
        out = tmp_path / f"out{workers}"
        runs[workers] = run_etl("preprocess", "--pipeline", pipe, "--input", raw, "--out", out, "--workers", workers)
        assert COLLAPSE in runs[workers].stdout.splitlines() and runs[workers].stderr == ""
    saved = (tmp_path / "out1/artifacts/pipeline.json").read_bytes()
    assert saved == (tmp_path / "out2/artifacts/pipeline.json").read_bytes()
    assert json.loads(saved)["ops"][0]["state"]["warnings"] == {"C5": COLLAPSE.split("column 'C5': ")[1]}
    again = run_etl("preprocess", "--pipeline", pipe, "--input", raw, "--out", tmp_path / "again", "--artifacts", tmp_path / "out1/artifacts")
    assert COLLAPSE in again.stdout.splitlines()
    followed = run_etl("preprocess", "--follow", "--pipeline", pipe, "--input", raw, "--out", tmp_path / "followed", "--artifacts",
                       tmp_path / "out1/artifacts", "--stop-after-idle", 0.2, "--poll-interval", 0.05)  # fmt: skip
    assert COLLAPSE in followed.stdout.splitlines()
    assert "warning: Normalize ops[0]: column 'C5': normalized values collapse" in run_etl("inspect", tmp_path / "out1").stdout
    assert COLLAPSE in run_etl("fit", "--pipeline", pipe, "--input", raw, "--artifacts", tmp_path / "fitted").stdout.splitlines()
    assert (tmp_path / "fitted/pipeline.json").read_bytes() == saved
    out = pq.read_table(tmp_path / "out1/part-00000.parquet").column("C5").to_numpy()
    assert len(set(out.tolist())) == 2  # what the warning says: the fifty are one value, the outlier another


def test_preprocess_of_an_ordinary_column_has_no_warning(tmp_path):
    from tests.conftest import run_etl

    raw, pipe = cli_files(tmp_path, [float(v) for v in range(1, 51)] + [1e3], NORMALIZE)
    run = run_etl("preprocess", "--pipeline", pipe, "--input", raw, "--out", tmp_path / "out")
    assert "warning" not in run.stdout and "warnings" not in (tmp_path / "out/artifacts/pipeline.json").read_text()


FILL_CLAMP_LOG = "{op: FillMissing, columns: [C5], value: 0}\n{op: Clamp, columns: [C5], min: 0}\n{op: Log1p, columns: [C5]}"
NUMERIC_EDGES = {  # name -> (values, ops, on_error, what the run ends with: "" for success, else its error line)
    "1e308 (Normalize's std overflows)": ([1.0, 1e308, -1e308], NORMALIZE, "raise", "error: Normalize: column 'C5': mean or std beyond"),
    "1e200 (its square overflows)": ([1e200, 1.0], NORMALIZE, "quarantine", "error: Normalize: column 'C5': mean or std beyond"),
    "inf": ([1.0, float("inf"), 3.0], NORMALIZE, "raise", "error: Normalize: column 'C5': 1 of 3 values to fit are NaN or infinite"),
    "-inf and NaN": ([1.0, float("-inf"), float("nan")], NORMALIZE, "quarantine", "error: Normalize: column 'C5': 2 of 3 values to fit"),
    "1e39 among ordinary values": ([1.0, 2.0, 1e39, None], NORMALIZE, "raise", ""),
    "-5 into Log1p": ([1.0, -5.0, 3.0], "{op: Log1p, columns: [C5]}", "quarantine", ""),
    "-1, NaN, inf through FillMissing, Clamp, Log1p": ([-1.0, float("nan"), float("inf"), 1e39], FILL_CLAMP_LOG, "quarantine", ""),
}


@pytest.mark.parametrize("case", sorted(NUMERIC_EDGES))
def test_no_numpy_warning_reaches_stderr(tmp_path, case):
    """Overflowing sums, NaN and infinities in the fit and the transform: the run ends as documented (a one-line
    error, or rows quarantined), and stderr holds that line at most, never a RuntimeWarning."""
    from tests.conftest import run_etl

    values, ops, on_error, ends = NUMERIC_EDGES[case]
    raw, pipe = cli_files(tmp_path, values, ops)
    run = run_etl("preprocess", "--pipeline", pipe, "--input", raw, "--out", tmp_path / "out", "--on-error", on_error, check=False)
    assert "Warning" not in run.stderr + run.stdout
    if ends:
        assert run.returncode == 2 and run.stderr.startswith(ends) and len(run.stderr.splitlines()) == 1
    else:
        assert run.returncode == 0 and run.stderr == ""


@pytest.mark.parametrize("on_error", ["raise", "quarantine"])
def test_transform_overflow_with_fitted_artifacts_warns_of_nothing(tmp_path, on_error):
    """Artifacts fitted on values near 1 (std 1e-7); a later shard holds 1e308: (x - mean) / std overflows float64
    in the transform, which reports the row (or quarantines it), without a numpy warning."""
    from tests.conftest import run_etl

    fit_raw, pipe = cli_files(tmp_path, [1.0, 1.0000001, 1.0000002], NORMALIZE, "fit-raw")
    run_etl("fit", "--pipeline", pipe, "--input", fit_raw, "--artifacts", tmp_path / "art")
    raw = tmp_path / "raw"
    raw.mkdir()
    pq.write_table(pa.table({"label": pa.array([0, 0], pa.int64()), "C5": pa.array([1.0, 1e308], pa.float64())}), raw / "part-00000.parquet")
    run = run_etl("preprocess", "--pipeline", pipe, "--input", raw, "--out", tmp_path / "out", "--artifacts", tmp_path / "art",
                  "--on-error", on_error, check=False)  # fmt: skip
    assert "Warning" not in run.stderr + run.stdout
    if on_error == "raise":
        assert run.returncode == 2 and len(run.stderr.splitlines()) == 1
        assert "row 1, column 'C5': value is NaN or infinite after the transform" in run.stderr
    else:
        assert run.returncode == 0 and run.stderr == "" and "1 quarantined" in run.stdout
