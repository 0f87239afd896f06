"""etl.io.text: delimited text → raw-layout Parquet shards."""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from etl.errors import InputError, OutputError
from etl.io.text import ROW_GROUP_ROWS, convert, existing_shards, raw_arrow_schema
from etl.schema import Schema, load_schema, parse_schema

ROOT = Path(__file__).resolve().parents[3]
DATA = Path(os.environ.get("ETL_SHARED_DATA", ROOT.parent / "shared" / "data"))
CRITEO = DATA / "criteo-kaggle-8k"
CRITEO_FILES = [CRITEO / f for f in ("train.csv", "dev.csv", "test.csv")]
MOVIELENS = DATA / "movielens-ml-latest-small"

needs_criteo = pytest.mark.skipif(not CRITEO.is_dir(), reason=f"real Criteo sample not at {CRITEO}")
needs_movielens = pytest.mark.skipif(not MOVIELENS.is_dir(), reason=f"MovieLens sample not at {MOVIELENS}")


@pytest.fixture(scope="module")
def criteo() -> Schema:
    return load_schema(ROOT / "schemas" / "criteo.yaml")


def _schema(columns: list[dict], **text) -> Schema:
    return parse_schema({"name": "t", "text": text, "columns": columns})


def _rows(paths: list[Path]) -> pa.Table:
    return pa.concat_tables([pq.read_table(p) for p in paths])


# --------------------------------------------------------------------------------------------------------------------
# raw layout


def test_raw_arrow_schema_types():
    s = _schema([
        {"name": "y", "role": "label", "dtype": "float64"},
        {"name": "i", "role": "dense", "dtype": "int64"},
        {"name": "c", "role": "categorical", "dtype": "string", "encoding": "hex", "width": 8},
        {"name": "u", "role": "categorical", "dtype": "int64"},
        {"name": "g", "role": "list", "dtype": "string", "separator": "|"},
        {"name": "h", "role": "list", "dtype": "int64", "separator": ";"},
    ])
    a = raw_arrow_schema(s)
    assert a.names == ["y", "i", "c", "u", "g", "h"]
    assert a.types == [pa.float64(), pa.int64(), pa.string(), pa.int64(), pa.list_(pa.string()), pa.list_(pa.int64())]
    assert a.field("g").type.value_field.name == "element"


# --------------------------------------------------------------------------------------------------------------------
# the real Criteo sample


@needs_criteo
def test_criteo_sample(criteo, tmp_path):
    seen = []
    paths = convert(CRITEO_FILES, criteo, tmp_path / "out", progress=seen.append)
    assert [p.name for p in paths] == ["part-00000.parquet"]
    assert sorted(x.name for x in (tmp_path / "out").iterdir()) == ["part-00000.parquet"]  # no temporaries left
    assert seen and sum(seen) == 8000 and all(n > 0 for n in seen)  # rows per row group written
    t = pq.read_table(paths[0])
    assert t.num_rows == 8000
    assert t.schema.equals(raw_arrow_schema(criteo))
    assert t.schema.types[:14] == [pa.int64()] * 14 and t.schema.types[14:] == [pa.string()] * 26

    # the statistics stated in SOURCE.txt
    missing = {"I1": .452, "I2": 0, "I3": .203, "I4": .203, "I5": .05, "I6": .252, "I7": .05, "I8": .001,
               "I9": .05, "I10": .452, "I11": .05, "I12": .777, "I13": .203}
    for name, frac in missing.items():
        assert round(t[name].null_count / 8000, 3) == frac, name
    assert round(pc.mean(t["label"]).as_py(), 3) == 0.216
    assert t["label"].null_count == 0
    assert pc.min(t["I2"]).as_py() == -2
    assert pc.max(t["I5"]).as_py() == 1618112
    cards = [157, 370, 4524, 3369, 53, 7, 2817, 82, 3, 2584, 1904, 4337, 1591, 22, 1833, 3905, 9, 1055, 480, 3, 4140,
             7, 12, 2152, 37, 1635]
    assert [pc.count_distinct(t[f"C{i}"], mode="only_valid").as_py() for i in range(1, 27)] == cards
    c_missing = sum(t[f"C{i}"].null_count for i in range(1, 27)) / (8000 * 26)
    assert round(c_missing, 3) == 0.114
    assert pc.all(pc.match_substring_regex(t["C1"], r"^[0-9a-f]{8}$")).as_py()

    first = t.slice(0, 1).to_pylist()[0]
    assert first["label"] == 0
    assert [first[f"I{i}"] for i in range(1, 14)] == [1, 1, 5, 0, 1382, 4, 15, 2, 181, 1, 2, None, 2]
    assert first["C1"] == "68fd1e64" and first["C2"] == "80e26c9b" and first["C22"] is None
    assert first["C26"] == "9727dd16"


