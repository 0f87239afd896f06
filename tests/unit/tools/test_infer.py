"""etl.tools.infer: the guessed schema and starter pipeline for text and Parquet samples."""

from __future__ import annotations

import csv
import gzip
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from etl.errors import InputError
from etl.io.text import convert
from etl.pipeline import Pipeline
from etl.preprocess import preprocess
from etl.schema import ColumnSpec, load_schema
from etl.tools.infer import HASH_BUCKETS, Values, infer, summarise
from tests.conftest import REPO, criteo_table


def specs(inference) -> list[ColumnSpec]:
    return [c.spec for c in inference.columns]


def write_yaml(inference, tmp_path: Path) -> Pipeline:
    """Write schema and pipeline the way the CLI does, load both as files."""
    (tmp_path / "guess").mkdir(exist_ok=True)
    (tmp_path / "guess" / "schema.yaml").write_text(inference.schema_yaml())
    (tmp_path / "guess" / "pipeline.yaml").write_text(inference.pipeline_yaml("schema.yaml"))
    load_schema(tmp_path / "guess" / "schema.yaml")
    return Pipeline.from_file(tmp_path / "guess" / "pipeline.yaml")


def ops_of(pipeline: Pipeline) -> list[dict]:
    return [{k: v for k, v in op.items()} for op in pipeline.doc["ops"]]


# --------------------------------------------------------------------------------------------------------------------
# value kinds


def test_summarise_kinds():
    assert summarise([]) == Values("empty")
    v = summarise(["0", "1", "1"])
    assert (v.kind, v.binary, v.minimum, v.count, v.distinct) == ("int", True, 0, 3, 2)
    assert summarise(["-2", "7"]).minimum == -2 and not summarise(["2", "7"]).binary
    assert summarise([str(2**63 - 1), "-" + str(2**63)]).kind == "int"
    big = summarise(["5", str(2**63)])
    assert (big.kind, big.example) == ("bigint", str(2**63))
    assert summarise([str(2**64 - 1), "-" + str(2**63)]).kind == "bigint"
    assert summarise([str(2**64)]).kind == "string" and summarise(["-" + str(2**63 + 1)]).kind == "string"  # beyond uint64/int64
    assert summarise(["1.5", "2", "-3e2"]).kind == "float" and summarise(["1.5", "-3e2"]).minimum == -300
    assert summarise(["inf", "1.0"]).kind == "string"  # not finite: text
    h = summarise(["0b153874", "A73EE510", "12345678"])
    assert (h.kind, h.width) == ("hex", 8)
    assert summarise(["0b15", "a73ee510"]).kind == "string"  # two widths
    assert summarise(["0123456789abcdef0"]).kind == "string"  # 17 digits: beyond a uint64
    assert summarise(["+5"]).kind == "string" and summarise([" 5"]).kind == "string"


# --------------------------------------------------------------------------------------------------------------------
# text


def test_headerless_criteo_layout_gives_the_criteo_schema(tmp_path):
    table = criteo_table(300, seed=1)
    path = tmp_path / "day_0.gz"
    with gzip.open(path, "wt") as f:
        for row in zip(*(table.column(i).to_pylist() for i in range(table.num_columns))):
            f.write("\t".join("" if v is None else str(v) for v in row) + "\n")
    got = infer([path])
    criteo = load_schema(REPO / "schemas" / "criteo.yaml")
    assert specs(got) == list(criteo.columns)
    assert got.text == criteo.text and got.name == "day_0" and got.rows == 300
    treat = {c.spec.name: c.treatment for c in got.columns}
    negative = {f"I{i}" for i in range(1, 14) if min(v for v in table.column(f"I{i}").to_pylist() if v is not None) < 0}
    assert negative and all(treat[n] == ("normalize" if n in negative else "log1p") for n in criteo.by_role("dense"))
    assert "# guessed: Criteo layout" in got.schema_yaml().splitlines()[8]
    p = write_yaml(got, tmp_path)
    assert [op["op"] for op in ops_of(p)] == ["FillMissing", "Clamp", "Log1p", "Normalize", "Decode", "Categorify"]
    assert ops_of(p)[1]["columns"] == [f"I{i}" for i in range(1, 14) if f"I{i}" not in negative]
    assert ops_of(p)[4]["columns"] == criteo.by_role("categorical")


