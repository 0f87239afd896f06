"""transform_read: a row group read and transformed a group of columns at a time gives the output, the error and
the quarantined rows of a row group transformed whole; process_shard refuses a shard that changed while it was
read."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from etl.errors import InputError, RowError
from etl.io.parquet import Shard, open_shard
from etl.pipeline import Pipeline
from etl.pipeline.column_groups import GROUP_COLUMNS
from etl.preprocess.shard import process_shard, transform_read
from tests.conftest import REPO, criteo_table, spy_reads


@pytest.fixture(params=["criteo", "criteo_hash"])
def pipeline(request: pytest.FixtureRequest, tmp_path: Path) -> Pipeline:
    p = Pipeline.from_file(REPO / "pipelines" / f"{request.param}.yaml")
    if not p.is_fitted:
        p.fit([write(criteo_table(400, seed=3), tmp_path / "fit.parquet")])
    return p


def write(table: pa.Table, path: Path) -> Path:
    pq.write_table(table, path, row_group_size=150)
    return path


def with_bad(table: pa.Table, column: str, rows: list[int]) -> pa.Table:
    values = table.column(column).to_pylist()
    for r in rows:
        values[r] = "not-hex!"
    return table.set_column(table.column_names.index(column), column, pa.array(values, pa.string()))


def whole(pipeline: Pipeline, shard: Shard, i: int, on_error: str = "raise"):
    return pipeline.transform(shard.read(i), on_error)  # type: ignore[arg-type]


def test_groups_of_columns_give_the_output_of_a_whole_row_group(pipeline: Pipeline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shard = open_shard(write(criteo_table(400, seed=7), tmp_path / "a.parquet"), pipeline.schema)
    expected = [pipeline.to_arrow(whole(pipeline, shard, i).batch) for i in range(shard.num_row_groups)]
    reads = spy_reads(monkeypatch)
    run = transform_read(pipeline, "raise")
    for i in range(shard.num_row_groups):
        n, t, raw = run(shard, i)
        assert (n, raw, t.rejected) == (shard.file.metadata.row_group(i).num_rows, None, [])
        assert pipeline.to_arrow(t.batch).equals(expected[i])
    assert reads and all(c is not None and len(c) <= GROUP_COLUMNS for c in reads)  # never the whole row group at once
    assert len(reads) == shard.num_row_groups * -(-len(pipeline.schema.names) // GROUP_COLUMNS)


def test_an_invalid_row_is_raised_as_a_whole_row_group_raises_it(pipeline: Pipeline, tmp_path: Path) -> None:
    t = with_bad(with_bad(criteo_table(100, seed=2), "C20", [3]), "C3", [40])
    shard = open_shard(write(t, tmp_path / "a.parquet"), pipeline.schema)
    with pytest.raises(RowError) as expected:
        whole(pipeline, shard, 0)
    with pytest.raises(RowError) as got:
        transform_read(pipeline, "raise")(shard, 0)
    assert str(got.value) == str(expected.value)


def test_quarantined_rows_are_those_of_a_whole_row_group(pipeline: Pipeline, tmp_path: Path) -> None:
    t = with_bad(with_bad(criteo_table(100, seed=2), "C20", [3, 40]), "C3", [40, 77])
    shard = open_shard(write(t, tmp_path / "a.parquet"), pipeline.schema)
    expected = whole(pipeline, shard, 0, "quarantine")
    n, got, raw = transform_read(pipeline, "quarantine")(shard, 0)
    assert (n, got.batch.num_rows) == (100, 97)
    assert raw is not None and raw.num_rows == 100  # the rows as read, for the quarantine
    assert [(r.rows.tolist(), r.column, r.reason) for r in got.rejected] == [(r.rows.tolist(), r.column, r.reason) for r in expected.rejected]
    assert sorted(x for r in got.rejected for x in r.rows.tolist()) == [3, 40, 77]
    assert pipeline.to_arrow(got.batch).equals(pipeline.to_arrow(expected.batch))


def test_a_shard_replaced_between_two_reads_of_a_row_group_is_refused(pipeline: Pipeline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The second group of columns would come from another file with as many rows: an error naming the shard,
    and nothing left in the output directory, rather than rows made of two files."""
    source = write(criteo_table(400, seed=7), tmp_path / "a.parquet")
    other = write(criteo_table(400, seed=8), tmp_path / "b.parquet")
    read_table = Shard.read_table

    def replacing(shard: Shard, i: int, columns: list[str] | None = None) -> pa.Table:
        table = read_table(shard, i, columns)
        if other.exists():
            os.replace(other, source)  # after the first read: the next ones read the other file
        return table

    monkeypatch.setattr(Shard, "read_table", replacing)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(InputError, match="changed while it was preprocessed") as e:
        process_shard(pipeline, source, out / "part-00000.parquet", "raise", threading.Event())
    assert e.value.path == str(source)
    assert list(out.iterdir()) == []
