"""`etl preprocess` with a pipeline that has reshaping stages, as a user runs it: the output holds exactly the rows
a pyarrow filter keeps, transformed with vocabularies fitted on those rows only (threads, ``--cluster local:2``,
``etl fit``), the row accounting adds up (quarantine included), a rerun and ``--follow`` keep their rules, a shard
whose rows are all removed has an empty output file, and the Loader refuses stages on raw shards but reads the
output like any other."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from etl import Loader
from etl.errors import ConfigError
from etl.io.processed import read_manifest
from tests.conftest import REPO, criteo_table, filtered_copies, pipeline_with_stages, run_etl, tree_bytes

CRITEO = REPO / "pipelines/criteo.yaml"
HASH = REPO / "pipelines/criteo_hash.yaml"
STAGES = [
    {"stage": "Filter", "where": {"any": [{"column": "I1", "op": ">=", "value": 300}, {"column": "I2", "op": "is_null"}]}},
    {"stage": "Filter", "where": {"column": "C2", "op": "not_null"}},
]
SIZES = [400, 260, 330]


def reference_keep(t: pa.Table) -> pa.Array:
    """What STAGES keep, written with pyarrow compute."""
    return pc.and_(pc.or_(pc.fill_null(pc.greater_equal(t["I1"], 300), False), pc.is_null(t["I2"])), pc.is_valid(t["C2"]))


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    """Three shards of several row groups, then a fourth whose rows the stages all remove (C2 is always null)."""
    d = tmp_path_factory.mktemp("raw")
    for i, n in enumerate(SIZES):
        pq.write_table(criteo_table(n, seed=20 + i), d / f"{i}.parquet", row_group_size=120)
    t = criteo_table(90, seed=30)
    t = t.set_column(t.column_names.index("C2"), "C2", pa.nulls(90, pa.string()))
    pq.write_table(t, d / "3.parquet", row_group_size=50)
    return d


@pytest.fixture(scope="module")
def staged(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("pipelines")
    return pipeline_with_stages(CRITEO, STAGES, d / "criteo_staged.yaml")


@pytest.fixture(scope="module")
def reference(raw: Path, tmp_path_factory) -> Path:
    """The criteo pipeline (no stages) run over the shards filtered beforehand with pyarrow."""
    filtered = filtered_copies(sorted(raw.glob("*.parquet")), reference_keep, tmp_path_factory.mktemp("filtered"))
    out = tmp_path_factory.mktemp("reference") / "out"
    run_etl("preprocess", "--pipeline", CRITEO, "--input", filtered[0].parent, "--out", out)
    return out


@pytest.fixture(scope="module")
def threads(raw: Path, staged: Path, tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("threads") / "out"
    proc = run_etl("preprocess", "--pipeline", staged, "--input", raw, "--out", out, "--workers", "2")
    return out, proc.stdout


def kept_rows(raw: Path) -> tuple[int, int, int]:
    """Rows in all, rows the first stage keeps, rows both keep."""
    tables = [pq.read_table(p) for p in sorted(raw.glob("*.parquet"))]
    first = sum(int(pc.sum(pc.fill_null(pc.or_(pc.fill_null(pc.greater_equal(t["I1"], 300), False), pc.is_null(t["I2"])), False)).as_py())
                for t in tables)  # fmt: skip
    both = sum(int(pc.sum(pc.fill_null(reference_keep(t), False)).as_py() or 0) for t in tables)
    return sum(t.num_rows for t in tables), first, both


def test_the_output_is_the_transform_of_exactly_the_rows_the_filter_keeps(threads: tuple[Path, str], reference: Path, raw: Path) -> None:
    out, stdout = threads
    rows_in, first, both = kept_rows(raw)
    assert 0 < both < first < rows_in
    line = (f"rows: {rows_in:,} in = {both:,} out + 0 quarantined + {rows_in - both:,} removed by stages "
            f"(Filter: {rows_in:,} → {first:,}, Filter: {first:,} → {both:,})")  # fmt: skip
    assert line in stdout
    for i in range(4):
        name = f"part-{i:05d}.parquet"
        assert pq.read_table(out / name).equals(pq.read_table(reference / name)), name
    # the vocabularies were fitted on the kept rows only: the same tables as the reference's
    got, ref = tree_bytes(out / "artifacts"), tree_bytes(reference / "artifacts")
    assert {k: v for k, v in got.items() if k != "pipeline.json"} == {k: v for k, v in ref.items() if k != "pipeline.json"}
    assert json.loads(got["pipeline.json"])["ops"] == json.loads(ref["pipeline.json"])["ops"]


def test_the_manifest_records_each_stage_per_file_and_a_fully_filtered_shard_has_an_empty_file(threads: tuple[Path, str]) -> None:
    out, _ = threads
    m = read_manifest(out)
    for e in m.files:
        assert e.stages is not None and [s.stage for s in e.stages] == ["Filter", "Filter"]
        assert e.stages[0].rows_in == e.rows_in and e.stages[1].rows_out == e.rows_out + e.rows_quarantined
    last = m.files[3]
    assert (last.rows_in, last.rows_out, last.stages[1].rows_out) == (90, 0, 0)
    assert pq.read_metadata(out / last.output).num_rows == 0
    assert m.totals.rows_removed == m.totals.rows_in - m.totals.rows_out
    shown = run_etl("inspect", out).stdout
    assert f"stages: {m.totals.rows_removed:,} rows removed   Filter: {m.totals.rows_in:,} in, {m.totals.stages[0].rows_out:,} out" in shown


def test_a_dask_cluster_writes_the_threads_bytes(threads: tuple[Path, str], raw: Path, staged: Path, tmp_path: Path) -> None:
    out = tmp_path / "cluster"
    proc = run_etl("preprocess", "--pipeline", staged, "--input", raw, "--out", out, "--cluster", "local:2")
    assert proc.stdout.splitlines()[1] == threads[1].splitlines()[1]  # the rows line
    assert tree_bytes(out) == tree_bytes(threads[0])


def test_etl_fit_fits_on_the_rows_the_stages_keep(raw: Path, staged: Path, reference: Path, tmp_path: Path) -> None:
    run_etl("fit", "--pipeline", staged, "--input", raw, "--artifacts", tmp_path / "artifacts")
    got, ref = tree_bytes(tmp_path / "artifacts"), tree_bytes(reference / "artifacts")
    assert {k: v for k, v in got.items() if k != "pipeline.json"} == {k: v for k, v in ref.items() if k != "pipeline.json"}


def test_a_rerun_skips_complete_files_and_redoes_a_missing_one(threads: tuple[Path, str], raw: Path, staged: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    run_etl("preprocess", "--pipeline", staged, "--input", raw, "--out", out)
    before = tree_bytes(out)
    (out / "part-00001.parquet").unlink()
    proc = run_etl("preprocess", "--pipeline", staged, "--input", raw, "--out", out)
    assert "files: 4 (3 already complete, skipped)" in proc.stdout
    assert proc.stdout.splitlines()[1] == threads[1].splitlines()[1]  # the totals count the skipped files' stages
    assert tree_bytes(out) == before


def test_quarantine_keeps_exact_accounting_and_never_holds_a_row_a_stage_removed(raw: Path, staged: Path, tmp_path: Path) -> None:
    src = tmp_path / "raw"
    src.mkdir()
    t = pq.read_table(raw / "0.parquet")
    keep = pc.fill_null(reference_keep(t), False).to_pylist()
    kept_row, removed_row = keep.index(True), keep.index(False)
    c3 = t.column("C3").to_pylist()
    c3[kept_row] = c3[removed_row] = "zz123456"
    pq.write_table(t.set_column(t.column_names.index("C3"), "C3", pa.array(c3, pa.string())), src / "0.parquet", row_group_size=120)
    out = tmp_path / "out"
    proc = run_etl("preprocess", "--pipeline", staged, "--input", src, "--out", out, "--on-error", "quarantine")
    kept = sum(keep)
    assert f"rows: 400 in = {kept - 1:,} out + 1 quarantined + {400 - kept:,} removed by stages" in proc.stdout
    q = pq.read_table(out / "quarantine/part-00000.parquet")
    assert q.column("_row").to_pylist() == [kept_row] and q.column("C3").to_pylist() == ["zz123456"]
    e = read_manifest(out).files[0]
    assert (e.rows_in, e.rows_out, e.rows_quarantined, e.stages[-1].rows_out) == (400, kept - 1, 1, kept)


def test_follow_writes_what_preprocess_writes(raw: Path, tmp_path: Path) -> None:
    hashed = pipeline_with_stages(HASH, STAGES, tmp_path / "hash_staged.yaml")
    follow, once = tmp_path / "follow", tmp_path / "once"
    proc = run_etl("preprocess", "--follow", "--stop-after-idle", "0.3", "--pipeline", hashed, "--input", raw, "--out", follow)
    run_etl("preprocess", "--pipeline", hashed, "--input", raw, "--out", once)
    assert "removed by stages" in proc.stdout
    for i in range(4):
        name = f"part-{i:05d}.parquet"
        assert (follow / name).read_bytes() == (once / name).read_bytes()
    assert read_manifest(follow).totals == read_manifest(once).totals


def test_the_loader_refuses_stages_on_raw_shards_and_reads_their_processed_output(threads: tuple[Path, str], raw: Path, tmp_path: Path) -> None:
    hashed = pipeline_with_stages(HASH, STAGES, tmp_path / "hash_staged.yaml")
    with pytest.raises(ConfigError) as e:
        Loader(raw, pipeline=hashed, batch_size=64)
    assert "has reshaping stages (Filter, Filter)" in str(e.value) and "run `etl preprocess` first" in str(e.value)
    assert "\n" not in str(e.value)
    out, _ = threads
    rows = read_manifest(out).totals.rows_out
    loader = Loader(out, batch_size=64, num_workers=1)
    assert loader.total_rows == rows and len(loader) == -(-rows // 64)
    assert sum(b.label.shape[0] for b in loader) == rows