def test_headerless_other_layout_names_columns_by_position(tmp_path):
    path = tmp_path / "x.tsv"
    path.write_text("".join(f"{i % 7}\t{i % 2}\tx{i % 5}\t{i * 1.5}\n" for i in range(50)))
    got = infer([path])
    assert specs(got) == [
        ColumnSpec("col0", "dense", "int64"),
        ColumnSpec("col1", "label", "int64"),  # the first 0/1 column
        ColumnSpec("col2", "categorical", "string", "string"),
        ColumnSpec("col3", "dense", "float64"),
    ]
    assert got.text is not None and got.text.header is False and got.text.delimiter == "\t"


def write_csv(path: Path, header: list[str], rows: list[list[str]], delimiter: str = ",") -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f, delimiter=delimiter, lineterminator="\n")
        w.writerow(header)
        w.writerows(rows)


def test_header_csv_roles_encodings_lists_and_null_token(tmp_path):
    rows = []
    for i in range(120):
        rows.append([
            str(i % 2),                                         # click: label
            str(10 + i),                                        # user_id: integer ids
            f"{(i * 2654435761) % 2**32:08x}",                  # site: hex8
            str(2**64 - 1 - i) if i % 3 else str(i),            # uid: beyond int64
            "NA" if i % 10 == 0 else str(i * 3),                # count: ints with a null token
            f"{i / 7 - 3:.3f}",                                 # score: negative floats
            "|".join(["red", "green", "blue"][: 1 + i % 3]),             # tags: lists
            f"Title, {i % 40}",                                 # title: quoted text with the delimiter
            str(1_600_000_000 + i),                             # event_time: a time
        ])  # fmt: skip
    header = ["click", "user_id", "site", "uid", "count", "score", "tags", "title", "event_time"]
    path = tmp_path / "events.csv"
    write_csv(path, header, rows)
    got = infer([path])
    assert specs(got) == [
        ColumnSpec("click", "label", "int64"),
        ColumnSpec("user_id", "categorical", "int64", "int"),
        ColumnSpec("site", "categorical", "string", "hex", 8),
        ColumnSpec("uid", "categorical", "string", "int"),
        ColumnSpec("count", "dense", "int64"),
        ColumnSpec("score", "dense", "float64"),
        ColumnSpec("tags", "list", "string", "string", None, "|"),
        ColumnSpec("title", "categorical", "string", "string"),
        ColumnSpec("event_time", "dense", "int64"),
    ]
    assert got.text is not None and (got.text.delimiter, got.text.header, got.text.null_value) == (",", True, "NA")
    schema_yaml = got.schema_yaml()
    assert "{name: click, role: label, dtype: int64}  # guessed: 0/1 values, named 'click'" in schema_yaml
    assert "null_value: NA  # guessed: 'NA' appears 12 times" in schema_yaml
    assert {c.spec.name: c.treatment for c in got.columns}["score"] == "normalize"
    assert {c.spec.name: c.treatment for c in got.columns}["event_time"] == "normalize"
    p = write_yaml(got, tmp_path)
    assert ops_of(p) == [
        {"op": "FillMissing", "columns": "@dense", "value": 0},
        {"op": "Clamp", "columns": ["count"], "min": 0},
        {"op": "Log1p", "columns": ["count"]},
        {"op": "Normalize", "columns": ["score", "event_time"]},
        {"op": "Decode", "columns": ["user_id", "site", "uid", "tags", "title"]},
        {"op": "FirstX", "columns": ["tags"], "x": 3},
        {"op": "Categorify", "columns": ["user_id", "site", "uid", "tags", "title"], "freq_threshold": 1},
    ]
    # the guess converts the file: the values read back equal a plain csv parse
    shards = convert([path], p.schema, tmp_path / "raw")
    back = pq.read_table(shards).to_pydict()
    assert back["uid"] == [r[3] for r in rows]
    assert back["count"] == [None if r[4] == "NA" else int(r[4]) for r in rows]
    assert back["tags"] == [r[6].split("|") for r in rows]
    assert back["title"] == [r[7] for r in rows]