@needs_criteo
def test_rows_per_file_keeps_order_and_row_groups(criteo, tmp_path):
    whole = pq.read_table(convert(CRITEO_FILES, criteo, tmp_path / "whole")[0])
    paths = convert(CRITEO_FILES, criteo, tmp_path / "split", rows_per_file=3000)
    assert [p.name for p in paths] == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    assert [pq.ParquetFile(p).metadata.num_rows for p in paths] == [3000, 3000, 2000]
    assert _rows(paths).equals(whole)  # rows of train, dev and test share shards, in input order

    paths = convert(CRITEO_FILES, criteo, tmp_path / "rg", rows_per_file=2500)
    md = [pq.ParquetFile(p).metadata for p in paths]
    assert [m.num_rows for m in md] == [2500, 2500, 2500, 500]
    assert all(m.row_group(i).num_rows == (2500 if m.num_rows == 2500 else 500)
               for m in md for i in range(m.num_row_groups))
    assert all(m.num_row_groups == 1 for m in md)
    big = pq.ParquetFile(convert(CRITEO_FILES, criteo, tmp_path / "big", rows_per_file=10**9)[0])
    assert big.metadata.num_row_groups == 1 and ROW_GROUP_ROWS == 131072


def test_row_groups_are_full(tmp_path):
    # 300k one-column rows, rows_per_file 200k → shards of 200k (131072 + 68928) and 100k rows
    s = _schema([{"name": "x", "role": "dense", "dtype": "int64"}])
    src = tmp_path / "x.txt"
    src.write_text("\n".join(str(i) for i in range(300_000)) + "\n")
    paths = convert([src], s, tmp_path / "out", rows_per_file=200_000)
    md = [pq.ParquetFile(p).metadata for p in paths]
    assert [[m.row_group(i).num_rows for i in range(m.num_row_groups)] for m in md] == [[131072, 68928], [100000]]
    assert _rows(paths)["x"].to_pylist() == list(range(300_000))


@needs_criteo
def test_gzip_input(criteo, tmp_path):
    gz = tmp_path / "dev.csv.gz"
    with open(CRITEO / "dev.csv", "rb") as fi, gzip.open(gz, "wb") as fo:
        shutil.copyfileobj(fi, fo)
    a = pq.read_table(convert([gz], criteo, tmp_path / "gz")[0])
    b = pq.read_table(convert([CRITEO / "dev.csv"], criteo, tmp_path / "plain")[0])
    assert a.num_rows == 409 and a.equals(b)


# --------------------------------------------------------------------------------------------------------------------
# text layouts


def test_header_selects_and_reorders_columns(tmp_path):
    s = _schema(
        [
            {"name": "label", "role": "label", "dtype": "int64"},
            {"name": "price", "role": "dense", "dtype": "float64"},
            {"name": "item", "role": "categorical", "dtype": "string", "encoding": "hex", "width": 8},
        ],
        delimiter=",", header=True, null_value="NA",
    )
    src = tmp_path / "h.csv"
    src.write_text('item,extra,price,label\n00000123,x,1.5,1\nNA,y,,0\n"0000abcd",z,NA,1\n,w,-2,0\n')
    t = pq.read_table(convert([src], s, tmp_path / "out")[0])
    assert t.schema.equals(raw_arrow_schema(s))
    assert t.to_pydict() == {
        "label": [1, 0, 1, 0],
        "price": [1.5, None, None, -2.0],
        "item": ["00000123", None, "0000abcd", None],  # hex text stays text, leading zeros kept
    }


