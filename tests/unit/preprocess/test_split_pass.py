"""The first pass of a split run (etl.preprocess.split_pass) against plain-Python references: quantile bounds over
the rows a Filter keeps, and each key's latest events in History's order (time, tiebreak with missing values first,
input position), whatever the workers, the shard cuts and how often the pass reduces what it holds."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from etl.errors import ConfigError, RowError
from etl.pipeline import Pipeline
from etl.pipeline.split import LastSplit, Quantile, TimeSplit
from etl.pipeline.split_rows import TEST, TRAIN, VALID, LatestRoles, TimeRoles
from etl.preprocess import split_pass
from etl.preprocess.split_pass import resolve

SCHEMA = {
    "name": "events",
    "columns": [
        {"name": "label", "role": "label", "dtype": "int64"},
        {"name": "user", "role": "categorical", "dtype": "string"},
        {"name": "ts", "role": "passthrough", "dtype": "int64"},
        {"name": "tb", "role": "passthrough", "dtype": "int64"},
        {"name": "score", "role": "dense", "dtype": "float64"},
    ],
}


def events(n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({
        "label": pa.array(rng.integers(0, 2, n), pa.int64()),
        "user": pa.array([f"u{v}" for v in np.minimum(rng.zipf(1.4, n), 40)]),
        "ts": pa.array(rng.integers(0, 30, n), pa.int64()),
        "tb": pa.array(rng.integers(0, 3, n), pa.int64(), mask=rng.random(n) < 0.2),
        "score": pa.array(rng.random(n) * 10),
    })  # fmt: skip


def setup(tmp: Path, table: pa.Table, cuts: list[int], row_group: int, stages: list[dict[str, Any]] | None = None) -> tuple[Pipeline, list[Path]]:
    (tmp / "schema.yaml").write_text(yaml.safe_dump(SCHEMA))
    ops = [{"op": "Decode", "columns": ["user"]}, {"op": "Hash", "columns": ["user"], "num_buckets": 9}]
    doc = {"name": "p", "schema": "schema.yaml", "ops": ops, **({"stages": stages} if stages else {})}
    (tmp / "p.yaml").write_text(yaml.safe_dump(doc))
    (tmp / "raw").mkdir()
    bounds = [0, *cuts, table.num_rows]
    paths = []
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        paths.append(tmp / "raw" / f"s{i}.parquet")
        pq.write_table(table.slice(a, b - a), paths[-1], row_group_size=row_group)
    return Pipeline.from_file(tmp / "p.yaml"), paths


def positions(cuts: list[int], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's (shard index, row in the shard) when the table is cut at ``cuts``."""
    bounds = np.array([0, *cuts, n])
    inputs = np.searchsorted(bounds, np.arange(n), side="right") - 1
    return inputs, np.arange(n) - bounds[inputs]


def reference_latest(rows: list[dict[str, Any]], valid: int, test: int) -> list[int]:
    """Each row's role: by key, sorted by (ts, tb with missing first, position), the last ``test`` are test rows,
    the ``valid`` before them valid rows."""
    by_key: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        by_key.setdefault(r["user"], []).append(i)
    roles = [TRAIN] * len(rows)
    for members in by_key.values():
        ordered = sorted(members, key=lambda i: (rows[i]["ts"], rows[i]["tb"] is not None, rows[i]["tb"] or 0, i))
        for rank, i in enumerate(reversed(ordered)):
            roles[i] = TEST if rank < test else VALID if rank < test + valid else TRAIN
    return roles


@pytest.mark.parametrize(("workers", "cuts", "row_group", "reduce_rows"), [(1, [], 1000, 1 << 20), (2, [37, 300, 301], 64, 5), (2, [500], 17, 50)])
def test_latest_events_against_a_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int, cuts: list[int], row_group: int,
                                           reduce_rows: int) -> None:  # fmt: skip
    monkeypatch.setattr(split_pass, "REDUCE_ROWS", reduce_rows)
    table = events(800, seed=3)
    pipeline, shards = setup(tmp_path, table, cuts, row_group)
    split = LastSplit("user", "ts", ("tb",), 2, 1)
    got = resolve(pipeline, split, shards, workers)
    assert isinstance(got, LatestRoles)
    inputs, rows = positions(cuts, table.num_rows)
    expected = reference_latest(table.to_pylist(), 2, 1)
    assert got.roles(None, inputs, rows).tolist() == expected
    assert 0 < expected.count(VALID) < expected.count(TRAIN)


def test_latest_events_without_tiebreak_take_input_order_and_see_only_filtered_rows(tmp_path: Path) -> None:
    table = events(300, seed=5)
    pipeline, shards = setup(tmp_path, table, [100, 200], 32, stages=[{"stage": "Filter", "where": {"column": "score", "op": "<", "value": 7}}])
    got = resolve(pipeline, LastSplit("user", "ts", (), 0, 2), shards, 2)
    inputs, rows = positions([100, 200], table.num_rows)
    kept = [i for i, r in enumerate(table.to_pylist()) if r["score"] < 7]
    expected = reference_latest([dict(r, tb=None) for r in table.take(kept).to_pylist()], 0, 2)
    assert got.roles(None, inputs[kept], rows[kept]).tolist() == expected


@pytest.mark.parametrize("q", [0.29, 0.5, 0.999])
def test_quantile_bounds_are_exact_over_the_filtered_rows(tmp_path: Path, q: float) -> None:
    table = events(700, seed=1)
    pipeline, shards = setup(tmp_path, table, [350], 50, stages=[{"stage": "Filter", "where": {"column": "label", "op": "==", "value": 1}}])
    got = resolve(pipeline, TimeSplit("score", Quantile(Fraction(str(q))), 10), shards, 2)
    scores = sorted(r["score"] for r in table.to_pylist() if r["label"] == 1)
    assert got == TimeRoles(pipeline.schema, "score", scores[int(Fraction(str(q)) * len(scores))], 10)
    fixed = resolve(pipeline, TimeSplit("ts", 3, None), shards, 1)  # no pass
    assert fixed == TimeRoles(pipeline.schema, "ts", 3, None)


def test_a_quantile_after_valid_until_is_refused(tmp_path: Path) -> None:
    pipeline, shards = setup(tmp_path, events(100, seed=2), [], 100)
    with pytest.raises(ConfigError, match=r"train_until resolves to .* after valid_until 0 \(\{quantile: 0.5\} and 0\)"):
        resolve(pipeline, TimeSplit("score", Quantile(Fraction(1, 2)), 0), shards, 1)


@pytest.mark.parametrize(("column", "split"), [("ts", TimeSplit("ts", Quantile(Fraction(1, 2)), None)), ("ts", LastSplit("user", "ts", (), 1, 1)),
                                               ("user", LastSplit("user", "ts", (), 1, 1))])  # fmt: skip
def test_a_row_without_a_split_value_is_named(tmp_path: Path, column: str, split: Any) -> None:
    table = events(100, seed=2)
    values = table.column(column).to_pylist()
    values[61] = None
    table = table.set_column(table.column_names.index(column), column, pa.array(values, table.schema.field(column).type))
    pipeline, shards = setup(tmp_path, table, [50], 20)
    with pytest.raises(RowError, match="is missing, so the row has no split") as e:
        resolve(pipeline, split, shards, 2)
    assert (e.value.path, e.value.row_group, e.value.row, e.value.column) == (str(shards[1]), 0, 11, column)