def test_a_column_named_id_with_distinct_values_is_a_row_id_passed_through(tmp_path):
    rows = [[str(i % 2), str(2**64 - 1 - i), f"{0xABC00000 + i % 7:08x}"] for i in range(40)]
    write_csv(tmp_path / "e.csv", ["click", "id", "site"], rows)
    got = infer([tmp_path / "e.csv"])
    assert specs(got) == [ColumnSpec("click", "label", "int64"), ColumnSpec("id", "passthrough", "string"),
                          ColumnSpec("site", "categorical", "string", "hex", 8)]  # fmt: skip
    assert "a row id (all 40 sampled values distinct)" in got.schema_yaml()
    assert ops_of(write_yaml(got, tmp_path)) == [
        {"op": "Decode", "columns": ["site"]},
        {"op": "Categorify", "columns": ["site"], "freq_threshold": 1},
    ]
    rows[1][1] = rows[0][1]  # a repeated value: a categorical id, not a row id
    write_csv(tmp_path / "r.csv", ["click", "id", "site"], rows)
    assert specs(infer([tmp_path / "r.csv"]))[1] == ColumnSpec("id", "categorical", "string", "int")


def test_rating_is_a_label_whatever_its_values_and_samples_of_several_files(tmp_path):
    rows = [[str(u), str(m), f"{(u + m) % 10 / 2 + 0.5}", str(964982703 + u)] for u in range(1, 30) for m in (1, 2)]
    write_csv(tmp_path / "a.csv", ["userId", "movieId", "rating", "timestamp"], rows[:30])
    write_csv(tmp_path / "b.csv", ["userId", "movieId", "rating", "timestamp"], rows[30:])
    got = infer([tmp_path / "a.csv", tmp_path / "b.csv"], rows=20)
    assert got.rows == 40 and got.sources == ["a.csv", "b.csv"]
    assert specs(got)[:3] == [ColumnSpec("userId", "categorical", "int64", "int"), ColumnSpec("movieId", "categorical", "int64", "int"),
                              ColumnSpec("rating", "label", "float64")]  # fmt: skip
    assert "named 'rating' (a rating is a label whatever its values)" in got.schema_yaml()


def test_high_cardinality_columns_are_hashed(tmp_path):
    path = tmp_path / "h.csv"
    write_csv(path, ["label", "device", "country"], [[str(i % 2), f"dev-{i}", ["fr", "de"][i % 2]] for i in range(1500)])
    got = infer([path])
    assert {c.spec.name: c.treatment for c in got.columns} == {"label": "label", "device": "hash", "country": "categorify"}
    ops = ops_of(write_yaml(got, tmp_path))
    assert {"op": "Hash", "columns": ["device"], "num_buckets": HASH_BUCKETS, "seed": 0} in ops
    assert "1,500 distinct in 1,500 values" in got.schema_yaml()