def test_header_missing_column(tmp_path):
    s = _schema([{"name": "a", "role": "dense", "dtype": "int64"}, {"name": "b", "role": "dense", "dtype": "int64"}],
                header=True)
    src = tmp_path / "h.csv"
    src.write_text("a,c\n1,2\n")
    with pytest.raises(InputError) as e:
        convert([src], s, tmp_path / "out")
    assert e.value.path == str(src) and e.value.column == "b" and "['b']" in str(e.value)


def test_list_columns(tmp_path):
    s = _schema(
        [
            {"name": "id", "role": "categorical", "dtype": "int64"},
            {"name": "genres", "role": "list", "dtype": "string", "separator": "|"},
            {"name": "tags", "role": "list", "dtype": "int64", "separator": ";"},
        ],
        delimiter="\t",
    )
    src = tmp_path / "l.tsv"
    src.write_text("1\tAdventure|Animation|Children\t3;-4;5\n2\t\t\n3\tDrama\t7\n4\ta||b\t\n")
    t = pq.read_table(convert([src], s, tmp_path / "out")[0])
    assert t.schema.equals(raw_arrow_schema(s))
    assert t.schema.field("tags").type == pa.list_(pa.int64())
    assert t.to_pydict() == {
        "id": [1, 2, 3, 4],
        "genres": [["Adventure", "Animation", "Children"], None, ["Drama"], ["a", "", "b"]],
        "tags": [[3, -4, 5], None, [7], None],
    }


def test_bad_list_element(tmp_path):
    s = _schema([{"name": "tags", "role": "list", "dtype": "int64", "separator": ";"}])
    src = tmp_path / "l.txt"
    src.write_text("1;2\n3\n4;x5\n")
    with pytest.raises(InputError) as e:
        convert([src], s, tmp_path / "out")
    assert e.value.column == "tags" and "line 3" in str(e.value) and "'x5'" in str(e.value)


@needs_movielens
def test_movielens_real(tmp_path):
    ratings = _schema(
        [
            {"name": "userId", "role": "categorical", "dtype": "int64", "encoding": "int"},
            {"name": "movieId", "role": "categorical", "dtype": "int64", "encoding": "int"},
            {"name": "rating", "role": "label", "dtype": "float64"},
            {"name": "timestamp", "role": "dense", "dtype": "int64"},
        ],
        delimiter=",", header=True,
    )
    t = pq.read_table(convert([MOVIELENS / "ratings.csv"], ratings, tmp_path / "r")[0])
    assert t.num_rows == 100836
    assert t.slice(0, 1).to_pylist()[0] == {"userId": 1, "movieId": 1, "rating": 4.0, "timestamp": 964982703}
    movies = _schema(
        [
            {"name": "movieId", "role": "categorical", "dtype": "int64"},
            {"name": "genres", "role": "list", "dtype": "string", "separator": "|"},
        ],
        delimiter=",", header=True,
    )
    m = pq.read_table(convert([MOVIELENS / "movies.csv"], movies, tmp_path / "m")[0])  # titles are quoted, dropped
    assert m.num_rows == 9742
    assert m["genres"][0].as_py() == ["Adventure", "Animation", "Children", "Comedy", "Fantasy"]
    assert m["genres"].null_count == 0


# --------------------------------------------------------------------------------------------------------------------
# errors and output-directory behaviour


