"""Faults around the output directory: planted symlinks at temporary names, concurrent runs, overlapping
input and output, write errors, long values in error messages."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from etl.io import files
from etl.io.files import ExclusiveParquetWriter, HashingFile, atomic_write_bytes, atomic_write_parquet, open_exclusive


def _plant(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Make every temporary name a symlink to a victim file; returns the victim."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")

    def planted(path: Path) -> Path:
        tmp = path.with_name(f".{path.name}.planted.tmp")
        if not tmp.is_symlink():
            tmp.symlink_to(victim)
        return tmp

    monkeypatch.setattr(files, "temporary_path", planted)
    return victim


def test_open_exclusive_refuses_symlink_and_existing(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (tmp_path / "link").symlink_to(victim)
    with pytest.raises(OSError):
        open_exclusive(tmp_path / "link")
    with pytest.raises(FileExistsError):
        open_exclusive(victim)
    assert victim.read_bytes() == b"precious"


@pytest.mark.parametrize("write", [
    lambda p: atomic_write_bytes(p, b"data"),
    lambda p: atomic_write_parquet(pa.table({"a": [1]}), p),
])
def test_atomic_writes_never_write_through_planted_symlink(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write) -> None:
    victim = _plant(monkeypatch, tmp_path)
    with pytest.raises(OSError):
        write(tmp_path / "out")
    assert victim.read_bytes() == b"precious"
    assert not (tmp_path / "out").exists()


def test_hashing_file_and_parquet_writer_refuse_planted_symlink(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    link = tmp_path / ".x.tmp"
    link.symlink_to(victim)
    with pytest.raises(OSError):
        HashingFile(link)
    with pytest.raises(OSError):
        ExclusiveParquetWriter(link, pa.schema([("a", pa.int64())]))
    assert victim.read_bytes() == b"precious"


def test_exclusive_parquet_writer_closes_its_file(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    with ExclusiveParquetWriter(tmp_path / "a.parquet", pa.schema([("a", pa.int64())])) as w:
        w.write_table(pa.table({"a": [1, 2]}))
    assert pq.read_table(tmp_path / "a.parquet").num_rows == 2


def test_convert_never_writes_through_planted_symlink(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from etl.io import text

    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    out = tmp_path / "raw"
    w = text.ShardSetWriter(out, pa.schema([("a", pa.int64())]))
    real = text.temporary_path

    def planted(path: Path) -> Path:
        tmp = real(path)
        tmp.symlink_to(victim)
        return tmp

    monkeypatch.setattr(text, "temporary_path", planted)
    with pytest.raises(OSError):
        w.open(0)
    assert victim.read_bytes() == b"precious"
