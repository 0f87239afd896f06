"""Arrivals: the complete shards of a followed directory, in name order or a producer manifest's order, once each."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from etl.errors import ConfigError, InputError
from etl.io.arrivals import PROCESSED, Arrivals, CountedFiles
from etl.io.arrivals_manifest import ARRIVALS, write_arrivals
from etl.io.processed import Manifest, read_manifest, write_manifest
from etl.pipeline import Pipeline
from etl.preprocess import preprocess


def touch(d: Path, *names: str) -> None:
    for name in names:
        (d / name).write_bytes(b"")


def test_poll_returns_new_complete_shards_in_name_order_once(tmp_path: Path) -> None:
    touch(tmp_path, "b.parquet", "a.parquet", ".c.parquet.1-ab.tmp", "notes.txt")
    (tmp_path / "d.parquet").mkdir()  # a directory is not a shard
    arrivals = Arrivals(tmp_path)
    assert [p.name for p in arrivals.poll()] == ["a.parquet", "b.parquet"]
    assert arrivals.poll() == []
    (tmp_path / ".c.parquet.1-ab.tmp").rename(tmp_path / "c.parquet")  # complete once renamed
    assert [p.name for p in arrivals.poll()] == ["c.parquet"]
    assert arrivals.names == ["a.parquet", "b.parquet", "c.parquet"]


def test_a_shard_arriving_out_of_name_order_is_an_error_naming_it(tmp_path: Path) -> None:
    touch(tmp_path, "part-00002.parquet")
    arrivals = Arrivals(tmp_path)
    arrivals.poll()
    touch(tmp_path, "part-00001.parquet")
    with pytest.raises(InputError, match=r"part-00001\.parquet.*arrived after part-00002\.parquet"):
        arrivals.poll()


def test_shard_names_arrive_in_index_order_past_part_99999(tmp_path: Path) -> None:
    """Shards named as ``etl.io.files.shard_name`` names them arrive in index order, the order ``list_shards`` (and
    so ``etl preprocess``) takes them in: part-100000.parquet after part-99999.parquet, not an error."""
    touch(tmp_path, "part-100000.parquet", "part-09999.parquet", "part-99999.parquet")
    arrivals = Arrivals(tmp_path)
    assert [p.name for p in arrivals.poll()] == ["part-09999.parquet", "part-99999.parquet", "part-100000.parquet"]
    touch(tmp_path, "part-100001.parquet")
    assert [p.name for p in arrivals.poll()] == ["part-100001.parquet"]
    touch(tmp_path, "part-99998.parquet")
    with pytest.raises(InputError, match=r"part-99998\.parquet.*arrived after part-100001\.parquet"):
        arrivals.poll()


def test_check_before_finds_the_saved_shard_at_its_place(tmp_path: Path) -> None:
    touch(tmp_path, "a.parquet", "b.parquet")
    arrivals = Arrivals(tmp_path)
    arrivals.poll()
    arrivals.check_before(1, "b.parquet")
    with pytest.raises(InputError, match="shard 0"):
        arrivals.check_before(0, "b.parquet")  # a shard before it appeared while the consumer was stopped
    with pytest.raises(InputError, match="nothing there"):
        arrivals.check_before(2, "c.parquet")  # removed
    with pytest.raises(InputError, match="missing shard"):
        arrivals.check_before(1, None)


def test_check_before_an_empty_start(tmp_path: Path) -> None:
    Arrivals(tmp_path).check_before(0, None)


def test_manifest_order_is_the_listing_order_and_only_listed_shards_count(tmp_path: Path) -> None:
    arrivals = Arrivals(tmp_path, "manifest")
    touch(tmp_path, "c.parquet", "a.parquet")
    assert arrivals.poll() == []  # no manifest yet: nothing has arrived
    write_arrivals(tmp_path, ["c.parquet"])
    assert [p.name for p in arrivals.poll()] == ["c.parquet"]  # a.parquet is not listed: not complete
    touch(tmp_path, "b.parquet")
    write_arrivals(tmp_path, ["c.parquet", "a.parquet", "b.parquet"])
    assert [p.name for p in arrivals.poll()] == ["a.parquet", "b.parquet"]
    assert arrivals.poll() == []
    arrivals.check_before(1, "a.parquet")
    with pytest.raises(InputError, match="shard 2 \\(from 0\\) in the producer manifest's order"):
        arrivals.check_before(2, "a.parquet")
    write_arrivals(tmp_path, ["c.parquet", "b.parquet"])
    with pytest.raises(InputError, match=ARRIVALS):
        arrivals.poll()


def test_name_order_refuses_a_directory_with_a_producer_manifest_or_a_processed_output(tmp_path: Path) -> None:
    touch(tmp_path, "a.parquet")
    write_arrivals(tmp_path, ["a.parquet"])
    with pytest.raises(InputError, match=f"{ARRIVALS}: a producer manifest lists this directory's shards.*arrivals='manifest'"):
        Arrivals(tmp_path).poll()
    (tmp_path / ARRIVALS).unlink()
    arrivals = Arrivals(tmp_path)
    arrivals.poll()
    write_manifest(tmp_path, Manifest.of("s", [], complete=False))  # etl preprocess --follow starts writing here
    assert arrivals.poll() == []
    touch(tmp_path, "part-00000.parquet")
    with pytest.raises(InputError, match="manifest.json: this directory is the output of etl preprocess, not raw shards"):
        arrivals.poll()


def test_manifest_order_refuses_a_processed_output_rather_than_wait_for_ever(tmp_path: Path) -> None:
    """A loader started in manifest order on the directory of etl preprocess --follow before its manifest.json:
    the producer manifest would never come, so the output's manifest is an error naming it, not an endless wait."""
    arrivals = Arrivals(tmp_path, "manifest")
    assert arrivals.poll() == []
    write_manifest(tmp_path, Manifest.of("s", [], complete=False))
    with pytest.raises(InputError, match="manifest.json: this directory is the output of etl preprocess, not raw shards"):
        arrivals.poll()


