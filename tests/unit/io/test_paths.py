"""etl.io.paths.expand_globs: patterns expanded in name order, in place among the other items; literal names kept;
a pattern that matches nothing is an InputError naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from etl.errors import InputError
from etl.io.parquet import list_shards
from etl.io.paths import expand_globs


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for name in ("b.parquet", "a.parquet", "c.txt", "sub/d.parquet", "sub/deeper/e.parquet", "odd[1].parquet"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    return tmp_path


def test_patterns_expand_in_name_order_among_the_other_items(tree: Path) -> None:
    got = expand_globs([tree / "c.txt", f"{tree}/*.parquet", tree / "sub"])
    assert got == [tree / "c.txt", tree / "a.parquet", tree / "b.parquet", tree / "odd[1].parquet", tree / "sub"]


def test_double_star_spans_directories(tree: Path) -> None:
    got = expand_globs([f"{tree}/**/*.parquet"])
    expected = sorted(str(p) for p in tree.rglob("*.parquet"))
    assert [str(p) for p in got] == expected and len(got) == 5


def test_an_existing_name_with_pattern_characters_is_kept_as_named(tree: Path) -> None:
    assert expand_globs([tree / "odd[1].parquet"]) == [tree / "odd[1].parquet"]  # as a pattern it would match 'odd1'


def test_plain_names_pass_through_even_when_missing(tree: Path) -> None:
    assert expand_globs([tree / "missing.parquet", "x"]) == [tree / "missing.parquet", Path("x")]


def test_a_pattern_matching_nothing_is_an_input_error(tree: Path) -> None:
    with pytest.raises(InputError, match=r"nothing\*\.parquet: no file or directory matches this pattern"):
        expand_globs([tree / "a.parquet", f"{tree}/nothing*.parquet"])


def test_list_shards_expands_patterns_too(tree: Path) -> None:
    # the pattern matches a file and a directory, which is expanded to its shards
    assert list_shards(f"{tree}/sub/*") == [tree / "sub" / "d.parquet", tree / "sub" / "deeper" / "e.parquet"]