def test_first_line_of_text_only_data_is_a_header_only_if_its_names_do_not_recur(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("red,cat\nblue,dog\nred,dog\n")
    got = infer([path])
    assert got.text is not None and got.text.header is False and [c.spec.name for c in got.columns] == ["col0", "col1"]
    path.write_text("colour,animal\nblue,dog\nred,dog\n")
    assert infer([path]).text.header is True  # type: ignore[union-attr]


# --------------------------------------------------------------------------------------------------------------------
# Parquet


def test_parquet_types(tmp_path):
    n = 40
    t = pa.table({
        "label": pa.array([i % 2 for i in range(n)], pa.int8()),
        "price": pa.array([i * 0.5 for i in range(n)]),
        "item_id": pa.array([2**64 - 1 - i for i in range(n)], pa.uint64()),
        "code": pa.array([f"{i:04x}" for i in range(n)]),
        "zipcode": pa.array([str(10000 + i) for i in range(n)]),
        "genres": pa.array([["drama", "comedy"][: 1 + i % 2] for i in range(n)]),
        "clicks": pa.array([[i, i + 1, i + 2] for i in range(n)], pa.list_(pa.int32())),
        "when": pa.array([i for i in range(n)], pa.timestamp("ms")),
    })  # fmt: skip
    path = tmp_path / "part-0.parquet"
    pq.write_table(t, path)
    got = infer([path])
    assert specs(got) == [
        ColumnSpec("label", "label", "int64"),
        ColumnSpec("price", "dense", "float64"),
        ColumnSpec("item_id", "categorical", "int64", "int"),
        ColumnSpec("code", "categorical", "string", "hex", 4),
        ColumnSpec("zipcode", "categorical", "string", "int"),
        ColumnSpec("genres", "list", "string", "string", None, "|"),
        ColumnSpec("clicks", "list", "int64", "int", None, "|"),
    ]
    assert got.text is None and got.left_out == ["column 'when' (timestamp[ms]): no schema dtype holds it"]
    assert "# left out: column 'when'" in got.schema_yaml() and "text:" not in got.schema_yaml()
    p = write_yaml(got, tmp_path)
    assert {"op": "FirstX", "columns": ["clicks"], "x": 3} in ops_of(p)
    # the guess reads the file as it is: fit and transform run
    summary = preprocess(p, [path], tmp_path / "out")
    assert summary.rows_out == n
    out = pq.read_table(tmp_path / "out" / "part-00000.parquet")
    assert out.column("label").to_pylist() == [float(i % 2) for i in range(n)]


def test_parquet_columns_keep_their_type_whatever_the_values(tmp_path):
    t = pa.table({
        "label": pa.array(["0", "1"] * 5),  # text: not a label, whatever its name
        "price": pa.array([float("nan"), 2.5] * 5),
        "count": pa.array([None] * 10, pa.int64()),
    })  # fmt: skip
    pq.write_table(t, tmp_path / "p.parquet")
    assert specs(infer([tmp_path / "p.parquet"])) == [
        ColumnSpec("label", "categorical", "string", "int"),
        ColumnSpec("price", "dense", "float64"),
        ColumnSpec("count", "dense", "int64"),
    ]
    pq.write_table(t.slice(0, 0), tmp_path / "empty.parquet")
    assert specs(infer([tmp_path / "empty.parquet"]))[1:] == [ColumnSpec("price", "dense", "float64"), ColumnSpec("count", "dense", "int64")]


# --------------------------------------------------------------------------------------------------------------------
# errors


def test_errors(tmp_path):
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(InputError, match="empty.csv: empty"):
        infer([empty])
    one = tmp_path / "one.txt"
    one.write_text("just words\nand more, words\n")
    with pytest.raises(InputError, match="one.txt: no delimiter found"):
        infer([one])
    with pytest.raises(InputError, match="nope.csv: no such file"):
        infer([tmp_path / "nope.csv"])
    write_csv(tmp_path / "a.csv", ["a", "b"], [["1", "x"]])
    write_csv(tmp_path / "b.csv", ["a", "c"], [["1", "x"]])
    with pytest.raises(InputError, match="b.csv: its layout .* differs from .*a.csv"):
        infer([tmp_path / "a.csv", tmp_path / "b.csv"])
    with pytest.raises(ValueError, match="rows must be a positive integer"):
        infer([tmp_path / "a.csv"], rows=0)


def test_yaml_round_trip_of_awkward_names(tmp_path):
    path = tmp_path / "w.csv"
    write_csv(path, ["a: b", "#tag", "x y"], [["1", "q", "2.5"], ["0", "r", "3.5"]])
    got = infer([path])
    doc = yaml.safe_load(got.schema_yaml())
    assert [c["name"] for c in doc["columns"]] == ["a: b", "#tag", "x y"]
    assert got.schema().names == ["a: b", "#tag", "x y"]


def test_an_unterminated_quote_in_the_sample_is_an_error_naming_its_line(tmp_path):
    rows = [f"{i % 2},{i},x{i}" for i in range(500)]
    rows[7] = '1,6,"b'
    src = tmp_path / "open.csv"
    src.write_text("\n".join(rows) + "\n")
    with pytest.raises(InputError, match="open.csv.*field 3.*line 8: a quoted field opens on this line"):
        infer([src])
