"""The split section of a pipeline file (etl.pipeline.split): each form parsed, every mistake a SpecError naming
the file and the field, ISO dates as counts of the column's unit, --split's text or file, and what a split means
for fit, Groupby and artifacts."""

from __future__ import annotations

import datetime
import re
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml

from etl.errors import ArtifactError, ConfigError, SpecError
from etl.pipeline import Pipeline, check_match
from etl.pipeline.split import LastSplit, Quantile, TimeSplit, parse_split, split_option
from etl.schema import parse_schema

SCHEMA = {
    "name": "events",
    "columns": [
        {"name": "label", "role": "label", "dtype": "int64"},
        {"name": "user", "role": "categorical", "dtype": "int64"},
        {"name": "item", "role": "categorical", "dtype": "string"},
        {"name": "tags", "role": "list", "dtype": "string", "separator": "|"},
        {"name": "score", "role": "dense", "dtype": "float64"},
        {"name": "ts", "role": "passthrough", "dtype": "int64"},
        {"name": "at", "role": "passthrough", "dtype": "int64", "unit": "ms"},
        {"name": "note", "role": "passthrough", "dtype": "string"},
    ],
}
OPS = [{"op": "Decode", "columns": ["user", "item", "tags"]}, {"op": "Categorify", "columns": ["user", "item", "tags"]}]


def pipeline(tmp: Path, split: Any, ops: list[dict[str, Any]] | None = None) -> Pipeline:
    (tmp / "schema.yaml").write_text(yaml.safe_dump(SCHEMA))
    doc = {"name": "p", "schema": "schema.yaml", "ops": ops or OPS, "split": split}
    (tmp / "p.yaml").write_text(yaml.safe_dump(doc))
    return Pipeline.from_file(tmp / "p.yaml")


def test_the_forms(tmp_path: Path) -> None:
    p = pipeline(tmp_path, {"by": "time", "column": "ts", "train_until": 100, "valid_until": 200})
    assert p.split_spec == TimeSplit("ts", 100, 200) and p.split_spec.roles == ("train", "valid", "test")
    p = pipeline(tmp_path, {"by": "time", "column": "score", "train_until": {"quantile": 0.29}})
    assert p.split_spec == TimeSplit("score", Quantile(Fraction(29, 100)), None) and p.split_spec.roles == ("train", "test")
    p = pipeline(tmp_path, {"by": "last", "key": "item", "time": "ts", "tiebreak": ["note", "score"], "valid": 0, "test": 2})
    assert p.split_spec == LastSplit("item", "ts", ("note", "score"), 0, 2) and p.split_spec.roles == ("train", "test")
    assert pipeline(tmp_path, {"by": "last", "key": "user", "time": "ts"}).split_spec == LastSplit("user", "ts", (), 1, 1)
    assert pipeline(tmp_path, None).split_spec is None


def test_a_quantile_is_taken_as_written_in_decimal() -> None:
    q = Quantile(Fraction(repr(0.29)))
    assert q.index(100) == 29  # not 28, as 0.29 * 100 in floats would give
    assert q.index(1) == 0 and q.index(0) == 0 and Quantile(Fraction(999, 1000)).index(10) == 9


def test_iso_dates_are_counts_of_the_columns_unit(tmp_path: Path) -> None:
    p = pipeline(tmp_path, {"by": "time", "column": "at", "train_until": "2018-01-01", "valid_until": "2018-01-02T00:00:00.0005+01:00"})
    day = int(datetime.datetime(2018, 1, 1, tzinfo=datetime.UTC).timestamp()) * 1000
    # 2018-01-01T23:00:00.0005 UTC: the first millisecond at or after it
    assert p.split_spec == TimeSplit("at", day, day + 23 * 3600 * 1000 + 1)
    # YAML reads an unquoted date as a date: kept as ISO text in the document (the artifacts' JSON holds it)
    (tmp_path / "q.yaml").write_text("name: q\nschema: schema.yaml\nops: [{op: Decode, columns: [user, item, tags]}, {op: Hash, columns: [user, "
                                     "item, tags], num_buckets: 10}]\nsplit: {by: time, column: at, train_until: 2018-01-01}\n")  # fmt: skip
    q = Pipeline.from_file(tmp_path / "q.yaml")
    assert q.doc["split"] == {"by": "time", "column": "at", "train_until": "2018-01-01"} and q.split_spec == TimeSplit("at", day, None)


