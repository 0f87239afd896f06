"""Schema loading and validation: every error is a SpecError naming the file and the bad field."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from etl.errors import SpecError
from etl.schema import ColumnSpec, EventsSpec, LogNormal, Schema, load_schema, parse_schema, schema_to_dict

ROOT = Path(__file__).resolve().parents[2]


def test_load_criteo_schema():
    s = load_schema(ROOT / "schemas" / "criteo.yaml")
    assert s.name == "criteo"
    assert s.names == ["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]
    assert s.by_role("label") == ["label"]
    assert s.by_role("dense") == [f"I{i}" for i in range(1, 14)]
    assert s.by_role("categorical") == [f"C{i}" for i in range(1, 27)]
    assert s.by_role("list") == []
    c1 = s.column("C1")
    assert (c1.dtype, c1.encoding, c1.width, c1.separator, c1.is_list) == ("string", "hex", 8, None, False)
    assert s.column("I5") == ColumnSpec("I5", "dense", "int64")
    assert s.text.delimiter == "\t" and s.text.header is False and s.text.null_value == ""
    with pytest.raises(KeyError):
        s.column("nope")


def test_load_movielens_schema():
    s = load_schema(ROOT / "schemas" / "movielens.yaml")
    assert s.names == ["userId", "movieId", "rating", "timestamp", "genres"]
    g = s.column("genres")
    assert g.is_list and g.encoding == "string" and g.separator == "|" and g.dtype == "string"
    assert s.column("userId").encoding == "int" and s.column("rating").role == "label"
    assert s.text.delimiter == "," and s.text.header is True


@pytest.mark.parametrize("name", ["criteo", "movielens"])
def test_schema_to_dict_round_trip(name):
    s = load_schema(ROOT / "schemas" / f"{name}.yaml")
    s2 = parse_schema(schema_to_dict(s))
    assert s2.columns == s.columns and s2.text == s.text and s2.name == s.name


def test_default_encodings():
    s = parse_schema({"name": "x", "columns": [
        {"name": "a", "role": "categorical", "dtype": "int64"},
        {"name": "b", "role": "categorical", "dtype": "string"},
        {"name": "c", "role": "list", "dtype": "string", "separator": ";"},
    ]})  # fmt: skip
    assert [c.encoding for c in s.columns] == ["int", "string", "string"]


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "schema.yaml"
    p.write_text(text)
    return p


def cols_doc(*cols: dict) -> str:
    return yaml.safe_dump({"name": "t", "columns": [{"name": "label", "role": "label", "dtype": "int64"}, *cols]})


BAD = {
    "unknown role": (dict(name="x", role="feature", dtype="int64"), "columns[1] (x).role", "feature"),
    "unknown dtype": (dict(name="x", role="dense", dtype="int32"), "columns[1] (x).dtype", "int32"),
    "hex on int64": (dict(name="x", role="categorical", dtype="int64", encoding="hex"), "columns[1] (x).encoding", "hex"),
    "unknown encoding": (dict(name="x", role="categorical", dtype="string", encoding="b64"), "columns[1] (x).encoding", "b64"),
    "list without separator": (dict(name="x", role="list", dtype="string"), "columns[1] (x).separator", "separator"),
    "empty separator": (dict(name="x", role="list", dtype="string", separator=""), "columns[1] (x).separator", "separator"),
    "unknown key": (dict(name="x", role="dense", dtype="int64", scale=2), "columns[1].scale", "unknown"),
    "width 0": (dict(name="x", role="categorical", dtype="string", encoding="hex", width=0), "columns[1] (x).width", "1..16"),
    "width 17": (dict(name="x", role="categorical", dtype="string", encoding="hex", width=17), "columns[1] (x).width", "1..16"),
    "width not int": (dict(name="x", role="categorical", dtype="string", encoding="hex", width="8"), "columns[1] (x).width", "1..16"),
    "width on string": (dict(name="x", role="categorical", dtype="string", encoding="string", width=8), "columns[1] (x).width", "hex"),
    "float categorical": (dict(name="x", role="categorical", dtype="float64"), "columns[1] (x).dtype", "float64"),
    "string dense": (dict(name="x", role="dense", dtype="string"), "columns[1] (x).dtype", "int64 or float64"),
    "encoding on dense": (dict(name="x", role="dense", dtype="int64", encoding="int"), "columns[1] (x).encoding", "categorical"),
    "separator on categorical": (dict(name="x", role="categorical", dtype="string", separator="|"), "columns[1] (x).separator", "list"),
    "missing role": (dict(name="x", dtype="int64"), "columns[1] (x).role", "missing"),
    "missing name": (dict(role="dense", dtype="int64"), "columns[1].name", "missing"),
    "empty name": (dict(name="", role="dense", dtype="int64"), "columns[1].name", "non-empty"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_column_names_field(case, tmp_path):
    col, field, word = BAD[case]
    p = write(tmp_path, cols_doc(col))
    with pytest.raises(SpecError) as ei:
        load_schema(p)
    e = ei.value
    assert e.field == field
    assert e.path == str(p)
    msg = str(e)
    assert str(p) in msg and f"field '{field}'" in msg
    assert word in msg


def test_duplicate_names(tmp_path):
    p = write(tmp_path, cols_doc(dict(name="label", role="dense", dtype="int64")))
    with pytest.raises(SpecError) as ei:
        load_schema(p)
    assert ei.value.field == "columns" and "duplicate" in str(ei.value) and "label" in str(ei.value)
    assert str(p) in str(ei.value)


def test_duplicate_names_in_constructor():
    with pytest.raises(SpecError, match="duplicate"):
        Schema("x", (ColumnSpec("a", "dense", "int64"), ColumnSpec("a", "dense", "int64")))


@pytest.mark.parametrize(
    "doc,field",
    [
        ({"name": "t", "columns": [{"name": "a", "role": "dense", "dtype": "int64"}], "version": 3}, "version"),
        ({"name": "t", "columns": [{"name": "a", "role": "dense", "dtype": "int64"}], "text": {"quote": "'"}}, "text.quote"),
        ({"name": "t", "columns": [{"name": "a", "role": "dense", "dtype": "int64"}], "text": {"delimiter": "ab"}}, "text.delimiter"),
        ({"name": "t", "columns": [{"name": "a", "role": "dense", "dtype": "int64"}], "text": {"header": "yes"}}, "text.header"),
        ({"name": "t", "columns": [{"name": "a", "role": "dense", "dtype": "int64"}], "text": [1]}, "text"),
        ({"name": "t", "columns": []}, "columns"),
        ({"name": "t", "columns": {"a": 1}}, "columns"),
        ({"name": "t", "columns": ["a"]}, "columns[0]"),
        ({"columns": [{"name": "a", "role": "dense", "dtype": "int64"}]}, "<root>.name"),
        ({"name": "t"}, "<root>.columns"),
        ([1, 2], "<root>"),
    ],
)
def test_bad_top_level_fields(doc, field, tmp_path):
    p = write(tmp_path, yaml.safe_dump(doc))
    with pytest.raises(SpecError) as ei:
        load_schema(p)
    assert ei.value.field == field
    assert f"field '{field}'" in str(ei.value)


def test_invalid_yaml(tmp_path):
    p = write(tmp_path, "name: t\ncolumns: [ {name: a, role: dense\n")
    with pytest.raises(SpecError) as ei:
        load_schema(p)
    assert ei.value.field == "<file>" and "invalid YAML" in str(ei.value) and str(p) in str(ei.value)


@pytest.mark.parametrize("loader", ["libyaml", "python"])
@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, "".join(" " * i + "a:\n" for i in range(5000))])
def test_yaml_nested_too_deeply_is_invalid_yaml(tmp_path, monkeypatch, loader, text):
    """libyaml stops at its nesting limit; PyYAML's Python loader recurses once per level (RecursionError)."""
    if loader == "python":
        monkeypatch.setattr("etl.io.documents._SAFE_LOADER", yaml.SafeLoader)
    p = write(tmp_path, text)
    with pytest.raises(SpecError, match="invalid YAML") as ei:
        load_schema(p)
    assert ei.value.path == str(p) and ei.value.field == "<file>"


