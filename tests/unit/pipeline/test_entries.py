"""Mistakes in a pipeline file explain themselves: broken YAML names the file, line and column; an unknown op, a
misspelt or missing parameter and an unknown column name the file, the op's index and say what was meant."""

from __future__ import annotations

from pathlib import Path

import pytest

from etl.errors import SpecError, YamlError
from etl.ops import Categorify, Hash, Log1p
from etl.ops.expr import Expr
from etl.pipeline import Pipeline
from etl.pipeline.entries import check_parameters, parameters
from etl.schema import load_schema
from tests.unit.pipeline.conftest import CATS, CRITEO_SCHEMA, DENSE, DLRM, write_pipeline


def error_of(tmp_path: Path, ops: list) -> SpecError:
    p = write_pipeline(tmp_path, ops)
    with pytest.raises(SpecError) as e:
        Pipeline.from_file(p)
    assert e.value.path == str(p)
    return e.value


def test_broken_pipeline_yaml_is_one_line_naming_file_line_and_column(tmp_path: Path) -> None:
    p = tmp_path / "pipe.yaml"
    p.write_text(f"name: t\nschema: {CRITEO_SCHEMA}\nops:\n  - {{op: Clamp, columns: [I1], min: 0\n  - {{op: Log1p, columns: [I1]}}\n")
    with pytest.raises(YamlError) as e:
        Pipeline.from_file(p)
    assert str(e.value) == f"{p}:5:5: invalid YAML: did not find expected ',' or '}}' (while parsing a flow mapping at 4:5)"
    assert "\n" not in str(e.value) and "<unicode string>" not in str(e.value)


def test_broken_schema_yaml_is_one_line_naming_its_file(tmp_path: Path) -> None:
    schema = tmp_path / "s.yaml"
    schema.write_text("name: s\ncolumns:\n  - name: a\n    role: dense\n   dtype: float64\n")
    with pytest.raises(YamlError) as e:
        load_schema(schema)
    assert str(e.value).startswith(f"{schema}:5:4: invalid YAML: ")
    p = write_pipeline(tmp_path, DLRM, schema="s.yaml")
    with pytest.raises(YamlError, match=rf"^{schema}:5:4: "):  # reached through the pipeline: the schema's file
        Pipeline.from_file(p)


@pytest.mark.parametrize(("name", "meant"), [("Categorfy", "Categorify"), ("categorify", "Categorify"), ("Log2", "Log1p"), ("Hahs", "Hash")])
def test_an_unknown_op_says_which_was_meant(tmp_path: Path, name: str, meant: str) -> None:
    e = error_of(tmp_path, [*DLRM[:4], {"op": name, "columns": "@categorical"}])
    assert e.field == "ops[4].op"
    assert e.problem.startswith(f"unknown op '{name}'; did you mean '{meant}'? (known: Bucketize, Categorify, Clamp, ")
    assert "MODULE:CLASS, see docs/custom-ops.md" in e.problem


def test_an_unknown_op_far_from_every_name_lists_them(tmp_path: Path) -> None:
    e = error_of(tmp_path, [*DLRM, {"op": "Zzyzx", "columns": ["I1"]}])
    assert e.problem.startswith("unknown op 'Zzyzx' (known: Bucketize, Categorify, Clamp, DateParts, Decode, Expr, FillMissing, ")


def test_a_misspelt_parameter_says_which_was_meant_and_lists_the_parameters(tmp_path: Path) -> None:
    e = error_of(tmp_path, [*DLRM[:4], {"op": "Categorify", "columns": "@categorical", "freq_treshold": 3}])
    assert str(e) == (f"{tmp_path / 'pipe.yaml'}: field 'ops[4] (Categorify).freq_treshold': unknown parameter; did you mean "
                      "'freq_threshold'? (Categorify takes columns, freq_threshold, max_size, oov_buckets, seed, online, admit_after, "
                      "capacity, evict, ttl_rows; see pipelines/README.md)")  # fmt: skip
    assert "__init__" not in str(e)


def test_a_missing_parameter_is_named(tmp_path: Path) -> None:
    e = error_of(tmp_path, [*DLRM[:4], {"op": "Hash", "columns": "@categorical"}])
    assert (e.field, e.problem) == ("ops[4] (Hash).num_buckets", "missing (Hash takes columns, num_buckets, seed; see pipelines/README.md)")


def test_an_op_without_parameters_refuses_any(tmp_path: Path) -> None:
    """Log1p takes no parameter: a stray one is no longer ignored."""
    e = error_of(tmp_path, [*DLRM[:2], {"op": "Log1p", "columns": "@dense", "base": 2}, *DLRM[3:]])
    assert (e.field, e.problem) == ("ops[2] (Log1p).base", "unknown parameter (Log1p takes columns only; see pipelines/README.md)")


def test_parameters_come_from_the_signature() -> None:
    assert parameters(Hash) == (["num_buckets", "seed"], ["num_buckets"], False)
    assert parameters(Log1p) == ([], [], False)
    assert parameters(Expr) == (["out", "expr"], ["out", "expr"], False)
    assert check_parameters(Categorify, {"freq_threshold": 2, "max_size": 10}) is None


def test_an_unknown_column_lists_close_matches_and_the_columns(tmp_path: Path) -> None:
    e = error_of(tmp_path, [*DLRM[:3], {"op": "Decode", "columns": [*CATS[:5], "c6"]}, *DLRM[4:]])
    assert e.field == "ops[3] (Decode).columns"
    assert e.problem == f"no column named 'c6'; did you mean 'C6'? (columns: label, {', '.join(DENSE)}, {', '.join(CATS)})"


def test_an_unknown_column_of_an_expression_lists_close_matches(tmp_path: Path) -> None:
    e = error_of(tmp_path, [*DLRM, {"op": "Expr", "out": "r", "expr": "I1 / (I_2 + 1)"}])
    assert e.field == "ops[5] (Expr).columns"
    assert e.problem.startswith("no column named 'I_2'; did you mean 'I2'? (columns: label, I1, I2, ")