@pytest.mark.parametrize(
    ("split", "field", "problem"),
    [
        ([1], "split", "expected a mapping"),
        ({"by": "random"}, "split.by", "expected time or last"),
        ({"by": "time", "column": "ts", "train_until": 1, "seed": 3}, "split.seed", "unknown field of a split by time"),
        ({"by": "time", "train_until": 1}, "split.column", "expected a column name"),
        ({"by": "time", "column": "nope", "train_until": 1}, "split.column", "no schema column named 'nope'"),
        ({"by": "time", "column": "tags", "train_until": 1}, "split.column", "is a list column"),
        ({"by": "time", "column": "item", "train_until": 1}, "split.column", "of dtype string; expected int64 or float64"),
        ({"by": "time", "column": "ts"}, "split.train_until", "missing"),
        ({"by": "time", "column": "ts", "train_until": 1.5}, "split.train_until", "is not an integer"),
        ({"by": "time", "column": "ts", "train_until": True}, "split.train_until", "is not an integer"),
        ({"by": "time", "column": "score", "train_until": float("nan")}, "split.train_until", "is not a finite number"),
        ({"by": "time", "column": "ts", "train_until": "2018-01-01"}, "split.train_until", "has none, give the bound as a number"),
        ({"by": "time", "column": "at", "train_until": "yesterday"}, "split.train_until", "is not an ISO 8601 date"),
        ({"by": "time", "column": "ts", "train_until": {"quantile": 1}}, "split.train_until.quantile", "strictly between 0 and 1"),
        ({"by": "time", "column": "ts", "train_until": {"q": 0.5}}, "split.train_until", "expected {quantile: q}"),
        ({"by": "time", "column": "ts", "train_until": 5, "valid_until": 4}, "split.valid_until", "is before train_until 5"),
        ({"by": "time", "column": "ts", "train_until": {"quantile": 0.9}, "valid_until": {"quantile": 0.8}}, "split.valid_until", "before"),
        ({"by": "last", "time": "ts"}, "split.key", "expected a column name"),
        ({"by": "last", "key": "score", "time": "ts"}, "split.key", "of dtype float64"),
        ({"by": "last", "key": "user", "time": "score"}, "split.time", "of dtype float64; expected int64"),
        ({"by": "last", "key": "user", "time": "ts", "tiebreak": "note"}, "split.tiebreak", "expected a list"),
        ({"by": "last", "key": "user", "time": "ts", "tiebreak": ["tags"]}, "split.tiebreak[0]", "is a list column"),
        ({"by": "last", "key": "user", "time": "ts", "test": 0}, "split.test", "expected an integer >= 1"),
        ({"by": "last", "key": "user", "time": "ts", "valid": -1}, "split.valid", "expected an integer >= 0"),
        ({"by": "last", "key": "user", "time": "ts", "train_until": 3}, "split.train_until", "unknown field of a split by last"),
    ],
)
def test_mistakes_name_the_file_and_field(tmp_path: Path, split: Any, field: str, problem: str) -> None:
    with pytest.raises(SpecError, match=problem) as e:
        pipeline(tmp_path, split)
    assert (e.value.path, e.value.field) == (str(tmp_path / "p.yaml"), field)


def test_a_pipeline_that_ends_with_groupby_takes_no_split(tmp_path: Path) -> None:
    ops = [*OPS, {"op": "Groupby", "by": ["user"], "sort_by": ["ts"], "aggs": {"item": ["list"]}, "max_len": 3}]
    with pytest.raises(SpecError, match="ends with Groupby takes no split") as e:
        pipeline(tmp_path, {"by": "time", "column": "ts", "train_until": 1}, ops)
    assert e.value.field == "split"


def test_split_option_takes_flow_text_or_a_file(tmp_path: Path) -> None:
    assert split_option("{by: time, column: ts, train_until: 889000000}") == {"by": "time", "column": "ts", "train_until": 889000000}
    assert split_option('{"by": "last", "key": "user", "time": "ts"}') == {"by": "last", "key": "user", "time": "ts"}
    (tmp_path / "split.yaml").write_text("by: time\ncolumn: at\ntrain_until: 2018-01-01\n")
    assert split_option(str(tmp_path / "split.yaml")) == {"by": "time", "column": "at", "train_until": "2018-01-01"}
    with pytest.raises(SpecError, match="invalid YAML") as e:
        split_option("{by: time, column")
    assert e.value.path == "--split"
    with pytest.raises(SpecError, match="expected a mapping") as e:
        split_option("time")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(SpecError, match="expected a mapping") as e:
        split_option(str(tmp_path / "list.yaml"))
    assert e.value.path == str(tmp_path / "list.yaml")


def test_a_pipeline_with_a_split_is_not_fitted_on_every_row(tmp_path: Path) -> None:
    p = pipeline(tmp_path, {"by": "time", "column": "ts", "train_until": 1})
    with pytest.raises(ConfigError, match="has a split: etl preprocess fits its statistics on the train rows only"):
        p.fit([])


def test_artifacts_record_the_split_and_match_the_pipeline_without_it(tmp_path: Path) -> None:
    """A split says which rows the statistics were fitted on: the artifacts keep it, a pipeline with another split
    or none matches them, and the loaded pipeline has no split left to run."""
    plain = pipeline(tmp_path, None, [{"op": "Decode", "columns": ["user", "item", "tags"]}, {"op": "Hash", "columns": ["user", "item", "tags"],
                                                                                               "num_buckets": 10}])  # fmt: skip
    doc = {**plain.doc, "split": {"by": "time", "column": "ts", "train_until": 7}}
    split = Pipeline(doc, plain.schema, "p.yaml")
    split.save(tmp_path / "art")
    loaded = Pipeline.load(tmp_path / "art")
    assert loaded.doc["split"] == doc["split"] and loaded.split_spec is None
    check_match(loaded, plain, tmp_path / "art")
    other = Pipeline({**plain.doc, "name": "other"}, plain.schema, "o.yaml")
    with pytest.raises(ArtifactError, match="fitted with another pipeline"):
        check_match(loaded, other, tmp_path / "art")


def test_the_examples_of_pipelines_readme_parse() -> None:
    text = (Path(__file__).resolve().parents[3] / "pipelines" / "README.md").read_text()
    section = text[text.index("## Split\n") : text.index("## Ops on numbers")]
    examples = re.findall(r"^split: (\{.*\})$", section, flags=re.M)
    columns = [{"name": "userId", "role": "categorical", "dtype": "int64"}, {"name": "movieId", "role": "categorical", "dtype": "int64"},
               {"name": "timestamp", "role": "dense", "dtype": "int64"}, {"name": "event_time", "role": "passthrough", "dtype": "int64", "unit": "s"}]
    schema = parse_schema({"name": "ml", "columns": columns}, "s.yaml")
    parsed = [parse_split(yaml.safe_load(e), schema, "pipelines/README.md") for e in examples]
    assert [type(p).__name__ for p in parsed] == ["TimeSplit", "TimeSplit", "TimeSplit", "LastSplit"]