@needs_criteo
def test_wrong_field_count_names_file_and_line(criteo, tmp_path):
    lines = (CRITEO / "dev.csv").read_text().splitlines(keepends=True)
    lines[99] = "\t".join(lines[99].split("\t")[:39]) + "\n"  # line 100 loses its last field
    bad = tmp_path / "bad.tsv"
    bad.write_text("".join(lines))
    with pytest.raises(InputError) as e:
        convert([CRITEO / "test.csv", bad], criteo, tmp_path / "out")
    assert e.value.path == str(bad)
    assert "line 100" in str(e.value) and "expected 40, got 39" in str(e.value)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@needs_criteo
def test_unparsable_int_names_column_and_line(criteo, tmp_path):
    lines = (CRITEO / "dev.csv").read_text().splitlines(keepends=True)
    fields = lines[6].split("\t")
    fields[5] = "12x"  # I5
    lines[6] = "\t".join(fields)
    bad = tmp_path / "bad.tsv"
    bad.write_text("".join(lines))
    with pytest.raises(InputError) as e:
        convert([bad], criteo, tmp_path / "out")
    assert e.value.path == str(bad) and e.value.column == "I5"
    assert "line 7" in str(e.value) and "'12x'" in str(e.value)


def test_missing_input(tmp_path):
    s = _schema([{"name": "x", "role": "dense", "dtype": "int64"}])
    ok = tmp_path / "ok.txt"
    ok.write_text("1\n")
    with pytest.raises(InputError) as e:
        convert([ok, tmp_path / "nope.tsv"], s, tmp_path / "out")
    assert e.value.path == str(tmp_path / "nope.tsv") and "no such file" in str(e.value)
    assert not (tmp_path / "out").exists()


def test_failed_run_leaves_output_unchanged_and_success_replaces_it(tmp_path):
    s = _schema([{"name": "x", "role": "dense", "dtype": "int64"}])
    out = tmp_path / "out"
    big = tmp_path / "big.txt"
    big.write_text("1\n2\n3\n4\n5\n")
    assert len(convert([big], s, out, rows_per_file=2)) == 3
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    bad = tmp_path / "bad.txt"
    bad.write_text("1\n2\n3\nfour\n")
    with pytest.raises(InputError):
        convert([bad], s, out, rows_per_file=2)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    small = tmp_path / "small.txt"
    small.write_text("7\n")
    assert [p.name for p in convert([small], s, out, rows_per_file=2)] == ["part-00000.parquet"]
    assert sorted(p.name for p in out.iterdir()) == ["part-00000.parquet"]  # stale part-00001/2 removed
    assert pq.read_table(out / "part-00000.parquet")["x"].to_pylist() == [7]


def test_empty_input_gives_one_empty_shard(tmp_path):
    s = _schema([{"name": "x", "role": "dense", "dtype": "int64"}, {"name": "y", "role": "dense", "dtype": "int64"}],
                header=True)
    empty, header_only = tmp_path / "e.csv", tmp_path / "h.csv"
    empty.write_text("")
    header_only.write_text("x,y\n")
    paths = convert([empty, header_only], s, tmp_path / "out")
    t = pq.read_table(paths[0])
    assert len(paths) == 1 and t.num_rows == 0 and t.schema.equals(raw_arrow_schema(s))


def test_bad_arguments(tmp_path):
    s = _schema([{"name": "x", "role": "dense", "dtype": "int64"}])
    with pytest.raises(InputError):
        convert([], s, tmp_path / "out")
    with pytest.raises(ValueError):
        convert([tmp_path], s, tmp_path / "out", rows_per_file=0)


# --------------------------------------------------------------------------------------------------------------------
# header: auto, dropped columns, per-column null_values


def _three(**text) -> Schema:
    return _schema([
        {"name": "y", "role": "label", "dtype": "int64"},
        {"name": "note", "role": "drop"},
        {"name": "c", "role": "categorical", "dtype": "string", "encoding": "hex", "width": 4},
    ], delimiter=",", **text)