def test_an_unknown_order_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="arrivals must be one of 'names', 'manifest', got 'mtime'"):
        Arrivals(tmp_path, "mtime")


def test_processed_order_counts_each_output_file_once_it_and_those_before_it_are_committed(tmp_path: Path) -> None:
    raw, out = tmp_path / "raw", tmp_path / "out"
    raw.mkdir()
    for i in range(3):
        pq.write_table(pa.table({"label": [0] * (i + 2), "rid": list(range(i + 2))}), raw / f"s{i}.parquet")
    (tmp_path / "schema.yaml").write_text("name: s\ncolumns:\n  - {name: label, role: label, dtype: int64}\n"
                                          "  - {name: rid, role: dense, dtype: int64}\n")  # fmt: skip
    (tmp_path / "pipeline.yaml").write_text("name: s\nschema: schema.yaml\nops:\n  - {op: FillMissing, columns: [rid], value: 0}\n")
    preprocess(Pipeline.from_file(tmp_path / "pipeline.yaml"), sorted(raw.iterdir()), out)
    whole = read_manifest(out)
    part = whole.files
    write_manifest(out, Manifest.of("s", [part[0], part[2]], complete=False))  # part 1 not committed yet
    arrivals = Arrivals(out, PROCESSED)
    assert [p.name for p in arrivals.poll()] == ["part-00000.parquet"]
    write_manifest(out, whole)
    assert [p.name for p in arrivals.poll()] == ["part-00001.parquet", "part-00002.parquet"]
    write_manifest(out, Manifest.of("s", [replace(part[0], sha256="0" * 64), *part[1:]], complete=True))
    with pytest.raises(InputError, match="part-00000.parquet: its rows were counted, and it is now rewritten"):
        arrivals.poll()
    write_manifest(out, Manifest.of("s", part[1:], complete=False))
    with pytest.raises(InputError, match="part-00000.parquet: its rows were counted, and it is now gone"):
        arrivals.poll()


def test_processed_order_records_the_entries_it_counts_and_refuses_a_rewrite_of_those_an_earlier_pass_counted(tmp_path: Path) -> None:
    raw, out = tmp_path / "raw", tmp_path / "out"
    raw.mkdir()
    pq.write_table(pa.table({"label": [0, 0], "rid": [1, 2]}), raw / "s0.parquet")
    (tmp_path / "schema.yaml").write_text("name: s\ncolumns:\n  - {name: label, role: label, dtype: int64}\n"
                                          "  - {name: rid, role: dense, dtype: int64}\n")  # fmt: skip
    (tmp_path / "pipeline.yaml").write_text("name: s\nschema: schema.yaml\nops:\n  - {op: FillMissing, columns: [rid], value: 0}\n")
    preprocess(Pipeline.from_file(tmp_path / "pipeline.yaml"), [raw / "s0.parquet"], out)
    whole = read_manifest(out)
    counted = CountedFiles()
    assert [p.name for p in Arrivals(out, PROCESSED, counted=counted).poll()] == ["part-00000.parquet"]
    assert counted.entry("part-00000.parquet") == whole.files[0] and counted.entry("part-00001.parquet") is None
    write_manifest(out, Manifest.of("s", [replace(whole.files[0], sha256="0" * 64)], complete=True))
    with pytest.raises(InputError, match="part-00000.parquet: its rows were counted, and it is now rewritten"):
        Arrivals(out, PROCESSED, counted=counted).poll()  # a later pass of the same loader
    assert counted.entry("part-00000.parquet") == whole.files[0]
