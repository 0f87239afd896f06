"""etl.bench.sequences and the sequence scripts of etl.bench.polars_baselines / duckdb_baselines: the scripts'
outputs hold our History and Groupby lists on generated events (ties, late events), the comparisons catch a
difference, the loader docs, and a small run of the whole bench."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import polars as pl
import pytest

from etl.bench import duckdb_baselines, polars_baselines, sequences
from etl.io.parquet import list_shards
from etl.pipeline import Pipeline
from etl.preprocess import preprocess
from etl.schema import load_schema
from etl.tools.synth import generate

REPO = Path(__file__).resolve().parents[3]
SEQUENCE, SESSIONS = REPO / "pipelines/events_sequence.yaml", REPO / "pipelines/events_sessions.yaml"
needs_duckdb = pytest.mark.skipif(importlib.util.find_spec("duckdb") is None, reason="duckdb is not installed")


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """3,000 generated events in 3 shards and our outputs of both sequence pipelines on them."""
    d = tmp_path_factory.mktemp("bench_sequences")
    generate(load_schema(REPO / "schemas/events.yaml"), 3_000, 3, d / "raw", seed=1)
    for path, name in ((SEQUENCE, "history"), (SESSIONS, "sessions")):
        preprocess(Pipeline.from_file(path), list_shards(d / "raw"), d / f"ours-{name}", workers=2)
    return d


def _rewrite(src: Path, dst: Path, change) -> Path:
    dst.mkdir()
    pl.read_parquet(src / "part-00000.parquet").pipe(change).write_parquet(dst / "part-00000.parquet")
    return dst


def test_the_generated_events_have_ties_and_late_rows(work: Path) -> None:
    df = pl.read_parquet(list_shards(work / "raw"))
    assert df.select(pl.struct("user_id", "timestamp").is_duplicated().any()).item()  # events of one user at one time
    late = df.with_row_index().sort("user_id", "index").select((pl.col("timestamp").diff().over("user_id") < 0).any()).item()
    assert late  # a user's row older than its previous one


def test_polars_history_holds_our_lists(work: Path, tmp_path: Path) -> None:
    polars_baselines.polars_history(list_shards(work / "raw"), tmp_path / "out")
    assert sequences.same_history(work / "ours-history", tmp_path / "out") is None
    lens = pl.read_parquet(tmp_path / "out/part-00000.parquet")["hist_len"]
    assert lens.min() == 0 and lens.max() == polars_baselines.MAX_LEN


def test_polars_sessions_hold_our_lists(work: Path, tmp_path: Path) -> None:
    polars_baselines.polars_sessions(list_shards(work / "raw"), tmp_path / "out")
    assert sequences.same_sessions(work / "ours-sessions", tmp_path / "out") is None


@needs_duckdb
def test_duckdb_scripts_hold_our_lists(work: Path, tmp_path: Path) -> None:
    duckdb_baselines.duckdb_history(list_shards(work / "raw"), tmp_path / "h")
    assert sequences.same_history(work / "ours-history", tmp_path / "h") is None
    duckdb_baselines.duckdb_sessions(list_shards(work / "raw"), tmp_path / "s")
    assert sequences.same_sessions(work / "ours-sessions", tmp_path / "s") is None


def test_a_window_over_preceding_rows_is_told_apart(work: Path, tmp_path: Path) -> None:
    # the naive history (the user's preceding rows, events of the same time included) differs from ours
    def naive(df: pl.DataFrame) -> pl.DataFrame:
        return df.with_columns(
            pl.concat_list(pl.col("hist_item_id").list.tail(50), pl.col("item_id")).shift(1).over("user_id")
            .fill_null([]).list.tail(50).alias("hist_item_id")
        )  # fmt: skip

    polars_baselines.polars_history(list_shards(work / "raw"), tmp_path / "out")
    theirs = _rewrite(tmp_path / "out", tmp_path / "naive", naive)
    assert "hist_item_id" in (sequences.same_history(work / "ours-history", theirs) or "")


def test_history_comparison_catches_a_changed_list_length_and_categories(work: Path, tmp_path: Path) -> None:
    polars_baselines.polars_history(list_shards(work / "raw"), tmp_path / "out")
    first_long = pl.int_range(pl.len()) == (pl.col("hist_len") > 0).arg_max()
    changed = pl.concat_list(pl.col("hist_item_id").list.head(pl.col("hist_len") - 1), pl.lit(0, pl.Int32))  # its last id made 0
    item = _rewrite(tmp_path / "out", tmp_path / "item", lambda df: df.with_columns(
        pl.when(first_long).then(changed).otherwise(pl.col("hist_item_id")).alias("hist_item_id")))  # fmt: skip
    assert "hist_item_id" in (sequences.same_history(work / "ours-history", item) or "")
    length = _rewrite(tmp_path / "out", tmp_path / "len", lambda df: df.with_columns(
        pl.when(first_long).then(0).otherwise(pl.col("hist_len")).alias("hist_len")))  # fmt: skip
    assert "hist_len" in (sequences.same_history(work / "ours-history", length) or "")
    short = _rewrite(tmp_path / "out", tmp_path / "short", lambda df: df.head(df.height - 1))
    assert "rows in ours" in (sequences.same_history(work / "ours-history", short) or "")
    # categories renumbered one to one are the same; two merged into one are not
    renumbered = _rewrite(tmp_path / "out", tmp_path / "renum", lambda df: df.with_columns(
        pl.col("category") + 1000, pl.col("hist_category").list.eval(pl.element() + 1000)))  # fmt: skip
    assert sequences.same_history(work / "ours-history", renumbered) is None
    merged = _rewrite(tmp_path / "out", tmp_path / "merged", lambda df: df.with_columns(
        pl.col("category").clip(upper_bound=4), pl.col("hist_category").list.eval(pl.element().clip(upper_bound=4))))  # fmt: skip
    assert sequences.same_history(work / "ours-history", merged) == "category ids do not map one to one onto ours"


def test_sessions_comparison_catches_a_changed_count(work: Path, tmp_path: Path) -> None:
    polars_baselines.polars_sessions(list_shards(work / "raw"), tmp_path / "out")
    theirs = _rewrite(tmp_path / "out", tmp_path / "count", lambda df: df.with_columns(
        pl.when(pl.int_range(pl.len()) == 0).then(0.0).otherwise(pl.col("item_id_count")).alias("item_id_count")))  # fmt: skip
    assert "item_id_count" in (sequences.same_sessions(work / "ours-sessions", theirs) or "")


def test_streaming_docs_differ_by_history_only() -> None:
    with_history, without = sequences.streaming_docs(Pipeline.from_file(SEQUENCE), 3600)
    assert [op["op"] for op in with_history["ops"] if op["op"] == "History"] == ["History"]
    assert next(op for op in with_history["ops"] if op["op"] == "History")["allowed_lateness"] == 3600
    assert [op for op in with_history["ops"] if op["op"] != "History"] == without["ops"]
    assert Path(without["schema"]).is_absolute() and without["name"] != with_history["name"]


def test_a_small_run_measures_every_figure(work: Path) -> None:
    report = sequences.run_sequences_bench(input_dir=work / "raw", workers=2, batch_size=512, repeat=1)
    history, sessions = report.pipelines
    assert report.rows == 3_000
    names = ["floor", "fit", "preprocess", "fit+preprocess", "preprocess:process"]
    assert [s.name for s in history.stages] == [*names, "loader:no-history", "loader:history"]
    assert [s.name for s in sessions.stages] == names
    assert all(s.seconds > 0 for rep in report.pipelines for s in rep.stages)
    want = {"polars", "duckdb"} if duckdb_baselines.HAS_DUCKDB else {"polars"}
    for rep in report.pipelines:
        assert set(rep.baselines) == want and all(b["output_equal"] for b in rep.baselines.values())


def test_process_seconds_reports_a_failing_command(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="exit status 1"):
        sequences.process_seconds([shutil.which("false") or "false"], tmp_path / "out", 1)
