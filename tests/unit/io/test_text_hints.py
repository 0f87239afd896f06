"""etl.io.text_hints: text split at another delimiter than the schema's, and text given where Parquet shards are
expected, each told with what to do (through ``etl.io.text.convert`` and ``etl.io.parquet``'s readers too)."""

from __future__ import annotations

import bz2
import gzip
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from etl.errors import InputError
from etl.io.parquet import list_shards, open_shard, read_footer
from etl.io.text import convert
from etl.io.text_hints import convert_hint, delimiter_hint, is_text, line_text
from etl.schema import Schema, load_schema, parse_schema
from tests.conftest import REPO

ROW = ["0", "1", "", "5"] + [str(i) for i in range(9)] + ["7"] + ["68fd1e64"] * 26  # one Criteo line: 40 fields


@pytest.fixture(scope="module")
def criteo() -> Schema:
    return load_schema(REPO / "schemas/criteo.yaml")


@pytest.mark.parametrize("delimiter, word, yaml", [(",", "comma", '","'), (";", "semicolon", '";"'), ("|", "pipe", '"|"')])
def test_a_line_split_at_another_delimiter_names_it(criteo: Schema, tmp_path: Path, delimiter: str, word: str, yaml: str) -> None:
    path = tmp_path / "day.csv"
    path.write_text((delimiter.join(ROW) + "\n") * 3)
    with pytest.raises(InputError) as e:
        convert([path], criteo, tmp_path / "out")
    message = str(e.value)
    assert "line 1: wrong number of fields: expected 40, got 1" in message
    assert (f"the line looks {word}-separated, and the schema {criteo.path} says tab-separated: set text: {{delimiter: {yaml}}} in "
            f"a copy of the schema, or guess one with: etl schema infer {path}") in message  # fmt: skip


def test_a_long_line_cut_short_by_the_reader_is_read_whole(criteo: Schema, tmp_path: Path) -> None:
    path = tmp_path / "day.csv.gz"
    path.write_bytes(gzip.compress((",".join(ROW[:14] + ["0123456789abcdef" * 4] * 26) + "\n").encode()))
    with pytest.raises(InputError, match="the line looks comma-separated"):
        convert([path], criteo, tmp_path / "out")


def test_a_header_at_another_delimiter_names_it(tmp_path: Path) -> None:
    schema = parse_schema({"name": "t", "text": {"header": True}, "columns": [{"name": n, "role": "dense", "dtype": "int64"} for n in "abc"]})
    path = tmp_path / "t.tsv"
    path.write_text("a\tb\tc\n1\t2\t3\n")
    with pytest.raises(InputError, match=r"the header lacks column.*the line looks tab-separated, .* says comma-separated: "
                                         r"set text: \{delimiter: \"\\t\"\}"):  # fmt: skip
        convert([path], schema, tmp_path / "out")


def test_a_line_of_another_field_count_gets_no_delimiter_hint(criteo: Schema, tmp_path: Path) -> None:
    path = tmp_path / "day.tsv"
    path.write_text("\t".join(ROW) + "\n" + "\t".join(ROW[:39]) + ",x\n")  # line 2: 39 tab-separated fields, 2 at commas
    with pytest.raises(InputError) as e:
        convert([path], criteo, tmp_path / "out")
    assert "line 2: wrong number of fields: expected 40, got 39" in str(e.value) and "looks" not in str(e.value)
    assert delimiter_hint(path, criteo, lambda fields: len(fields) == 40, "a,b") == ""


def test_line_text(tmp_path: Path) -> None:
    path = tmp_path / "t.csv.bz2"
    path.write_bytes(bz2.compress(b"one\ntwo\r\nthree"))
    assert [line_text(path, n) for n in (0, 1, 2, 3, 4)] == [None, "one", "two", "three", None]
    assert line_text(tmp_path / "missing.csv", 1) is None


def test_is_text(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("x,y\n1,2\n")
    (tmp_path / "a.csv.gz").write_bytes(gzip.compress(b"x\ty\n1\t2\n"))
    (tmp_path / "utf8.txt").write_text("a,b" + "é" * (1 << 20))  # the head read ends inside an é: still text
    (tmp_path / "binary.bin").write_bytes(bytes(range(256)))
    (tmp_path / "empty.csv").write_bytes(b"")
    pq.write_table(pa.table({"x": [1]}), tmp_path / "t.csv")  # Parquet, whatever its name
    got = {name: is_text(tmp_path / name) for name in ("a.csv", "a.csv.gz", "utf8.txt", "binary.bin", "empty.csv", "t.csv", "missing")}
    assert got == {"a.csv": True, "a.csv.gz": True, "utf8.txt": True, "binary.bin": False, "empty.csv": False, "t.csv": False,
                   "missing": False}  # fmt: skip


def test_convert_hint_shows_the_command(tmp_path: Path) -> None:
    text = tmp_path / "day_0.csv.gz"
    text.write_bytes(gzip.compress(b"1,2\n"))
    assert convert_hint(text, "criteo") == (f"delimited text, not Parquet shards: convert it first, then read the shards it writes: "
                                            f"etl convert {text} --schema criteo --out {tmp_path / 'day_0_raw'}")  # fmt: skip
    days = tmp_path / "days"
    days.mkdir()
    for name in ("README.txt", "d1.tsv", "d0.tsv", ".hidden.tsv"):
        (days / name).write_text("a\tb\n")
    assert convert_hint(days) == ("a directory of delimited text (2 *.tsv file(s): d0.tsv, d1.tsv), not Parquet shards: convert it "
                                  f"first, then read the shards it writes: etl convert '{days}/*.tsv' --schema SCHEMA "
                                  f"--out {tmp_path / 'days_raw'}")  # fmt: skip


def test_convert_hint_is_none_for_parquet_and_anything_else(tmp_path: Path) -> None:
    (tmp_path / "raw").mkdir()
    pq.write_table(pa.table({"x": [1]}), tmp_path / "raw/part-00000.parquet")
    (tmp_path / "raw/notes.csv").write_text("a,b\n")
    (tmp_path / "binary").write_bytes(b"\0\1\2")
    (tmp_path / "empty").mkdir()
    (tmp_path / "x.parquet").write_text("a,b\n")  # named Parquet: its reader says what is wrong
    for path in ("raw", "raw/part-00000.parquet", "binary", "empty", "x.parquet", "missing.csv"):
        assert convert_hint(tmp_path / path) is None, path


def test_parquet_readers_say_text_is_text(tmp_path: Path, criteo: Schema) -> None:
    (tmp_path / "days").mkdir()
    (tmp_path / "days/d0.csv").write_text("1,2\n")
    with pytest.raises(InputError, match=r"days: a directory of delimited text \(1 \*.csv file\(s\): d0.csv\), .*etl convert"):
        list_shards(tmp_path / "days")
    for read in (read_footer, lambda p: open_shard(p, criteo)):
        with pytest.raises(InputError, match=r"d0.csv: delimited text, not Parquet shards: .* --schema SCHEMA"):
            read(tmp_path / "days/d0.csv")
    (tmp_path / "broken.bin").write_bytes(b"\0PAR1")
    with pytest.raises(InputError, match="not a readable Parquet file"):
        read_footer(tmp_path / "broken.bin")
