"""etl.pipeline.single_pass: which ops may run first, the fitted state (the artifact bytes) of a fit that stashes
equal to a fit from the shards, what it stashes, and a stashed row group transformed as from the source."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from etl.batch import Batch
from etl.errors import InputError, RowError
from etl.io.parquet import open_shard
from etl.ops import InvalidRows
from etl.ops.dense import FillMissing
from etl.pipeline import Pipeline
from etl.pipeline.column_groups import GROUP_COLUMNS
from etl.pipeline.plan import fit_plan, fit_stages
from etl.pipeline.single_pass import fit_stashing, runs_first, transform_stashed
from etl.pipeline.stash import RawRows, Stash
from tests.conftest import spy_reads, tree_bytes
from tests.unit.pipeline.conftest import DLRM, PIPELINES, write_pipeline

DATED_SCHEMA = {
    "name": "dated",
    "columns": [
        {"name": "label", "role": "label", "dtype": "int64"},
        {"name": "hour", "role": "categorical", "dtype": "int64", "encoding": "int"},
        {"name": "C1", "role": "categorical", "dtype": "string", "encoding": "hex"},
    ],
}
#: DateParts reads ``hour`` as the source holds it, and feeds no fitted op; Decode of ``hour`` feeds Categorify:
#: running it first would hand DateParts decoded keys
DATED = [
    {"op": "DateParts", "columns": ["hour"], "format": "%y%m%d%H", "parts": ["weekday"]},
    {"op": "Hash", "columns": ["hour_weekday"], "num_buckets": 10},
    {"op": "Decode", "columns": ["hour", "C1"]},
    {"op": "Categorify", "columns": ["hour", "C1"]},
]


def dated_shards(tmp_path: Path) -> list[Path]:
    rng = np.random.default_rng(3)
    paths = []
    for i, n in enumerate([120, 75]):
        hours = rng.choice([24010100, 24010213, 24010323, 24010405], n)
        keys = [f"{k:08x}" for k in rng.integers(0, 20, n)]
        t = pa.table({"label": rng.integers(0, 2, n), "hour": hours, "C1": keys})
        pq.write_table(t, tmp_path / f"{i}.parquet", row_group_size=50)
        paths.append(tmp_path / f"{i}.parquet")
    return paths


def dated_pipeline(tmp_path: Path) -> Path:
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(DATED_SCHEMA))
    return write_pipeline(tmp_path, DATED, schema=str(tmp_path / "schema.yaml"))


def test_ops_that_feed_the_fit_run_first_unless_an_earlier_op_reads_what_they_write(tmp_path: Path) -> None:
    p = Pipeline.from_file(PIPELINES / "criteo.yaml")
    first, _ = fit_plan(p, fit_stages(p.ops)[0])
    assert [op.name for op in first] == ["Decode"]
    assert runs_first(p.ops, first)
    dated = Pipeline.from_file(dated_pipeline(tmp_path))
    first, _ = fit_plan(dated, fit_stages(dated.ops)[0])
    assert [op.name for op in first] == ["Decode"]
    assert not runs_first(dated.ops, first)


@pytest.mark.parametrize("budget", [1 << 30, 0])
@pytest.mark.parametrize("case", ["criteo", "two stages", "dated"])
def test_a_stashing_fit_saves_the_artifacts_of_a_fit_from_the_shards(criteo, tmp_path: Path, case: str, budget: int) -> None:
    if case == "dated":
        pipeline, paths = dated_pipeline(tmp_path), dated_shards(tmp_path)
    else:
        paths = criteo[0]
        ops = [DLRM[0], {"op": "Normalize", "columns": "@dense"}, {"op": "Normalize", "columns": "@dense"}, *DLRM[3:]]
        pipeline = PIPELINES / "criteo.yaml" if case == "criteo" else write_pipeline(tmp_path, ops)
    reference = Pipeline.from_file(pipeline)
    reference.fit(paths, workers=2)
    reference.save(tmp_path / "reference")
    p = Pipeline.from_file(pipeline)
    with Stash(budget, tmp_path) as stash:
        plan = fit_stashing(p, paths, stash, set(range(len(paths))), workers=2)
        p.save(tmp_path / "single")
        assert tree_bytes(tmp_path / "single") == tree_bytes(tmp_path / "reference")
        assert plan.first + plan.rest == [op for op in p.ops if op in plan.first] + [op for op in p.ops if op not in plan.first]
        for k, path in enumerate(paths):
            shard = open_shard(path, p.schema)
            for i in range(shard.num_row_groups):
                entry = stash.pop((k, i))
                assert isinstance(entry, RawRows if case == "dated" else Batch)  # dated: Decode may not run first
                n, t, raw = transform_stashed(p, plan, entry, shard, "raise")
                expected = reference.transform(shard.read(i))
                assert n == shard.file.metadata.row_group(i).num_rows and raw is None  # no row rejected: no raw rows kept
                assert p.to_arrow(t.batch).equals(reference.to_arrow(expected.batch))


def test_only_the_shards_asked_for_are_stashed(criteo, tmp_path: Path) -> None:
    paths = criteo[0]
    with Stash(1 << 30, tmp_path) as stash:
        fit_stashing(Pipeline.from_file(PIPELINES / "criteo.yaml"), paths, stash, {1}, workers=2)
        assert (1, 0) in stash and all((k, 0) not in stash for k in (0, 2, 3))


def test_a_prepared_batch_holds_the_columns_the_fit_reads_and_the_transform_reads_the_others_again(criteo, tmp_path: Path) -> None:
    """Criteo: the fit reads the label and the categorical columns; the dense ones are read again by the
    transform. Two stages of Normalize then hashed keys: both stages read the dense columns, none the keys."""
    paths = criteo[0]
    p = Pipeline.from_file(PIPELINES / "criteo.yaml")
    dense = tuple(p.schema.by_role("dense"))
    with Stash(1 << 30, tmp_path) as stash:
        plan = fit_stashing(p, paths, stash, set(range(len(paths))), workers=2)
        assert plan.reread == dense and set(plan.versions) == {str(q) for q in paths}
        entry = stash.get((0, 0))
        assert isinstance(entry, Batch) and list(entry.columns) == [c for c in p.schema.names if c not in dense]
    ops = [DLRM[0], {"op": "Normalize", "columns": "@dense"}, {"op": "Normalize", "columns": "@dense"}, *DLRM[3:]]
    two = Pipeline.from_file(write_pipeline(tmp_path, ops))
    with Stash(1 << 30, tmp_path) as stash:
        plan = fit_stashing(two, paths, stash, set(range(len(paths))), workers=2)
        assert plan.reread == tuple(two.schema.by_role("categorical"))
        entry = stash.get((0, 0))
        assert isinstance(entry, Batch) and list(entry.columns) == ["label", *dense]


@pytest.mark.parametrize("reread", [True, False])
def test_a_shard_changed_after_the_fit_read_it_is_refused_by_the_transform(criteo, tmp_path: Path, reread: bool) -> None:
    """Whether the transform reads columns from the shard again (Criteo's dense ones) or takes every one from the
    stash (a fit that reads them all): output made from what the fit read would be recorded in the manifest as the
    output of the file there now."""
    path = tmp_path / "shard.parquet"
    table = pq.read_table(criteo[0][0])
    pq.write_table(table, path, row_group_size=table.num_rows)
    ops = DLRM[:3] + [{"op": "Normalize", "columns": "@dense"}, DLRM[3], {"op": "Categorify", "columns": "@categorical"}]
    p = Pipeline.from_file(PIPELINES / "criteo.yaml" if reread else write_pipeline(tmp_path, ops))
    with Stash(1 << 30, tmp_path) as stash:
        plan = fit_stashing(p, [path], stash, {0})
        assert bool(plan.reread) == reread
        pq.write_table(table.slice(1), path, row_group_size=table.num_rows)  # another file, one row shorter
        with pytest.raises(InputError, match="changed while it was preprocessed"):
            transform_stashed(p, plan, stash.pop((0, 0)), open_shard(path, p.schema), "raise")


def test_a_row_group_with_rows_rejected_by_the_fit_is_stashed_whole(criteo, tmp_path: Path) -> None:
    path = tmp_path / "shard.parquet"
    table = pq.read_table(criteo[0][0])
    labels = table.column("label").to_pylist()
    labels[3] = None
    table = table.set_column(table.column_names.index("label"), "label", pa.array(labels, pa.int64()))
    pq.write_table(table, path, row_group_size=table.num_rows)
    p = Pipeline.from_file(PIPELINES / "criteo.yaml")
    with Stash(1 << 30, tmp_path) as stash:
        plan = fit_stashing(p, [path], stash, {0}, on_error="quarantine")
        entry = stash.pop((0, 0))
        assert isinstance(entry, RawRows) and entry.table.column_names == p.schema.names
        n, t, raw = transform_stashed(p, plan, entry, open_shard(path, p.schema), "quarantine")
        assert n == table.num_rows and t.batch.num_rows == table.num_rows - 1 and raw is not None


def test_the_fit_reads_the_columns_it_keeps_a_group_at_a_time(criteo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Criteo's first stage (label check, Decode) is columnwise: the 27 columns it keeps are read GROUP_COLUMNS at a time, and
    the prepared batch holds what running it on the row group whole gives."""
    paths = criteo[0]
    p = Pipeline.from_file(PIPELINES / "criteo.yaml")
    first, _ = fit_plan(p, fit_stages(p.ops)[0])
    reads = spy_reads(monkeypatch)
    with Stash(1 << 30, tmp_path) as stash:
        plan = fit_stashing(p, paths[:1], stash, {0})
        entry = stash.get((0, 0))
    monkeypatch.undo()
    assert reads and all(c is not None and len(c) <= GROUP_COLUMNS for c in reads)
    kept = [c for c in p.schema.names if c not in plan.reread]
    whole = p.run_ops(open_shard(paths[0], p.schema).read(0, kept), first, "raise", labels=True, output=False).batch
    assert isinstance(entry, Batch) and list(entry.columns) == list(whole.columns) == kept
    for c in kept:
        assert np.array_equal(entry[c].values, whole[c].values) and np.array_equal(entry.row_ids, whole.row_ids)


def test_the_transform_of_a_prepared_batch_goes_a_group_of_columns_at_a_time(criteo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = criteo[0][0]
    p = Pipeline.from_file(PIPELINES / "criteo.yaml")
    shard = open_shard(path, p.schema)
    with Stash(1 << 30, tmp_path) as stash:
        plan = fit_stashing(p, [path], stash, {0})
        expected = p.to_arrow(p.transform(shard.read(0)).batch)
        entry = stash.pop((0, 0))
        reads = spy_reads(monkeypatch)
        n, t, raw = transform_stashed(p, plan, entry, shard, "raise")
    assert (n, raw, t.rejected) == (shard.file.metadata.row_group(0).num_rows, None, [])
    assert p.to_arrow(t.batch).equals(expected)
    assert reads and all(c is not None and len(c) <= GROUP_COLUMNS and set(c) <= set(plan.reread) for c in reads)  # dense columns, by group


@pytest.mark.parametrize("on_error", ["raise", "quarantine"])
def test_a_row_the_transform_of_a_prepared_batch_refuses_is_handled_as_from_the_source(
    criteo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, on_error: str
) -> None:
    """Rows 3 and 41 refused by FillMissing in I5 (a column the fit does not read, so the fit stashed the row group
    prepared): the row group is transformed again from the source, which raises or quarantines them."""
    path = criteo[0][0]
    p = Pipeline.from_file(PIPELINES / "criteo.yaml")
    shard = open_shard(path, p.schema)
    fill = FillMissing.transform

    def refusing(self: FillMissing, batch: Batch, xp):  # type: ignore[no-untyped-def]
        if "I5" in self.columns:
            bad = np.isin(batch.row_ids, [3, 41])
            if bad.any():
                raise InvalidRows("I5", bad, "refused")
        return fill(self, batch, xp)

    monkeypatch.setattr(FillMissing, "transform", refusing)
    with Stash(1 << 30, tmp_path) as stash:
        plan = fit_stashing(p, [path], stash, {0}, on_error=on_error)  # type: ignore[arg-type]
        entry = stash.pop((0, 0))
        assert isinstance(entry, Batch)  # the fit saw no bad row
        if on_error == "raise":
            with pytest.raises(RowError, match="row 3, column 'I5'"):
                transform_stashed(p, plan, entry, shard, "raise")
            return
        n, t, raw = transform_stashed(p, plan, entry, shard, "quarantine")
    whole = p.transform(shard.read(0), "quarantine")
    assert raw is not None and n == raw.num_rows == whole.batch.num_rows + 2
    assert [(r.rows.tolist(), r.column, r.reason) for r in t.rejected] == [([3, 41], "I5", "refused")]
    assert p.to_arrow(t.batch).equals(p.to_arrow(whole.batch))
