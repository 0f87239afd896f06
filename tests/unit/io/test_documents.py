"""etl.io.documents: a document nested too deeply for its parser is a ValueError (as any malformed document), for
JSON and for a YAML loader that recurses in Python."""

from __future__ import annotations

import json

import pytest
import yaml

from etl.io.documents import parse_document

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