def test_yaml_not_utf8_is_invalid_yaml(tmp_path):
    p = tmp_path / "schema.yaml"
    p.write_bytes(b"name: \xff\xfe\n")
    with pytest.raises(SpecError, match="invalid YAML") as ei:
        load_schema(p)
    assert ei.value.path == str(p)


def test_missing_file(tmp_path):
    p = tmp_path / "nope.yaml"
    with pytest.raises(SpecError) as ei:
        load_schema(p)
    assert ei.value.field == "<file>" and "no such file" in str(ei.value) and str(p) in str(ei.value)


def test_spec_error_is_value_error():
    with pytest.raises(ValueError):
        parse_schema({"name": "t", "columns": [{"name": "a", "role": "x", "dtype": "int64"}]})


def test_string_encoding_on_int64_rejected(tmp_path):
    p = write(tmp_path, cols_doc(dict(name="x", role="categorical", dtype="int64", encoding="string")))
    with pytest.raises(SpecError) as ei:
        load_schema(p)
    assert ei.value.field == "columns[1] (x).encoding"


def test_boolean_width_rejected(tmp_path):
    p = write(tmp_path, cols_doc(dict(name="x", role="categorical", dtype="string", encoding="hex", width=True)))
    with pytest.raises(SpecError) as ei:
        load_schema(p)
    assert ei.value.field == "columns[1] (x).width"


