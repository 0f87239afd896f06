"""etl.io.documents: a document nested too deeply for its parser is a ValueError (as any malformed document), for
JSON and for a YAML loader that recurses in Python."""

from __future__ import annotations

import json

import pytest
import yaml

from etl.errors import SpecError, YamlError
from etl.io.documents import parse_document, parse_yaml

DEEP = "[" * 100_000 + "]" * 100_000


def test_documents_parse_as_their_parser_parses_them() -> None:
    assert parse_document(b'{"a": [1, {"b": null}]}') == {"a": [1, {"b": None}]}
    assert parse_document("[" * 50 + "]" * 50) == json.loads("[" * 50 + "]" * 50)
    assert parse_document("a: [1, 2]", yaml.safe_load) == {"a": [1, 2]}


@pytest.mark.parametrize("data", [DEEP, DEEP.encode(), '{"a":' * 100_000 + "1" + "}" * 100_000])
def test_json_nested_too_deeply_is_a_value_error(data: str | bytes) -> None:
    with pytest.raises(ValueError, match="nested too deeply to parse"):
        parse_document(data)


def test_yaml_nested_too_deeply_is_a_value_error() -> None:
    """The pure-Python loader (PyYAML without libyaml) recurses once per level."""
    with pytest.raises(ValueError, match="nested too deeply to parse"):
        parse_document(DEEP, lambda text: yaml.load(text, Loader=yaml.SafeLoader))


def test_other_errors_are_those_of_the_parser() -> None:
    with pytest.raises(json.JSONDecodeError):
        parse_document(b"{oops")


# ---------------------------------------------------------------- YAML files: one line naming the file, line and column


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"name: t\nops: [ {op: Clamp\n", "p.yaml:3:1: invalid YAML: did not find expected ',' or '}' (while parsing a flow mapping at 2:8)"),
        (b"name: t\nops: x: y\n", "p.yaml:2:7: invalid YAML: mapping values are not allowed in this context"),
        (b"ops:\n  - a\n - b\n", "p.yaml:3:2: invalid YAML: did not find expected key (while parsing a block mapping at 1:1)"),
        (b"name: \"t\n", "p.yaml:2:1: invalid YAML: found unexpected end of stream (while scanning a quoted scalar at 1:7)"),
        (b"name: t\nops: \x07\n", "p.yaml:2:6: invalid YAML: unacceptable character #x0007: control characters are not allowed"),
        (b"name: t\nx: \xff\xfe\n", "p.yaml:2:4: invalid YAML: not UTF-8 text (byte 0xff)"),
    ],
)
def test_malformed_yaml_is_one_line_naming_file_line_and_column(data: bytes, message: str) -> None:
    with pytest.raises(YamlError) as e:
        parse_yaml(data, "p.yaml")
    assert str(e.value) == message
    assert (e.value.path, e.value.field) == ("p.yaml", "<file>")  # a SpecError as before, with its line and column
    assert f"{e.value.line}:{e.value.column}" == message.split(":", 1)[1].rsplit(": invalid", 1)[0]


def test_yaml_parses_plain_data_only() -> None:
    assert parse_yaml(b"a: [1, x]\nd: 2018-01-01\n", "p.yaml") == {"a": [1, "x"], "d": __import__("datetime").date(2018, 1, 1)}
    with pytest.raises(YamlError, match=r"^p.yaml:1:1: invalid YAML: could not determine a constructor"):
        parse_yaml(b"!!python/object/apply:os.system [echo hi]\n", "p.yaml")


def test_yaml_nested_too_deeply_names_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(YamlError, match=r"^p.yaml:1:1001: invalid YAML: exceeded maximum nesting depth \(while increasing flow level\)$"):
        parse_yaml(DEEP.encode(), "p.yaml")  # libyaml stops at its limit
    monkeypatch.setattr("etl.io.documents._SAFE_LOADER", yaml.SafeLoader)  # the Python loader recurses
    with pytest.raises(SpecError, match=r"^p.yaml: field '<file>': invalid YAML: nested too deeply to parse"):
        parse_yaml(DEEP.encode(), "p.yaml")
