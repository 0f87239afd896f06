"""column_groups: which pipelines are transformed a few columns at a time, and how their columns are grouped."""

from __future__ import annotations

import pytest

from etl.pipeline import Pipeline
from etl.pipeline.column_groups import GROUP_COLUMNS, column_groups
from etl.schema import load_schema
from tests.conftest import REPO

CRITEO_SCHEMA = str(REPO / "schemas/criteo.yaml")


def pipeline(ops: list[dict]) -> Pipeline:
    return Pipeline({"name": "p", "ops": ops}, load_schema(CRITEO_SCHEMA), str(REPO / "pipelines" / "p.yaml"))


HASH = [{"op": "FillMissing", "columns": "@dense"}, {"op": "Log1p", "columns": "@dense"}, {"op": "Decode", "columns": "@categorical"},
        {"op": "Hash", "columns": "@categorical", "num_buckets": 1000}]  # fmt: skip


def test_groups_cover_the_schema_in_order_with_the_ops_on_their_columns() -> None:
    p = pipeline(HASH)
    groups = column_groups(p)
    assert groups is not None
    names = p.schema.names
    assert [c for g in groups for c in g.columns] == names
    assert all(len(g.columns) == GROUP_COLUMNS for g in groups[:-1]) and 0 < len(groups[-1].columns) <= GROUP_COLUMNS
    for g in groups:
        # every op that transforms a column of the group is there, in pipeline order, on the group's columns only
        expected = [(op.name, [c for c in op.columns if c in g.columns]) for op in p.ops if set(op.columns) & set(g.columns)]
        assert [(op.name, op.columns) for op in g.ops] == expected
    first = groups[0]
    assert first.columns[0] == "label" and [op.name for op in first.ops] == ["FillMissing", "Log1p"]
    assert p.ops[0].columns == [f"I{i}" for i in range(1, 14)]  # the pipeline's own ops are left whole


@pytest.mark.parametrize("ops", [
    HASH[:3] + [{"op": "HashedCross", "columns": ["C1", "C2"], "num_buckets": 100}] + HASH[3:],  # one column made of two
    HASH + [{"op": "Expr", "out": "ratio", "expr": "I1 / (I2 + 1)"}],  # a new column made of two
])  # fmt: skip
def test_an_op_that_is_not_columnwise_keeps_row_groups_whole(ops: list[dict]) -> None:
    assert column_groups(pipeline(ops)) is None


def test_few_columns_or_a_bad_size() -> None:
    p = pipeline(HASH)
    assert column_groups(p, size=len(p.schema.names)) is None  # one group: nothing to gain
    assert len(column_groups(p, size=1) or []) == len(p.schema.names)
    with pytest.raises(ValueError, match="size must be >= 1"):
        column_groups(p, size=0)


def test_groups_of_some_ops_over_some_columns() -> None:
    p = pipeline(HASH)
    cats = p.schema.by_role("categorical")
    groups = column_groups(p, ops=[p.ops[2]], columns=["label", *cats])  # Decode, over the label and the keys
    assert groups is not None
    assert [c for g in groups for c in g.columns] == ["label", *cats]
    assert [[op.name for op in g.ops] for g in groups] == [["Decode"]] * len(groups)
    assert groups[0].ops[0].columns == cats[: GROUP_COLUMNS - 1]


def test_ops_on_a_column_an_earlier_op_made_keep_row_groups_whole() -> None:
    """Avazu: DateParts makes hour_hour, which Categorify then reads; the ops after DateParts are columnwise, but
    hour_hour is no schema column a group could hold."""
    p = Pipeline.from_file(REPO / "pipelines" / "avazu.yaml")
    assert column_groups(p, ops=p.ops[1:]) is None