def test_header_auto_decides_per_file(tmp_path):
    s = _three(header="auto")
    with_header, without = tmp_path / "a.csv", tmp_path / "b.csv"
    with_header.write_text("y,note,c\n1,hello,00ff\n0,,abcd\n")
    without.write_text("1,x,1234\n")
    t = pq.read_table(convert([with_header, without], s, tmp_path / "out")[0])
    assert t.column_names == ["y", "c"]  # the dropped column is not written
    assert t.to_pydict() == {"y": [1, 0, 1], "c": ["00ff", "abcd", "1234"]}


def test_header_auto_needs_every_name_in_order(tmp_path):
    s = _three(header="auto")
    src = tmp_path / "a.csv"
    src.write_text("y,c,note\n1,00ff,x\n")  # a reordered header is not recognised: read as data, and 'y' is no int64
    with pytest.raises(InputError) as e:
        convert([src], s, tmp_path / "out")
    assert e.value.column == "y" and "line 1" in str(e.value) and "'y'" in str(e.value)


def test_header_auto_line_numbers_count_the_header(tmp_path):
    s = _three(header="auto")
    src = tmp_path / "a.csv"
    src.write_text("y,note,c\n1,a,00ff\nzz,b,0000\n")
    with pytest.raises(InputError) as e:
        convert([src], s, tmp_path / "out")
    assert "line 3" in str(e.value) and e.value.column == "y"


def test_header_true_mismatch_lists_expected_and_found(tmp_path):
    s = _three(header=True)
    src = tmp_path / "a.csv"
    src.write_text("y,note,cc\n1,a,00ff\n")
    with pytest.raises(InputError) as e:
        convert([src], s, tmp_path / "out")
    msg = str(e.value)
    assert e.value.path == str(src) and e.value.column == "c"
    assert "['y', 'note', 'c']" in msg and "['y', 'note', 'cc']" in msg
    assert "field 3: expected 'c', found 'cc'" in msg


def test_header_true_tolerates_a_missing_dropped_column(tmp_path):
    s = _three(header=True)
    src = tmp_path / "a.csv"
    src.write_text("c,y\n00ff,1\n")
    assert pq.read_table(convert([src], s, tmp_path / "out")[0]).to_pydict() == {"y": [1], "c": ["00ff"]}


def test_header_false_with_a_header_line_suggests_header(tmp_path):
    s = _three(header=False)
    src = tmp_path / "a.csv"
    src.write_text("y,note,c\n1,a,00ff\n")
    with pytest.raises(InputError) as e:
        convert([src], s, tmp_path / "out")
    assert "line 1" in str(e.value) and "text.header to true or auto" in str(e.value)
    other = tmp_path / "b.csv"
    other.write_text("1,a,00ff\nq,b,0000\n")
    with pytest.raises(InputError) as e:
        convert([other], s, tmp_path / "out")
    assert "text.header" not in str(e.value)


def test_dropped_column_in_headerless_text(tmp_path):
    s = _three()
    src = tmp_path / "a.csv"
    src.write_text('1,"free, text",00ff\n0,,0001\n')
    t = pq.read_table(convert([src], s, tmp_path / "out")[0])
    assert t.schema.equals(raw_arrow_schema(s)) and t.to_pydict() == {"y": [1, 0], "c": ["00ff", "0001"]}
    bad = tmp_path / "b.csv"
    bad.write_text("1,00ff\n")  # a headerless line lists every column, the dropped one too
    with pytest.raises(InputError, match="expected 3, got 2"):
        convert([bad], s, tmp_path / "out")