@pytest.mark.parametrize("name", ["../../../escaped_vocab", "a/b", "a\\b", ".hidden", "nul\0byte"])
def test_column_names_that_would_leave_a_directory_are_refused(name: str) -> None:
    doc = {"name": "s", "columns": [{"name": "label", "role": "label", "dtype": "int64"},
                                    {"name": name, "role": "categorical", "dtype": "string", "encoding": "hex"}]}
    with pytest.raises(SpecError, match="column name"):
        parse_schema(doc, "<test>")


# ---------------------------------------------------------------------------------------------------------------------
# roles passthrough and drop, header auto, null_values


def test_drop_and_passthrough_roles():
    s = parse_schema({"name": "t", "text": {"header": "auto"}, "columns": [
        {"name": "id", "role": "passthrough", "dtype": "string"},
        {"name": "comment", "role": "drop"},
        {"name": "y", "role": "label", "dtype": "int64"},
        {"name": "ts", "role": "drop", "dtype": "int64"},
        {"name": "g", "role": "list", "dtype": "string", "separator": "|", "null_values": ["(no genres listed)"]},
    ]})  # fmt: skip
    assert s.names == ["id", "y", "g"]  # the raw layout: no dropped column
    assert s.text_names == ["id", "comment", "y", "ts", "g"]
    assert s.by_role("passthrough") == ["id"] and s.by_role("drop") == []
    assert s.text.header == "auto" and s.column("g").null_values == ("(no genres listed)",)
    with pytest.raises(KeyError):
        s.column("comment")
    again = parse_schema(schema_to_dict(s))
    assert again.columns == s.columns and again.text_names == s.text_names and again.text == s.text


def test_schema_to_dict_leaves_out_unset_fields():
    doc = schema_to_dict(load_schema(ROOT / "schemas" / "criteo.yaml"))
    assert doc["columns"][14] == {"name": "C1", "role": "categorical", "dtype": "string", "encoding": "hex", "width": 8}


