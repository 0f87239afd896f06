"""etl.tools.events: the synthetic event stream of a schema with ``generate.events`` (schemas/events.yaml)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from etl.errors import SpecError
from etl.io.text import raw_arrow_schema
from etl.schema import Schema, load_schema, parse_schema
from etl.tools.events import _Stream
from etl.tools.synth import generate

ROOT = Path(__file__).resolve().parents[3]
EVENTS_YAML = ROOT / "schemas" / "events.yaml"


def events_schema(**events: Any) -> Schema:
    """schemas/events.yaml with ``generate.events`` fields replaced."""
    doc = yaml.safe_load(EVENTS_YAML.read_text())
    doc["generate"]["events"].update(events)
    return parse_schema(doc, "<test>")


def table(schema: Schema, rows: int, out: Path, files: int = 1, seed: int = 0) -> pl.DataFrame:
    """The generated rows, in file order, with their position ``pos``."""
    paths = generate(schema, rows, files, out, seed=seed)
    return pl.from_arrow(pa.concat_tables([pq.read_table(p) for p in paths])).with_row_index("pos")


def in_session_gaps(df: pl.DataFrame) -> np.ndarray:
    """Time from each event to the next of its session (sessions in time order, ties by position)."""
    s = df.sort(["session_id", "timestamp", "pos"]).with_columns(pl.col("timestamp").diff().over("session_id").alias("gap"))
    return s["gap"].drop_nulls().to_numpy()


def test_shapes_types_and_file_cuts(tmp_path: Path) -> None:
    schema = load_schema(EVENTS_YAML)
    paths = generate(schema, 20_000, 3, tmp_path / "three", seed=4)
    assert [p.name for p in paths] == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    assert [pq.ParquetFile(p).metadata.num_rows for p in paths] == [6_667, 6_667, 6_666]
    assert all(pq.read_schema(p).equals(raw_arrow_schema(schema)) for p in paths)
    three = pa.concat_tables([pq.read_table(p) for p in paths])
    one = pq.read_table(generate(schema, 20_000, 1, tmp_path / "one", seed=4)[0])
    assert three.equals(one)  # the rows do not depend on how the stream is cut into files
    assert three.column("timestamp").null_count == three.column("user_id").null_count == three.column("item_id").null_count == 0
    # the other columns as etl.tools.synth makes them: a 0/1 label, a heavy-tailed price
    assert set(three.column("click").to_pylist()) == {0, 1}


def test_same_arguments_same_bytes(tmp_path: Path) -> None:
    schema = load_schema(EVENTS_YAML)
    a = [p.read_bytes() for p in generate(schema, 30_000, 2, tmp_path / "a", seed=7)]
    b = [p.read_bytes() for p in generate(schema, 30_000, 2, tmp_path / "b", seed=7)]
    c = [p.read_bytes() for p in generate(schema, 30_000, 2, tmp_path / "c", seed=8)]
    assert a == b
    assert all(x != y for x, y in zip(a, c))


@pytest.mark.parametrize("skew", [0.6, 1.1])
def test_items_follow_a_zipf_law(tmp_path: Path, skew: float) -> None:
    df = table(events_schema(item_skew=skew, follow=0.0, items=20_000), 200_000, tmp_path)
    counts = np.sort(df.group_by("item_id").len()["len"].to_numpy())[::-1][:100]
    rank = np.arange(1, 101)
    slope = np.polyfit(np.log(rank + 0.5), np.log(counts), 1)[0]  # frequency of rank r ∝ (r + 0.5)^-skew
    assert abs(slope + skew) < 0.1, slope


def test_sessions_and_gaps(tmp_path: Path) -> None:
    df = table(events_schema(ties=0.0, session_events=4, event_gap={"median": 120, "sigma": 0.5}), 100_000, tmp_path)
    assert df.group_by("session_id").agg(pl.col("user_id").n_unique())["user_id"].max() == 1
    assert df.group_by("user_id").agg((pl.col("session_id") // 2**32).n_unique())["session_id"].max() == 1
    assert 3.8 < df.group_by("session_id").len()["len"].mean() < 4.2  # geometric lengths, mean session_events
    gaps = in_session_gaps(df)
    assert gaps.min() >= 1
    assert 110 <= np.median(gaps) <= 130 and 0.45 < np.log(gaps).std() < 0.55  # log-normal, median 120, sigma 0.5
    users = df.group_by("user_id").len()["len"].to_numpy()
    assert users.max() > 10 * np.median(users)  # some users far more active than most


def test_ties_are_events_at_the_same_time(tmp_path: Path) -> None:
    none = table(events_schema(ties=0.0), 50_000, tmp_path / "none")
    assert none.select("user_id", "timestamp").is_unique().all()
    some = table(events_schema(ties=0.2), 100_000, tmp_path / "some")
    assert 0.17 < np.mean(in_session_gaps(some) == 0) < 0.23
    assert not some.select("user_id", "timestamp").is_unique().all()


def test_late_events_are_written_out_of_time_order(tmp_path: Path) -> None:
    on_time = table(events_schema(late=0.0), 50_000, tmp_path / "on_time")
    assert (on_time["timestamp"].diff().drop_nulls() >= 0).all()  # the log is in time order
    df = table(events_schema(late=0.05, lateness=600), 100_000, tmp_path / "late")
    ts = df["timestamp"].to_numpy()
    behind = np.maximum.accumulate(ts)[:-1] - ts[1:]
    assert 0.025 < np.mean(behind > 0) <= 0.05  # late rows (unless nothing was written in their delay)
    assert behind.max() <= 600  # never more than lateness below an earlier row
    per_user = df.with_columns(pl.col("timestamp").cum_max().shift(1).over("user_id").alias("before"))
    assert per_user.filter(pl.col("timestamp") < pl.col("before")).height > 100  # older than the user's previous rows


def test_category_is_a_function_of_the_item(tmp_path: Path) -> None:
    df = table(events_schema(categories=7), 20_000, tmp_path)
    assert df.group_by("item_id").agg(pl.col("category").n_unique())["category"].max() == 1
    assert df["category"].n_unique() == 7


def test_follow_makes_a_next_item_signal() -> None:
    """With probability ``follow`` an event after the first of its session takes one of the two ranks after the
    previous one (ranks as the stream holds them, before they become keys)."""
    spec = events_schema(follow=0.5, late=0.0).events
    assert spec is not None
    rows = _Stream(spec, 50_000, 0, 2_000, 10_000).take(50_000)
    df = pl.DataFrame(rows, schema=["user", "rank", "time", "session"], orient="row").with_row_index("pos")
    step = df.sort(["session", "time", "pos"]).with_columns(((pl.col("rank") - pl.col("rank").shift(1)) % 10_000).over("session").alias("d"))
    d = step["d"].drop_nulls().to_numpy()
    assert 0.48 < np.mean((d == 1) | (d == 2)) < 0.55


def test_refused_arguments(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="a column of the events"):
        generate(load_schema(EVENTS_YAML), 100, 1, tmp_path, cardinalities={"item_id": 10})
    doc = yaml.safe_load(EVENTS_YAML.read_text())
    doc["columns"][1] = {"name": "item_id", "role": "categorical", "dtype": "string", "encoding": "hex", "width": 2}
    doc["generate"]["events"]["items"] = 1_000
    with pytest.raises(SpecError, match=r"generate.events.items.*1,000 items do not fit the key space of column 'item_id' \(256 keys\)"):
        generate(parse_schema(doc, "<test>"), 100, 1, tmp_path)
    assert not tmp_path.exists() or not any(tmp_path.iterdir())
