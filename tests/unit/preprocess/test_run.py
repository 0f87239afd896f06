"""etl.preprocess.preprocess called as a function on small synthetic shards: the Summary, the manifest entries, the
resume rules and the quarantine accounting, in threads and on a Dask cluster."""

from __future__ import annotations

import shutil
import signal
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from etl.errors import ConfigError, InputError, RowError
from etl.io import parquet
from etl.io.files import is_temporary, sha256_file, temporary_path
from etl.io.processed import MANIFEST, read_manifest
from etl.pipeline import Pipeline
from etl.pipeline.stash import default_stash_budget
from etl.preprocess import Summary, preprocess
from etl.preprocess import run as preprocess_module
from tests.conftest import REPO, criteo_table, tree_bytes

CRITEO = REPO / "pipelines/criteo.yaml"
SIZES = [250, 0, 130]


def write(table: pa.Table, path: Path, row_group_size: int = 100) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


@pytest.fixture
def shards(tmp_path: Path) -> list[Path]:
    return [write(criteo_table(n, seed=i), tmp_path / "raw" / f"{i}.parquet") for i, n in enumerate(SIZES)]


@pytest.fixture
def client(local_cluster):
    return local_cluster


def run(shards: list[Path], out: Path, **options) -> Summary:
    return preprocess(Pipeline.from_file(CRITEO), shards, out, **options)


def with_bad_c3(table: pa.Table, rows: list[int]) -> pa.Table:
    c3 = table.column("C3").to_pylist()
    for r in rows:
        c3[r] = "not-hex!"
    return table.set_column(table.column_names.index("C3"), "C3", pa.array(c3, pa.string()))


