"""The producer manifest (``_arrivals.json``): its format, each rule a listing must keep, and its growth."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from etl.errors import ConfigError, InputError
from etl.io.arrivals_manifest import ARRIVALS, arrived_since, read_arrivals, write_arrivals


def touch(d: Path, *names: str) -> None:
    for name in names:
        (d / name).write_bytes(b"")


def put(d: Path, doc: object) -> None:
    (d / ARRIVALS).write_text(json.dumps(doc))


def listing(*names: object) -> dict:
    return {"format": "etl-arrivals", "version": 1, "shards": list(names)}


def test_write_then_read_lists_the_shards_in_order_atomically(tmp_path: Path) -> None:
    assert read_arrivals(tmp_path) is None  # not written yet
    write_arrivals(tmp_path, ["b.parquet", "a.parquet"])
    assert json.loads((tmp_path / ARRIVALS).read_text()) == listing("b.parquet", "a.parquet")
    write_arrivals(tmp_path, ["b.parquet", "a.parquet", "c.parquet"])
    assert read_arrivals(tmp_path) == ["b.parquet", "a.parquet", "c.parquet"]
    assert [p.name for p in tmp_path.iterdir()] == [ARRIVALS]  # no temporary left behind


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ('{"format": "etl-arrivals", "version": 1, "shards": [', "not a JSON producer manifest"),
        ("[]", "expected an object, got list"),
        ("[" * 100_000 + "]" * 100_000, "not a JSON producer manifest: nested too deeply"),
        (json.dumps(listing() | {"format": "other"}), "format 'other' version 1, expected format 'etl-arrivals' version 1"),
        (json.dumps(listing() | {"version": 2}), "version 2, expected"),
        (json.dumps(listing() | {"producer": "x"}), "has the keys"),
        (json.dumps({"format": "etl-arrivals", "version": 1}), "has the keys"),
        (json.dumps(listing() | {"shards": "a.parquet"}), "'shards' must be a list"),
    ],
)
def test_a_malformed_manifest_is_an_error_naming_it(tmp_path: Path, content: str, problem: str) -> None:
    (tmp_path / ARRIVALS).write_text(content)
    with pytest.raises(InputError, match=rf"^{tmp_path / ARRIVALS}: .*{problem}") as e:
        read_arrivals(tmp_path)
    assert e.value.path == str(tmp_path / ARRIVALS)


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("sub/a.parquet", "not a plain file name"),
        ("../a.parquet", "not a plain file name"),
        ("/abs/a.parquet", "not a plain file name"),
        ("..", "not a plain file name"),
        (".a.parquet", "not a plain file name"),
        (".a.parquet.1-ab.tmp", "not a plain file name"),
        ("a\\b.parquet", "not a plain file name"),
        ("a.csv", "ends in .parquet"),
        ("", "ends in .parquet"),
        (7, "is a string, not int"),
    ],
)
def test_an_entry_that_is_not_a_shard_of_the_directory_is_an_error_naming_it(tmp_path: Path, name: object, problem: str) -> None:
    put(tmp_path, listing("ok.parquet", name))
    with pytest.raises(InputError, match=rf"shards\[1\] = {json.dumps(name) if isinstance(name, int) else ''}.*{problem}"):
        read_arrivals(tmp_path)
    if isinstance(name, str):
        with pytest.raises(ConfigError, match=problem):
            write_arrivals(tmp_path, [name])


def test_a_shard_listed_twice_is_an_error(tmp_path: Path) -> None:
    put(tmp_path, listing("a.parquet", "b.parquet", "a.parquet"))
    with pytest.raises(InputError, match=r"shards\[2\] = 'a.parquet': listed twice"):
        read_arrivals(tmp_path)
    with pytest.raises(ConfigError, match="listed twice"):
        write_arrivals(tmp_path, ["a.parquet", "a.parquet"])


def test_arrived_since_returns_what_the_listing_appended(tmp_path: Path) -> None:
    assert arrived_since(tmp_path, []) == []  # the producer has not written the manifest yet
    touch(tmp_path, "b.parquet", "a.parquet", "c.parquet")
    write_arrivals(tmp_path, ["b.parquet"])
    assert arrived_since(tmp_path, []) == ["b.parquet"]
    assert arrived_since(tmp_path, ["b.parquet"]) == []
    write_arrivals(tmp_path, ["b.parquet", "a.parquet", "c.parquet"])
    assert arrived_since(tmp_path, ["b.parquet"]) == ["a.parquet", "c.parquet"]


def test_a_listing_that_does_not_extend_the_one_before_is_an_error(tmp_path: Path) -> None:
    touch(tmp_path, "a.parquet", "b.parquet", "c.parquet")
    write_arrivals(tmp_path, ["a.parquet", "c.parquet", "b.parquet"])
    with pytest.raises(InputError, match=r"shards\[1\] is now 'c.parquet', and was 'b.parquet': a listing may only grow at its end"):
        arrived_since(tmp_path, ["a.parquet", "b.parquet"])  # reordered
    write_arrivals(tmp_path, ["a.parquet"])
    with pytest.raises(InputError, match=r"lists 1 shard\(s\), fewer than the 2 it listed before: 'b.parquet'"):
        arrived_since(tmp_path, ["a.parquet", "b.parquet"])  # removed at the end
    (tmp_path / ARRIVALS).unlink()
    with pytest.raises(InputError, match="disappeared after listing 1 shard"):
        arrived_since(tmp_path, ["a.parquet"])


def test_a_listed_shard_that_is_not_a_file_is_an_error_naming_it(tmp_path: Path) -> None:
    touch(tmp_path, "a.parquet")
    (tmp_path / "d.parquet").mkdir()
    write_arrivals(tmp_path, ["a.parquet", "b.parquet"])
    with pytest.raises(InputError, match=rf"{ARRIVALS}: shards\[1\] = 'b.parquet': listed, but .*b.parquet is not a file"):
        arrived_since(tmp_path, ["a.parquet"])
    write_arrivals(tmp_path, ["a.parquet", "d.parquet"])
    with pytest.raises(InputError, match=r"shards\[1\] = 'd.parquet'"):
        arrived_since(tmp_path, [])
