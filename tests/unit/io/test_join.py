"""etl.io.join: a side table left-joined onto every converted row."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from etl.errors import ConfigError, InputError
from etl.io.join import SideTable
from etl.io.text import convert
from etl.schema import Schema, parse_schema


def schema(header: bool = True, null_value: str = "") -> Schema:
    return parse_schema({"name": "t", "text": {"delimiter": ",", "header": header, "null_value": null_value}, "columns": [
        {"name": "user", "role": "categorical", "dtype": "int64"},
        {"name": "item", "role": "categorical", "dtype": "int64"},
        {"name": "rating", "role": "label", "dtype": "float64"},
        {"name": "genres", "role": "list", "dtype": "string", "separator": "|"},
        {"name": "year", "role": "dense", "dtype": "int64"},
    ]})  # fmt: skip


ITEMS = "item,title,genres,year\n10,A,x|y,1999\n20,B,,2001\n30,C,z,NA\n"
RATINGS = [(1, 10, 4.0), (2, 30, 3.5), (1, 99, 1.0), (3, None, 2.0), (2, 20, 5.0), (1, 10, 0.5)]


def reference(items_text: str, null: str) -> list[dict]:
    """A plain-Python left join: every rating row, in order, with the item's columns or None."""
    lines = [ln.split(",") for ln in items_text.strip().split("\n")[1:]]
    items = {int(r[0]): {"genres": r[2].split("|") if r[2] not in ("", null) else None,
                         "year": int(r[3]) if r[3] not in ("", null) else None} for r in lines}  # fmt: skip
    empty = {"genres": None, "year": None}
    return [{"user": u, "item": i, "rating": r, **items.get(i, empty)} for u, i, r in RATINGS]  # type: ignore[arg-type]


def write(tmp_path: Path, header: bool = True) -> tuple[Path, Path]:
    """ratings.csv (with a header: in another column order than the schema's) and items.csv."""
    ratings = tmp_path / "ratings.csv"
    cell = lambda i: "" if i is None else str(i)  # noqa: E731
    if header:
        ratings.write_text("item,rating,user\n" + "".join(f"{cell(i)},{r},{u}\n" for u, i, r in RATINGS))
    else:
        ratings.write_text("".join(f"{u},{cell(i)},{r}\n" for u, i, r in RATINGS))
    items = tmp_path / "items.csv"
    items.write_text(ITEMS)
    return ratings, items


@pytest.mark.parametrize("header", [True, False])
def test_left_join_matches_a_plain_python_join(tmp_path, header):
    ratings, items = write(tmp_path, header)
    s = schema(header, "NA")
    side = SideTable.read(items, "item", s)
    assert side.columns == ["genres", "year"] and side.input_schema.names == ["user", "item", "rating"]
    shards = convert([ratings], s, tmp_path / "raw", rows_per_file=4, side=side)
    table = pq.read_table(shards)
    assert table.schema.names == s.names and len(shards) == 2
    assert table.to_pylist() == reference(ITEMS, "NA")


def test_side_table_errors(tmp_path):
    _, items = write(tmp_path)
    s = schema()
    dup = tmp_path / "dup.csv"
    dup.write_text("item,genres\n10,x\n20,y\n10,z\n")
    with pytest.raises(InputError, match=r"dup.csv, column 'item': key 10 appears on lines 2 and 4"):
        SideTable.read(dup, "item", s)
    missing = tmp_path / "missing.csv"
    missing.write_text("item,genres\n10,x\n,y\n")
    with pytest.raises(InputError, match=r"missing.csv, column 'item': line 3: the key is missing"):
        SideTable.read(missing, "item", s)
    bad = tmp_path / "bad.csv"
    bad.write_text("item,year\n10,1999\n20,soon\n")
    with pytest.raises(InputError, match=r"bad.csv, column 'year': line 3: cannot convert to int64"):
        SideTable.read(bad, "item", s)
    unrelated = tmp_path / "unrelated.csv"
    unrelated.write_text("item,title\n10,A\n")
    with pytest.raises(InputError, match=r"unrelated.csv: a side table's header names the key and schema columns"):
        SideTable.read(unrelated, "item", s)
    nokey = tmp_path / "nokey.csv"
    nokey.write_text("id,genres\n10,x\n")
    with pytest.raises(InputError, match=r"nokey.csv, column 'item': the header lacks column\(s\) \['item'\]"):
        SideTable.read(nokey, "item", s)
    with pytest.raises(ConfigError, match="--on title: the schema .* has no column 'title'"):
        SideTable.read(items, "title", s)
    with pytest.raises(ConfigError, match="a list column cannot be a join key"):
        SideTable.read(items, "genres", s)
    with pytest.raises(InputError, match="nope.csv: no such file"):
        SideTable.read(tmp_path / "nope.csv", "item", s)
    with pytest.raises(InputError, match=r"items.csv, column 'year': line 4: cannot convert to int64: invalid value 'NA'"):
        SideTable.read(items, "item", s)  # the side table is read with the schema's null value


def test_an_input_naming_a_side_column_too_is_refused(tmp_path):
    _, items = write(tmp_path)
    both = tmp_path / "both.csv"
    both.write_text("user,item,rating,year\n1,10,4.0,2000\n")
    s = schema(null_value="NA")
    with pytest.raises(InputError, match=r"both.csv, column 'year': column\(s\) \['year'\] are both here and in the side table"):
        convert([both], s, tmp_path / "raw", side=SideTable.read(items, "item", s))
    assert not (tmp_path / "raw").exists()