def test_column_null_values_override_the_schema_wide_one(tmp_path):
    s = _schema([
        {"name": "y", "role": "label", "dtype": "int64"},
        {"name": "d", "role": "dense", "dtype": "float64", "null_values": ["-1", "?"]},
        {"name": "e", "role": "dense", "dtype": "int64"},
        {"name": "c", "role": "categorical", "dtype": "string", "null_values": ["unknown"]},
        {"name": "s", "role": "categorical", "dtype": "string"},
        {"name": "g", "role": "list", "dtype": "string", "separator": "|", "null_values": ["(none)", "?"]},
        {"name": "h", "role": "list", "dtype": "string", "separator": "|"},
    ], delimiter=",", null_value="NA")
    src = tmp_path / "a.csv"
    src.write_text(
        "1,-1,NA,NA,NA,(none),NA\n"     # d: own missing text; c: 'NA' is a value there, the schema-wide null elsewhere
        "0,3,5,unknown,unknown,a|(none)|b,a|NA\n"
        "1,?,,,,?|(none),\n"
        '0, 2.5 ,-1,"x",y,,(none)\n'
    )
    t = pq.read_table(convert([src], s, tmp_path / "out")[0])
    assert t.schema.equals(raw_arrow_schema(s))
    assert t.to_pydict() == {
        "y": [1, 0, 1, 0],
        "d": [None, 3.0, None, 2.5],
        "e": [None, 5, None, -1],
        "c": ["NA", None, None, "x"],
        "s": [None, "unknown", None, "y"],
        "g": [None, ["a", "b"], None, None],  # matching elements dropped; nothing left → missing list
        "h": [None, ["a", "NA"], None, ["(none)"]],  # the schema-wide null_value applies to the whole field only
    }
    bad = tmp_path / "b.csv"
    bad.write_text("1,2,3,a,b,c,d\n0,NA,3,a,b,c,d\n")  # 'NA' is no missing text of d: its null_values replace it
    with pytest.raises(InputError) as e:
        convert([bad], s, tmp_path / "out")
    assert e.value.column == "d" and "line 2" in str(e.value) and "'NA'" in str(e.value)


def test_int64_beyond_range_hints_at_string_ids(tmp_path):
    s = _schema([{"name": "id", "role": "categorical", "dtype": "int64"},
                 {"name": "t", "role": "list", "dtype": "int64", "separator": ";"}])
    src = tmp_path / "a.csv"
    src.write_text("1,2\n18446744073709551615,3\n")
    with pytest.raises(InputError) as e:
        convert([src], s, tmp_path / "out")
    assert e.value.column == "id" and "line 2" in str(e.value) and "dtype string and encoding int" in str(e.value)
    src.write_text("1,2;9223372036854775808\n")
    with pytest.raises(InputError) as e:
        convert([src], s, tmp_path / "out")
    assert e.value.column == "t" and "line 1" in str(e.value) and "dtype string and encoding int" in str(e.value)


def test_list_null_values_on_integer_elements(tmp_path):
    s = _schema([{"name": "t", "role": "list", "dtype": "int64", "separator": ";", "null_values": ["-1", "?"]}])
    src = tmp_path / "l.txt"
    src.write_text("3;-1;5\n-1\n?;-1\n7\n")
    t = pq.read_table(convert([src], s, tmp_path / "out")[0])
    assert t.schema.equals(raw_arrow_schema(s))
    assert t.column("t").to_pylist() == [[3, 5], None, None, [7]]
    src.write_text("3;-1\n4;x\n")
    with pytest.raises(InputError) as e:
        convert([src], s, tmp_path / "out")
    assert e.value.column == "t" and "line 2" in str(e.value) and "'x'" in str(e.value)


def _label_dense_text() -> Schema:
    return _schema([
        {"name": "label", "role": "label", "dtype": "int64"},
        {"name": "a", "role": "dense", "dtype": "int64"},
        {"name": "c", "role": "categorical", "dtype": "string", "encoding": "string"},
    ], delimiter=",", header=False)


@pytest.mark.parametrize("line", [8, 500])
def test_an_unterminated_quote_is_an_error_naming_the_line_it_opened_on(tmp_path, line):
    rows = [f"{i % 2},{i},x{i}" for i in range(500)]
    rows[line - 1] = '1,6,"b'  # the quote runs to the end of the file
    src = tmp_path / "open.csv"
    src.write_text("\n".join(rows) + "\n")
    with pytest.raises(InputError, match=f"open.csv.*line {line}: a quoted field opens on this line") as e:
        convert([src], _label_dense_text(), tmp_path / "out")
    assert e.value.column == "c"
    assert not list((tmp_path / "out").glob("*.parquet"))  # nothing written from the file