def test_summary_and_manifest(shards: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    s = run(shards, out, workers=2)
    total = sum(SIZES)
    assert (s.files, s.files_skipped) == (3, 0)
    assert (s.rows_in, s.rows_out, s.rows_quarantined, s.rows_processed) == (total, total, 0, total)
    assert s.fit_seconds > 0 and s.transform_seconds > 0

    m = read_manifest(out)
    assert m.pipeline == "criteo" and m.complete
    assert (m.totals.rows_in, m.totals.rows_out, m.totals.rows_quarantined) == (total, total, 0)
    artifacts_sha = sha256_file(out / "artifacts" / "pipeline.json")
    assert [e.output for e in m.files] == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    for e, src, n in zip(m.files, shards, SIZES):
        assert e.source == str(src.resolve()) and e.source_bytes == src.stat().st_size
        assert (e.rows_in, e.rows_out, e.rows_quarantined, e.quarantine) == (n, n, 0, None)
        assert e.sha256 == sha256_file(out / e.output)
        assert e.artifacts_sha256 == artifacts_sha
        f = pq.ParquetFile(out / e.output)
        assert f.metadata.num_rows == n
        assert f.num_row_groups == pq.ParquetFile(src).num_row_groups  # one row group per input row group
    assert sorted(p.name for p in out.iterdir()) == ["artifacts", MANIFEST] + [e.output for e in m.files]


def test_progress_reports_fit_then_transform_each_row_once(shards: list[Path], tmp_path: Path) -> None:
    seen: list[tuple[str, int]] = []
    run(shards, tmp_path / "out", workers=2, progress=lambda name, n: seen.append((name, n)))
    names = [name for name, _ in seen]
    assert names == sorted(names, key=["fit", "transform"].index)  # every fit report comes before the transform's
    assert {name: sum(n for m, n in seen if m == name) for name in names} == {"fit": sum(SIZES), "transform": sum(SIZES)}


def test_summary_without_a_fit_has_no_fit_time_and_resume_counts_skipped_rows(shards: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert run(shards, out).fit_seconds is not None
    (out / "part-00002.parquet").unlink()
    seen: list[tuple[str, int]] = []
    s = run(shards, out, artifacts=out / "artifacts", progress=lambda name, n: seen.append((name, n)))
    assert s.fit_seconds is None and s.files_skipped == 2
    assert seen[0] == ("transform", SIZES[0] + SIZES[1])  # the shards done before, at once
    assert {name for name, _ in seen} == {"transform"} and sum(n for _, n in seen) == sum(SIZES)


def test_rerun_skips_complete_shards_and_redoes_a_missing_output(shards: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    run(shards, out)
    first = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}

    again = run(shards, out)
    assert (again.files, again.files_skipped, again.rows_processed) == (3, 3, 0)
    assert (again.rows_in, again.rows_out) == (sum(SIZES), sum(SIZES))  # totals include the skipped shards
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == first

    (out / "part-00002.parquet").unlink()
    third = run(shards, out, workers=2)
    assert (third.files_skipped, third.rows_processed, third.rows_in) == (2, SIZES[2], sum(SIZES))
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == first


def test_a_changed_source_or_an_unusable_manifest_is_redone(shards: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    run(shards, out)
    artifacts = shutil.copytree(out / "artifacts", tmp_path / "artifacts")
    write(criteo_table(SIZES[0] + 1, seed=0), shards[0])
    changed = run(shards, out, artifacts=artifacts)
    assert (changed.files_skipped, changed.rows_processed) == (2, SIZES[0] + 1)
    manifest = (out / MANIFEST).read_bytes()

    for text in ('{"format": "etl-manifest", "version": 99}', "{not json", '{"format": "etl-manifest", "version": 1}'):
        (out / MANIFEST).write_text(text)
        again = run(shards, out, artifacts=artifacts)
        assert (again.files_skipped, again.rows_processed) == (0, sum(SIZES) + 1), text
        assert (out / MANIFEST).read_bytes() == manifest


def test_other_artifacts_redo_every_shard(shards: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    run(shards, out)
    refit = run(shards[:1], tmp_path / "refit")  # fitted on other rows: other vocabularies
    assert refit.files == 1
    again = run(shards, out, artifacts=tmp_path / "refit" / "artifacts")
    assert again.files_skipped == 0
    assert read_manifest(out).files[0].artifacts_sha256 == sha256_file(tmp_path / "refit" / "artifacts" / "pipeline.json")


def test_quarantine_accounting(tmp_path: Path) -> None:
    good = criteo_table(200, seed=1)
    t = criteo_table(300, seed=2)
    c3 = t.column("C3").to_pylist()
    bad_rows = [4, 150, 299]
    for r in bad_rows:
        c3[r] = "not-hex!"
    t = t.set_column(t.column_names.index("C3"), "C3", pa.array(c3, pa.string()))
    shards = [write(good, tmp_path / "raw" / "a.parquet"), write(t, tmp_path / "raw" / "b.parquet")]
    out = tmp_path / "out"
    s = run(shards, out, on_error="quarantine")
    assert (s.rows_in, s.rows_out, s.rows_quarantined) == (500, 497, 3)
    assert s.rows_in == s.rows_out + s.rows_quarantined

    clean, dirty = read_manifest(out).files
    assert (clean.rows_in, clean.rows_out, clean.rows_quarantined, clean.quarantine) == (200, 200, 0, None)
    assert (dirty.rows_in, dirty.rows_out, dirty.rows_quarantined) == (300, 297, 3)
    assert dirty.quarantine == "quarantine/part-00001.parquet"
    assert sorted(p.name for p in (out / "quarantine").iterdir()) == ["part-00001.parquet"]
    q = pq.read_table(out / dirty.quarantine)
    assert q.column("_row").to_pylist() == bad_rows
    assert q.column("_column").to_pylist() == ["C3"] * 3
    assert q.column("C3").to_pylist() == ["not-hex!"] * 3
    assert pq.read_table(out / dirty.output).num_rows == 297


def test_invalid_value_raises_by_default(tmp_path: Path) -> None:
    t = criteo_table(50)
    c3 = t.column("C3").to_pylist()
    c3[7] = "not-hex!"
    t = t.set_column(t.column_names.index("C3"), "C3", pa.array(c3, pa.string()))
    with pytest.raises(RowError, match="row 7, column 'C3'"):
        run([write(t, tmp_path / "raw" / "a.parquet")], tmp_path / "out")


@pytest.mark.parametrize("option", [{"on_error": "skip"}, {"compression": "gzip"}])
def test_bad_option_is_an_error_before_anything_is_written(shards: list[Path], tmp_path: Path, option: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(option))):
        run(shards, tmp_path / "out", **option)
    assert not (tmp_path / "out").exists()


def test_compression_keeps_the_values(shards: list[Path], tmp_path: Path) -> None:
    codecs = {"none": "UNCOMPRESSED", "zstd": "ZSTD", "snappy": "SNAPPY"}
    for compression in codecs:
        run(shards, tmp_path / compression, compression=compression)
    for compression, codec in codecs.items():
        part = tmp_path / compression / "part-00000.parquet"
        assert pq.ParquetFile(part).metadata.row_group(0).column(0).compression == codec
        assert pq.read_table(part).equals(pq.read_table(tmp_path / "none" / "part-00000.parquet"))


def test_missing_input_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError):
        run([tmp_path / "missing.parquet"], tmp_path / "out")


def test_a_cluster_writes_the_bytes_of_threads(tmp_path: Path, client) -> None:
    shards = [
        write(criteo_table(250, seed=1), tmp_path / "raw" / "a.parquet"),
        write(with_bad_c3(criteo_table(300, seed=2), [4, 150, 299]), tmp_path / "raw" / "b.parquet"),
        write(criteo_table(130, seed=3), tmp_path / "raw" / "c.parquet"),
    ]
    threads = run(shards, tmp_path / "threads", workers=2, on_error="quarantine")
    seen: list[tuple[str, int]] = []
    dask = run(shards, tmp_path / "dask", on_error="quarantine", client=client, progress=lambda name, n: seen.append((name, n)))
    assert tree_bytes(tmp_path / "dask") == tree_bytes(tmp_path / "threads")
    assert "quarantine/part-00001.parquet" in tree_bytes(tmp_path / "dask")
    assert (dask.rows_in, dask.rows_out, dask.rows_quarantined) == (threads.rows_in, threads.rows_out, threads.rows_quarantined) == (680, 677, 3)
    assert sum(n for name, n in seen if name == "fit") == 680  # the fit ran here, with its progress
    assert sum(n for name, n in seen if name == "transform") == 680  # rows of the workers, each once


def test_a_cluster_resumes_what_the_manifest_proves_complete(shards: list[Path], tmp_path: Path, client) -> None:
    out = tmp_path / "out"
    run(shards, out, workers=2)
    first = tree_bytes(out)
    (out / "part-00002.parquet").unlink()
    again = run(shards, out, artifacts=out / "artifacts", client=client)
    assert (again.files_skipped, again.rows_processed) == (2, SIZES[2])
    assert tree_bytes(out) == first


def test_a_row_error_on_a_worker_is_raised_here_and_nothing_is_left(tmp_path: Path, client) -> None:
    good = write(criteo_table(200, seed=1), tmp_path / "raw" / "a.parquet")
    bad = write(with_bad_c3(criteo_table(50), [7]), tmp_path / "raw" / "b.parquet")
    run([good], tmp_path / "fitted")  # artifacts, so that the bad value is met by a worker, not by the fit
    with pytest.raises(RowError, match=r"b.parquet, row group 0, row 7, column 'C3'"):
        run([good, bad], tmp_path / "out", artifacts=tmp_path / "fitted" / "artifacts", client=client)
    names = [p.name for p in (tmp_path / "out").rglob("*")]
    assert not [n for n in names if is_temporary(n)] and "part-00001.parquet" not in names
    assert [e.output for e in read_manifest(tmp_path / "out").files] in ([], ["part-00000.parquet"])


def test_temporaries_a_killed_save_left_in_the_artifacts_are_removed(shards: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    run(shards, out)
    first = tree_bytes(out)
    table_dir = next(p for p in (out / "artifacts").iterdir() if p.is_dir())
    for d in (out / "artifacts", table_dir):
        (d / ".C2.parquet.123-abcd1234.tmp").write_bytes(b"partial")
    run(shards, out, artifacts=out / "artifacts")
    assert tree_bytes(out) == first


def test_shards_are_transformed_while_the_artifacts_are_saved_and_committed_after(
    shards: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    transforming = threading.Event()
    seen: dict[str, bool] = {}
    save, process_shard, commit_shard = Pipeline.save, preprocess_module.process_shard, preprocess_module.commit_shard

    def slow_save(self: Pipeline, directory: Path) -> None:
        seen["transformed while saving"] = transforming.wait(timeout=60)
        save(self, directory)

    def transform(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        transforming.set()
        return process_shard(*args, **kwargs)

    def commit(directory: Path, written):  # noqa: ANN001, ANN202
        seen.setdefault("artifacts saved at every commit", True)
        seen["artifacts saved at every commit"] &= (out / "artifacts" / "pipeline.json").exists()
        return commit_shard(directory, written)

    monkeypatch.setattr(Pipeline, "save", slow_save)
    monkeypatch.setattr(preprocess_module, "process_shard", transform)
    monkeypatch.setattr(preprocess_module, "commit_shard", commit)
    run(shards, out, workers=2)
    assert seen == {"transformed while saving": True, "artifacts saved at every commit": True}
    assert read_manifest(out).complete
    monkeypatch.undo()
    assert tree_bytes(out) == two_pass(CRITEO, shards, tmp_path / "two")


def test_a_failed_save_of_the_artifacts_is_raised_and_commits_no_shard(shards: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"

    def failing_save(self: Pipeline, directory: Path) -> None:
        raise OSError(28, "No space left on device", str(directory))

    monkeypatch.setattr(Pipeline, "save", failing_save)
    with pytest.raises(OSError, match="No space left"):
        run(shards, out, workers=2)
    assert read_manifest(out).files == []
    assert sorted(p.name for p in out.iterdir() if p.suffix == ".parquet" or is_temporary(p.name)) == []


# ---------------------------------------------------------------- single pass

BUDGETS = [None, 1]  # the default (every row group in memory) and 1 byte (every row group on disk)
TWO_STAGES = [  # the second Normalize fits on what the first writes: two fitting stages
    {"op": "FillMissing", "columns": "@dense", "value": 0},
    {"op": "Normalize", "columns": "@dense"},
    {"op": "Normalize", "columns": "@dense"},
    {"op": "Decode", "columns": "@categorical"},
    {"op": "Categorify", "columns": "@categorical", "freq_threshold": 2},
]
MIXED = [  # C1..C13 fitted, C14..C26 decoded and hashed after the fit: a bad key there shows at the transform only
    {"op": "FillMissing", "columns": "@dense", "value": 0},
    {"op": "Decode", "columns": [f"C{i}" for i in range(1, 14)]},
    {"op": "Categorify", "columns": [f"C{i}" for i in range(1, 14)], "freq_threshold": 2},
    {"op": "Decode", "columns": [f"C{i}" for i in range(14, 27)]},
    {"op": "Hash", "columns": [f"C{i}" for i in range(14, 27)], "num_buckets": 1000},
]


def pipeline_file(tmp_path: Path, ops: list[dict]) -> Path:
    p = tmp_path / "pipe.yaml"
    p.write_text(yaml.safe_dump({"name": "t", "schema": str(REPO / "schemas/criteo.yaml"), "ops": ops}))
    return p


def two_pass(pipeline: Path, shards: list[Path], out: Path, **options) -> dict[str, bytes]:
    """The output of a fit from the shards (``Pipeline.fit``), then a transform that reads them again."""
    p = Pipeline.from_file(pipeline)
    p.fit(shards, on_error=options.get("on_error", "raise"))
    p.save(out.parent / f"{out.name}-artifacts")
    preprocess(Pipeline.from_file(pipeline), shards, out, artifacts=out.parent / f"{out.name}-artifacts", **options)
    return tree_bytes(out)


def with_values(table: pa.Table, values: dict[tuple[int, str], object]) -> pa.Table:
    """``table`` with the values at (row, column) replaced."""
    cols = {name: table.column(name).to_pylist() for name in table.column_names}
    for (row, c), v in values.items():
        cols[c][row] = v
    return pa.table({name: pa.array(v, table.schema.field(name).type) for name, v in cols.items()})


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("ops", ["criteo", "criteo_hash", "two stages", "mixed"])
def test_single_pass_writes_the_bytes_of_two_passes(shards: list[Path], tmp_path: Path, ops: str, budget: int | None) -> None:
    if ops in ("criteo", "criteo_hash"):
        pipeline = REPO / f"pipelines/{ops}.yaml"
    else:
        pipeline = pipeline_file(tmp_path, TWO_STAGES if ops == "two stages" else MIXED)
    s = preprocess(Pipeline.from_file(pipeline), shards, tmp_path / "one", workers=2, memory_budget=budget)
    assert tree_bytes(tmp_path / "one") == two_pass(pipeline, shards, tmp_path / "two")
    assert (s.stash_peak_bytes == 0) == (budget == 1 or ops == "criteo_hash")
    assert (s.stash_spilled_bytes > 0) == (budget == 1 and ops != "criteo_hash")
    assert s.memory_budget == (default_stash_budget() if budget is None else budget)


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("ops", ["criteo", "two stages", "mixed"])
def test_single_pass_quarantines_the_rows_of_two_passes(tmp_path: Path, ops: str, budget: int | None) -> None:
    """Rows bad in several columns, one in two (the first in pipeline order is named), a missing label, keys
    rejected by the fit's Decode and (mixed) by one that runs after the fit only."""
    bad = {(4, "C3"): "not-hex!", (60, "C20"): "zz", (61, "C20"): "zz", (61, "C3"): "zz", (150, "label"): None, (151, "C26"): "",
           (299, "C1"): "68fd1e6g"}  # fmt: skip
    table = with_values(criteo_table(300, seed=2), bad)
    shards = [write(criteo_table(200, seed=1), tmp_path / "raw" / "a.parquet"), write(table, tmp_path / "raw" / "b.parquet")]
    pipeline = REPO / "pipelines/criteo.yaml" if ops == "criteo" else pipeline_file(tmp_path, TWO_STAGES if ops == "two stages" else MIXED)
    s = preprocess(Pipeline.from_file(pipeline), shards, tmp_path / "one", on_error="quarantine", memory_budget=budget)
    assert s.rows_quarantined == 6
    assert tree_bytes(tmp_path / "one") == two_pass(pipeline, shards, tmp_path / "two", on_error="quarantine")
    q = pq.read_table(tmp_path / "one" / "quarantine" / "part-00001.parquet")
    assert q.column("_row").to_pylist() == [4, 60, 61, 150, 151, 299]


def test_single_pass_raises_the_row_error_of_the_transform(tmp_path: Path) -> None:
    table = with_values(criteo_table(300, seed=2), {(170, "C20"): "zz"})
    shards = [write(table, tmp_path / "raw" / "a.parquet")]
    with pytest.raises(RowError, match="row 170, column 'C20'") as e:
        preprocess(Pipeline.from_file(pipeline_file(tmp_path, MIXED)), shards, tmp_path / "out", memory_budget=1)
    assert e.value.path == str(shards[0])
    assert [p.name for p in (tmp_path / "out").iterdir() if is_temporary(p.name)] == []  # the stash is gone


@pytest.mark.parametrize("ops", ["criteo", "two stages"])
def test_single_pass_reads_each_column_of_each_row_group_once(shards: list[Path], tmp_path: Path, ops: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Criteo: the fit reads the label and the keys, the transform the dense columns (not stashed)."""
    reads: list[tuple[str, int, str]] = []
    read_rows = parquet.read_rows

    def counted(path, columns, first_row, num_rows, row_group, metadata=None):
        reads.extend((str(path), row_group, c) for c in columns)
        return read_rows(path, columns, first_row, num_rows, row_group, metadata)

    monkeypatch.setattr(parquet, "read_rows", counted)
    pipeline = Pipeline.from_file(REPO / "pipelines/criteo.yaml" if ops == "criteo" else pipeline_file(tmp_path, TWO_STAGES))
    preprocess(pipeline, shards, tmp_path / "out", workers=2, memory_budget=1)
    groups = [(str(p), i, c) for p in shards for i in range(pq.ParquetFile(p).num_row_groups) for c in pipeline.schema.names]
    assert sorted(reads) == sorted(groups)


def test_the_stash_is_removed_after_a_keyboard_interrupt(shards: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    seen: list[list[str]] = []

    def progress(name: str, n: int) -> None:
        if name == "transform":
            seen.append([p.name for p in out.iterdir() if is_temporary(p.name) and p.is_dir()])
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(shards, out, workers=2, progress=progress, memory_budget=1)
    assert len(seen[0]) == 1  # the stash was there while the shards were transformed
    assert [p.name for p in out.iterdir() if is_temporary(p.name)] == []
    again = run(shards, out, workers=2)
    assert again.files_skipped == 0 and tree_bytes(out) == two_pass(CRITEO, shards, tmp_path / "two")


def test_a_stash_a_killed_run_left_is_removed_by_the_next_run(shards: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    left = temporary_path(out / "stash")
    left.mkdir(parents=True)
    (left / "0-0.arrow").write_bytes(b"left by a run killed while it fitted")
    run(shards, out, memory_budget=1)
    assert not left.exists() and [p.name for p in out.iterdir() if is_temporary(p.name)] == []


def test_ctrl_c_during_the_transform_stops_the_threads_and_removes_the_stash(shards: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    sent = []

    def progress(name: str, n: int) -> None:
        if name == "transform" and not sent:
            sent.append([p.name for p in out.iterdir() if is_temporary(p.name) and p.is_dir()])
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    before = threading.active_count()
    with pytest.raises(KeyboardInterrupt):
        run(shards, out, workers=2, progress=progress, memory_budget=1)
    assert len(sent[0]) == 1  # the stash was there
    assert threading.active_count() == before
    assert [p.name for p in out.iterdir() if is_temporary(p.name)] == []


def test_a_pipeline_with_an_online_vocabulary_is_refused_before_anything_is_written(shards: list[Path], tmp_path: Path) -> None:
    doc = yaml.safe_load(CRITEO.read_text())
    doc["ops"][-1] |= {"online": True, "capacity": 100}
    pipeline = Pipeline(doc, Pipeline.from_file(CRITEO).schema)
    with pytest.raises(ConfigError, match="online vocabulary"):
        preprocess(pipeline, shards, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_npy_chunks_beside_the_same_parquet_bytes_with_quarantined_rows(tmp_path: Path, client) -> None:
    raw = [write(with_bad_c3(criteo_table(n, seed=i), [3, 7]) if n else criteo_table(n, seed=i), tmp_path / "raw" / f"{i}.parquet")
           for i, n in enumerate(SIZES)]  # fmt: skip
    run(raw, tmp_path / "pq", on_error="quarantine")
    both = run(raw, tmp_path / "both", on_error="quarantine", formats=("parquet", "npy"), npy_chunk_rows=64)
    dask = run(raw, tmp_path / "dask", on_error="quarantine", formats=("parquet", "npy"), npy_chunk_rows=64, client=client)
    assert both.rows_quarantined == 4 and dask.rows_quarantined == 4
    manifest = read_manifest(tmp_path / "both")
    assert manifest.formats == ("parquet", "npy") and manifest.npy is not None and manifest.npy.chunk_rows == 64
    for e in manifest.files:
        assert (tmp_path / "both" / e.output).read_bytes() == (tmp_path / "pq" / e.output).read_bytes()
        assert sum(c.rows for c in e.npy_chunks or ()) == e.rows_out
    assert tree_bytes(tmp_path / "both" / "npy") == tree_bytes(tmp_path / "dask" / "npy")


def test_npy_refuses_a_pipeline_with_list_columns(tmp_path: Path) -> None:
    from etl.io.npy import ListColumnsError
    from etl.schema import load_schema
    from etl.tools.synth import generate

    raw = generate(load_schema(REPO / "schemas/movielens.yaml"), 300, 1, tmp_path / "raw", seed=0)
    with pytest.raises(ListColumnsError, match="genres"):
        preprocess(Pipeline.from_file(REPO / "pipelines/movielens.yaml"), raw, tmp_path / "out", formats=("npy",))
    assert not (tmp_path / "out" / "npy").exists()


def test_a_rerun_in_other_formats_redoes_every_shard_and_removes_what_it_no_longer_writes(shards: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    run(shards, out, formats=("parquet",))
    parquet = {p.name: p.read_bytes() for p in out.glob("*.parquet")}
    both = run(shards, out, formats=("parquet", "npy"), npy_chunk_rows=100)
    assert both.files_skipped == 0 and {p.name: p.read_bytes() for p in out.glob("*.parquet")} == parquet
    assert run(shards, out, formats=("parquet", "npy"), npy_chunk_rows=100).files_skipped == len(SIZES)
    npy = run(shards, out, formats=("npy",), npy_chunk_rows=100)
    assert npy.files_skipped == 0 and list(out.glob("*.parquet")) == []
    assert sorted(p.name for p in (out / "npy/part-00000").iterdir()) == [f"{f}-{i:05d}.npy" for f in ("dense", "label", "sparse") for i in (0, 1, 2)]