NEW_BAD = {
    "encoding on passthrough": (dict(name="x", role="passthrough", dtype="string", encoding="int"), "columns[1] (x).encoding", "only"),
    "passthrough without dtype": (dict(name="x", role="passthrough"), "columns[1] (x).dtype", "missing"),
    "separator on drop": (dict(name="x", role="drop", separator="|"), "columns[1] (x).separator", "dropped"),
    "bad dtype on drop": (dict(name="x", role="drop", dtype="int8"), "columns[1] (x).dtype", "int8"),
    "null_values not a list": (dict(name="x", role="dense", dtype="int64", null_values="NA"), "columns[1] (x).null_values", "list"),
    "null_values not strings": (dict(name="x", role="dense", dtype="int64", null_values=[-1]), "columns[1] (x).null_values", "list"),
    "null_values on drop": (dict(name="x", role="drop", null_values=["NA"]), "columns[1] (x).null_values", "dropped"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(NEW_BAD))
def test_bad_new_fields(case, tmp_path):
    col, field, word = NEW_BAD[case]
    with pytest.raises(SpecError) as ei:
        load_schema(write(tmp_path, cols_doc(col)))
    assert ei.value.field == field and word in str(ei.value)


def test_unknown_fields_point_to_the_schema_docs(tmp_path):
    for doc in (cols_doc(dict(name="x", role="dense", dtype="int64", scale=2)),
                yaml.safe_dump({"name": "t", "version": 1, "columns": [{"name": "a", "role": "dense", "dtype": "int64"}]}),
                yaml.safe_dump({"name": "t", "text": {"quote": "'"}, "columns": [{"name": "a", "role": "dense", "dtype": "int64"}]})):
        with pytest.raises(SpecError, match="schemas/README.md"):
            load_schema(write(tmp_path, doc))


@pytest.mark.parametrize("header", ["yes", 1, None])
def test_header_is_true_false_or_auto(header, tmp_path):
    with pytest.raises(SpecError) as ei:
        parse_schema({"name": "t", "text": {"header": header}, "columns": [{"name": "a", "role": "dense", "dtype": "int64"}]})
    assert ei.value.field == "text.header" and "auto" in str(ei.value)


def test_every_column_dropped_is_refused():
    with pytest.raises(SpecError, match="every column is dropped"):
        parse_schema({"name": "t", "columns": [{"name": "a", "role": "drop"}]})


def test_duplicate_name_of_a_dropped_column():
    with pytest.raises(SpecError, match="duplicate"):
        parse_schema({"name": "t", "columns": [{"name": "a", "role": "drop"}, {"name": "a", "role": "dense", "dtype": "int64"}]})


# ---------------------------------------------------------------------------------------------------------------------
# generate.events: how `etl generate` makes a stream of behaviour events


def events_doc(**events) -> dict:
    cols = [{"name": "u", "role": "categorical", "dtype": "int64"}, {"name": "i", "role": "categorical", "dtype": "string"},
            {"name": "t", "role": "dense", "dtype": "int64"}, {"name": "s", "role": "passthrough", "dtype": "int64"},
            {"name": "y", "role": "label", "dtype": "int64"}, {"name": "x", "role": "dense", "dtype": "float64"}]
    return {"name": "e", "columns": cols, "generate": {"events": {"user": "u", "item": "i", "time": "t", **events}}}


def test_events_schema():
    s = load_schema(ROOT / "schemas" / "events.yaml")
    e = s.events
    assert e is not None and (e.user, e.item, e.time, e.session, e.category) == ("user_id", "item_id", "timestamp", "session_id", "category")
    assert e == EventsSpec("user_id", "item_id", "timestamp", "session_id", "category")  # the file spells out the defaults
    again = parse_schema(schema_to_dict(s))
    assert again.events == s.events and again.columns == s.columns
    assert "generate" not in schema_to_dict(load_schema(ROOT / "schemas" / "movielens.yaml"))
    s = parse_schema(events_doc(users=10, event_gap={"median": 5, "sigma": 0}, item_skew=0.8))
    assert s.events == EventsSpec("u", "i", "t", users=10, event_gap=LogNormal(5.0, 0.0), item_skew=0.8)
    assert s.events.filled == {"user": "u", "item": "i", "time": "t"}


BAD_EVENTS = {
    "unknown field": (dict(shape="zipf"), "generate.events.shape", "unknown"),
    "missing user": (dict(user=None), "generate.events.user", "missing"),
    "not a column": (dict(item="nope"), "generate.events.item", "not a column"),
    "float time": (dict(time="x"), "generate.events.time", "int64 column of role dense or passthrough"),
    "label as item": (dict(item="y"), "generate.events.item", "role categorical"),
    "categorical time": (dict(time="u"), "generate.events.time", "role dense or passthrough"),
    "one column twice": (dict(item="u"), "generate.events", "different"),
    "users 0": (dict(users=0), "generate.events.users", "integer in [1"),
    "users float": (dict(users=2.5), "generate.events.users", "integer"),
    "ties above 1": (dict(ties=1.5), "generate.events.ties", "[0.0, 1.0]"),
    "late bool": (dict(late=True), "generate.events.late", "number"),
    "skew 1": (dict(item_skew=1), "generate.events.item_skew", "0.99 or 1.01"),
    "skew 0": (dict(item_skew=0), "generate.events.item_skew", "(0.0"),
    "session_events below 1": (dict(session_events=0.5), "generate.events.session_events", "[1.0"),
    "gap without sigma": (dict(event_gap={"median": 3}), "generate.events.event_gap", "median"),
    "gap median 0": (dict(session_gap={"median": 0, "sigma": 1}), "generate.events.session_gap.median", "(0.0"),
    "gap sigma nan": (dict(session_gap={"median": 9, "sigma": float("nan")}), "generate.events.session_gap.sigma", "number"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD_EVENTS))
def test_bad_events_fields(case):
    events, field, word = BAD_EVENTS[case]
    with pytest.raises(SpecError) as ei:
        parse_schema(events_doc(**events), "<test>")
    assert ei.value.field == field and word in str(ei.value)


@pytest.mark.parametrize("generate", [{"rows": {}}, [], {"events": {}, "rows": {}}])
def test_generate_has_one_kind(generate):
    doc = events_doc()
    doc["generate"] = generate
    with pytest.raises(SpecError) as ei:
        parse_schema(doc, "<test>")
    assert ei.value.field in ("generate", "generate.events.user")


def test_a_time_unit_on_int64_columns():
    cols = [{"name": "ts", "role": "passthrough", "dtype": "int64", "unit": "ms"}, {"name": "x", "role": "dense", "dtype": "int64"}]
    s = parse_schema({"name": "t", "columns": cols})
    assert (s.column("ts").unit, s.column("x").unit) == ("ms", None)
    assert parse_schema(schema_to_dict(s)) == replace(s, path="<memory>") and "unit" not in schema_to_dict(s)["columns"][1]
    for bad, problem in (({"dtype": "float64"}, "for a float64 passthrough column"), ({"unit": "min"}, "got 'min'"),
                         ({"role": "list", "separator": "|"}, "for a int64 list column")):  # fmt: skip
        with pytest.raises(SpecError, match=rf"columns\[0\] \(ts\)\.unit.*{problem}"):
            parse_schema({"name": "t", "columns": [{**cols[0], **bad}]})