def test_a_quoted_field_over_two_lines_is_refused_and_lines_count_past_many_blocks(tmp_path):
    rows = [f"{i % 2},{i},{'y' * 40}{i}" for i in range(60_000)]  # several CSV blocks before the bad line
    rows[50_000] = '1,6,"two\nlines"'
    src = tmp_path / "two.csv"
    src.write_text("\n".join(rows) + "\n")
    with pytest.raises(InputError, match="line 50001: a quoted field opens on this line"):
        convert([src], _label_dense_text(), tmp_path / "out")
    # closed on its own line, a quoted field is one value as before
    rows[50_000] = '1,6,"one, line"'
    src.write_text("\n".join(rows) + "\n")
    convert([src], _label_dense_text(), tmp_path / "out")
    assert _rows(sorted((tmp_path / "out").glob("*.parquet"))).column("c")[50_000].as_py() == "one, line"


# ---------------------------------------------------------------------------------------------------------------------
# append: a new day after the shards a directory holds


def _day(tmp_path: Path, name: str, rows: range) -> Path:
    path = tmp_path / name
    path.write_text("".join(f"{i}\n" for i in rows))
    return path


ONE_INT = [{"name": "x", "role": "dense", "dtype": "int64"}]


def test_append_numbers_new_shards_after_the_held_ones_and_keeps_them(tmp_path: Path) -> None:
    schema, out = _schema(ONE_INT), tmp_path / "raw"
    first = convert([_day(tmp_path, "d0.txt", range(5))], schema, out, rows_per_file=2)
    before = {p.name: p.read_bytes() for p in first}
    added = convert([_day(tmp_path, "d1.txt", range(5, 8))], schema, out, rows_per_file=2, append=True)
    assert [p.name for p in added] == ["part-00003.parquet", "part-00004.parquet"]
    assert {p.name: p.read_bytes() for p in first} == before
    assert [p.name for p in existing_shards(out)] == [f"part-0000{i}.parquet" for i in range(5)]
    assert _rows(existing_shards(out)).column("x").to_pylist() == list(range(8))


def test_append_of_no_rows_writes_one_empty_shard_after_the_others(tmp_path: Path) -> None:
    schema, out = _schema(ONE_INT), tmp_path / "raw"
    convert([_day(tmp_path, "d0.txt", range(3))], schema, out)
    (tmp_path / "empty.txt").write_text("")
    assert [p.name for p in convert([tmp_path / "empty.txt"], schema, out, append=True)] == ["part-00001.parquet"]
    assert pq.read_metadata(out / "part-00001.parquet").num_rows == 0


def test_append_into_a_new_directory_starts_at_zero(tmp_path: Path) -> None:
    paths = convert([_day(tmp_path, "d0.txt", range(3))], _schema(ONE_INT), tmp_path / "new", append=True)
    assert [p.name for p in paths] == ["part-00000.parquet"] and existing_shards(tmp_path / "missing") == []


def test_append_refuses_shards_of_another_schema(tmp_path: Path) -> None:
    out = tmp_path / "raw"
    convert([_day(tmp_path, "d0.txt", range(3))], _schema(ONE_INT), out)
    other = _schema([{"name": "x", "role": "dense", "dtype": "float64"}])
    with pytest.raises(OutputError, match=r"raw: holds part-00000.parquet, which is not a shard of this schema's layout .* appended only "
                                          "beside shards of the same schema"):  # fmt: skip
        convert([_day(tmp_path, "d1.txt", range(3))], other, out, append=True)
    assert [p.name for p in out.iterdir()] == ["part-00000.parquet"]
