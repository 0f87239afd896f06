"""Expr: the expression parsed against a whitelist (never run as Python), its values and missing values, its
columns and output column in a pipeline."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from etl.backends import cpu
from etl.batch import Batch, Column
from etl.errors import SpecError
from etl.ops.expr import Expr, parse
from etl.pipeline import Pipeline
from tests.unit.pipeline.conftest import DLRM, write_pipeline


def evaluate(expr: str, **columns: Column) -> Column:
    op = Expr(Expr.implied_columns({"expr": expr}), out="out", expr=expr)
    n = len(next(iter(columns.values())).values)
    return op.transform(Batch(dict(columns), n), cpu)["out"]


def test_columns_come_from_the_expression_in_order_of_mention() -> None:
    assert parse("I2 / (I1 + I2) + col('I 3')")[1] == ["I2", "I1", "I 3"]


@pytest.mark.parametrize(
    ("expr", "problem"),
    [
        ("__import__('os').system('echo hi')", "not allowed (numbers, columns, + - * / **, and abs, sqrt, log1p, min, max, where)"),
        ("I1.real", "not allowed"),
        ("I1 if I2 else 0", "not allowed"),
        ("[I1]", "not allowed"),
        ("'text'", "not allowed"),
        ("True + I1", "not allowed (numbers, columns, + - * / **, and abs, sqrt, log1p, min, max, where): 'True'"),
        ("I1 ** 0.5", "the exponent of ** must be a whole number from 1 to 16 or -1 to -16 (sqrt(x) for x ** 0.5)"),
        ("I1 ** I2", "the exponent of ** must be"),
        ("1 + 2", "names no column"),
        ("I1 > 0", "a condition is not a number (conditions go in where(condition, a, b))"),
        ("where(1 < 2, I1, 0)", "compares two numbers (a condition reads a column): '1 < 2'"),
        ("where(I1, 1, 0)", "not a condition"),
        ("min(I1)", "min takes 2 arguments"),
        ("log1p(x=I1)", "log1p takes 1 argument"),
        ("I1 + 1e400", "not a finite float64 number: '1e400'"),
        ("I1 + 1 / 0", "a constant part is not finite: '1 / 0'"),
        ("I1 +", "is not an expression: invalid syntax"),
        ("", "must be an expression"),
        ("-" * 100 + "I1", "nested more than 64 levels"),
    ],
)  # fmt: skip
def test_what_is_not_an_expression_is_refused(expr: str, problem: str) -> None:
    with pytest.raises(ValueError) as e:
        parse(expr)
    assert problem in str(e.value)


def test_arithmetic_in_float64_with_constants_folded() -> None:
    x, y = Column(np.array([1.0, 4.0, -2.0])), Column(np.array([0, 3, 1], np.int64))
    assert evaluate("x / (y + 1)", x=x, y=y).values.tolist() == [1.0, 1.0, -1.0]
    assert evaluate("2 ** 3 * x - y ** 2", x=x, y=y).values.tolist() == [8.0, 23.0, -17.0]
    assert evaluate("x ** -1 + abs(x) + sqrt(abs(x))", x=x).values.tolist() == [3.0, 6.25, 2 - 0.5 + np.sqrt(2)]
    assert parse("x * (2 ** 10 - 1)")[0] == ("mul", ("col", "x"), 1023.0)
    out = evaluate("x", x=x)
    assert out.values.dtype == np.float64 and out.values is not x.values  # a copy, never the input's array


def test_where_min_and_max() -> None:
    x, y = Column(np.array([1.0, np.nan, -3.0, 0.0])), Column(np.array([2.0, 1.0, np.nan, -0.0]))
    assert evaluate("where(x > 0 and y >= 2 or not x == x, 1, 0)", x=x, y=y).values.tolist() == [1.0, 1.0, 0.0, 0.0]
    assert evaluate("where(-1 < x <= 1, x, 10)", x=x).values.tolist() == [1.0, 10.0, 10.0, 0.0]
    lo, hi = evaluate("min(x, y)", x=x, y=y).values, evaluate("max(x, y)", x=x, y=y).values
    assert lo[[0, 3]].tolist() == [1.0, 0.0] and np.isnan(lo[[1, 2]]).all()  # NaN when either is NaN
    assert hi[[0, 3]].tolist() == [2.0, 0.0] and np.isnan(hi[[1, 2]]).all()
    assert np.signbit(lo[3]) == np.signbit(hi[3]) == False  # noqa: E712 - on ties, the first argument


def test_a_row_is_missing_when_a_column_it_reads_is_missing() -> None:
    x = Column(np.array([1.0, 2.0, 3.0]), np.array([True, False, True]))
    y = Column(np.array([1.0, 1.0, 0.0]), np.array([True, True, False]))
    out = evaluate("where(x > 0, 1, y)", x=x, y=y)
    assert out.valid.tolist() == [True, False, False] and out.values[0] == 1.0


def test_an_expression_in_a_pipeline_writes_a_float32_column(tmp_path: Path) -> None:
    ops = [*DLRM, {"op": "Expr", "out": "ratio", "expr": "I1 / (I2 + 1)"}, {"op": "Expr", "columns": ["I3"], "out": "I3", "expr": "-I3"}]
    p = Pipeline.from_file(write_pipeline(tmp_path, ops))
    assert p.ops[5].columns == ["I1", "I2"] and p.output_columns[-1] == "ratio"
    assert p.output_schema().field("ratio") == pa.field("ratio", pa.float32())
    raw = {"label": [1, 0], **{f"I{i}": [3, None] for i in range(1, 14)}, **{f"C{i}": ["0a0b0c0d", None] for i in range(1, 27)}}
    out = p.transform_table(raw)
    assert out.column("ratio").to_pylist() == [pytest.approx(np.log1p(3) / (np.log1p(3) + 1)), 0.0]
    assert out.column("I3").to_pylist() == [pytest.approx(-np.log1p(3)), -0.0]


def test_a_row_divided_by_zero_is_an_invalid_row(tmp_path: Path) -> None:
    p = Pipeline.from_file(write_pipeline(tmp_path, [*DLRM, {"op": "Expr", "out": "r", "expr": "I1 / I2"}]))
    raw = {"label": [1, 0], **{f"I{i}": [3, 0] for i in range(1, 14)}, **{f"C{i}": ["0a0b0c0d", None] for i in range(1, 27)}}
    with pytest.raises(Exception, match=r"row 1, column 'r': value is NaN or infinite after the transform"):
        p.transform_table(raw)


@pytest.mark.parametrize(
    ("entry", "field", "problem"),
    [
        ({"columns": ["I1"], "out": "r", "expr": "I1 + I2"}, "ops[5] (Expr)", "Expr reads the columns its expr names (I1, I2); columns names ['I1']"),
        ({"out": "r", "expr": "C1 + 1"}, "ops[5] (Expr).columns", "column 'C1' holds ids values, the op needs number"),
        ({"out": "I5", "expr": "I1 + 1"}, "ops[5] (Expr)", "creates column 'I5', which already exists"),
        ({"out": "", "expr": "I1 + 1"}, "ops[5] (Expr)", "Expr.out must be the name of the output column"),
        ({"out": "r", "expr": "I1 +* 1"}, "ops[5] (Expr)", "is not an expression"),
        ({"out": "r"}, "ops[5] (Expr).expr", "missing (Expr takes columns, out, expr; see pipelines/README.md)"),
        ({"out": "r", "expr": "I1 + label"}, "ops[5] (Expr)", "Expr reads the label 'label' into 'r': a feature made of the row's own target"),
    ],
)  # fmt: skip
def test_expr_entries_that_cannot_work_are_spec_errors(tmp_path: Path, entry: dict, field: str, problem: str) -> None:
    with pytest.raises(SpecError) as e:
        Pipeline.from_file(write_pipeline(tmp_path, [*DLRM, {"op": "Expr", **entry}]))
    assert e.value.field == field and problem in e.value.problem, str(e.value)


def test_the_label_may_be_rewritten_in_place(tmp_path: Path) -> None:
    """A rating made a 0/1 target: the label read into the label itself (no feature is made of it)."""
    p = Pipeline.from_file(write_pipeline(tmp_path, [*DLRM, {"op": "Expr", "out": "label", "expr": "where(label >= 1, 1, 0)"}]))
    raw = {"label": [1, 0], **{f"I{i}": [3, None] for i in range(1, 14)}, **{f"C{i}": ["0a0b0c0d", None] for i in range(1, 27)}}
    assert p.transform_table(raw).column("label").to_pylist() == [1.0, 0.0]
