"""etl.io.files: shard names, temporary names, atomic writes (no temporary left behind, also on failure),
checksums, the removal of an interrupted writer's temporaries and the refusal of linked directories."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from etl.errors import OutputError
from etl.io import files
from etl.io.files import (
    WRITE_BUFFER_BYTES,
    HashingFile,
    atomic_write_bytes,
    atomic_write_parquet,
    buffered_stream,
    check_no_linked_directories,
    is_shard_name,
    is_temporary,
    remove_temporaries,
    sha256_file,
    shard_index,
    shard_name,
    temporary_path,
)


def test_shard_names() -> None:
    assert [shard_name(i) for i in (0, 1, 99999)] == ["part-00000.parquet", "part-00001.parquet", "part-99999.parquet"]
    assert shard_name(123456) == "part-123456.parquet"
    assert all(is_shard_name(shard_name(i)) for i in (0, 7, 123456))
    for name in ("part-1.parquet", "part-00000.parquet.tmp", "x-00000.parquet", "part-00000.csv", "part-0000a.parquet"):
        assert not is_shard_name(name), name
    assert not is_shard_name(temporary_path(Path(shard_name(0))).name)


def test_shard_index_is_the_inverse_of_shard_name() -> None:
    """One index, one name: a name with an extra leading zero (part-012345) or too few digits names no shard."""
    for i in (0, 9, 99999, 100000, 123456, 10**7):
        assert shard_index(shard_name(i)) == i
    for name in ("part-012345.parquet", "part-0100000.parquet", "part-1234.parquet", "part-\u0661\u0662\u0663\u0664\u0665.parquet"):
        assert not is_shard_name(name), name
        with pytest.raises(ValueError, match="not a shard name"):
            shard_index(name)
    names = [shard_name(i) for i in (100000, 20000, 99999, 100001)]
    assert sorted(names, key=shard_index) == ["part-20000.parquet", "part-99999.parquet", "part-100000.parquet", "part-100001.parquet"]


def test_temporary_path_is_hidden_beside_the_target_and_unique(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "part-00000.parquet"
    names = {temporary_path(target) for _ in range(100)}
    assert len(names) == 100
    for tmp in names:
        assert tmp.parent == target.parent
        assert tmp.name.startswith(".part-00000.parquet.") and is_temporary(tmp.name)
    assert not is_temporary(target.name)


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_atomic_write_bytes(tmp_path: Path) -> None:
    target = tmp_path / "a.json"
    atomic_write_bytes(target, b"one")
    atomic_write_bytes(target, b"two")
    assert target.read_bytes() == b"two"
    assert _names(tmp_path) == ["a.json"]


def test_atomic_write_parquet(tmp_path: Path) -> None:
    table = pa.table({"x": [1, 2, 3]})
    target = tmp_path / "t.parquet"
    atomic_write_parquet(table, target, row_group_size=2)
    assert pq.read_table(target).equals(table)
    assert pq.ParquetFile(target).num_row_groups == 2
    assert _names(tmp_path) == ["t.parquet"]


def _failing_replace(src: Path, dst: Path) -> None:
    raise OSError("rename failed")


def test_failed_writes_leave_no_temporary_and_keep_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a.json").write_bytes(b"old")
    monkeypatch.setattr(files.os, "replace", _failing_replace)
    with pytest.raises(OSError, match="rename failed"):
        atomic_write_bytes(tmp_path / "a.json", b"new")
    with pytest.raises(OSError, match="rename failed"):
        atomic_write_parquet(pa.table({"x": [1]}), tmp_path / "t.parquet")
    monkeypatch.undo()
    with pytest.raises(pa.ArrowException):  # the writer itself fails
        atomic_write_parquet(pa.table({"x": [1]}), tmp_path / "t.parquet", compression="no-such-codec")
    assert _names(tmp_path) == ["a.json"]
    assert (tmp_path / "a.json").read_bytes() == b"old"


def test_hashing_file_digest_is_the_file_checksum(tmp_path: Path) -> None:
    path = tmp_path / "h.parquet"
    table = pa.table({"x": list(range(10_000)), "s": [str(i) for i in range(10_000)]})
    with HashingFile(path) as sink, pq.ParquetWriter(sink, table.schema) as writer:
        writer.write_table(table)
        writer.write_table(table)
    assert sink.closed
    assert sink.hexdigest() == sha256_file(path)
    assert pq.read_table(path).num_rows == 20_000


def test_buffered_stream_writes_the_same_bytes_in_few_large_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a Parquet file of several buffers' worth: the bytes and checksum of an unbuffered write to a path, with one
    # write to the Python file per WRITE_BUFFER_BYTES (plus the rest), where Arrow makes one per page and header
    table = pa.table({f"c{i}": pa.array(range(i, i + 200_000), pa.int64()) for i in range(4)})
    options = {"use_dictionary": False, "write_statistics": False}
    pq.write_table(table, tmp_path / "direct.parquet", row_group_size=50_000, **options)
    sizes: list[int] = []
    real_write = HashingFile.write

    def counted(self: HashingFile, data: bytes) -> int:
        sizes.append(len(data))
        return real_write(self, data)

    monkeypatch.setattr(HashingFile, "write", counted)
    with HashingFile(tmp_path / "buffered.parquet") as sink:
        with buffered_stream(sink) as stream, pq.ParquetWriter(stream, table.schema, **options) as writer:
            writer.write_table(table, row_group_size=50_000)
        assert sink.closed  # closing the stream closed the file
    direct = (tmp_path / "direct.parquet").read_bytes()
    assert (tmp_path / "buffered.parquet").read_bytes() == direct
    assert sink.hexdigest() == sha256_file(tmp_path / "direct.parquet")
    assert len(direct) > 3 * WRITE_BUFFER_BYTES and len(sizes) <= len(direct) // WRITE_BUFFER_BYTES + 1


def test_sha256_file_of_known_bytes(tmp_path: Path) -> None:
    (tmp_path / "e").write_bytes(b"")
    (tmp_path / "abc").write_bytes(b"abc")
    assert sha256_file(tmp_path / "e") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert sha256_file(tmp_path / "abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_remove_temporaries_removes_only_temporaries(tmp_path: Path) -> None:
    keep = ["part-00000.parquet", ".hidden", "notes.tmp", "manifest.json"]
    for name in keep:
        (tmp_path / name).write_bytes(b"x")
    for _ in range(3):
        temporary_path(tmp_path / "part-00000.parquet").write_bytes(b"partial")
    sub = tmp_path / "quarantine"
    sub.mkdir()
    nested = temporary_path(sub / "part-00000.parquet")
    nested.write_bytes(b"partial")
    work = temporary_path(tmp_path / "fit")  # a distributed fit's work directory, left by a killed run
    (work / "counts").mkdir(parents=True)
    (work / "counts" / "000000.parquet").write_bytes(b"spilled")
    remove_temporaries(tmp_path)
    assert _names(tmp_path) == sorted(keep + ["quarantine"])
    assert nested.exists()  # not recursive
    remove_temporaries(sub)
    assert _names(sub) == []
    remove_temporaries(tmp_path / "missing")  # a directory that does not exist: nothing to do


def test_linked_directories_are_refused_at_any_depth_through_real_directories_only(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "deeper").mkdir(parents=True)
    (elsewhere / "deeper" / "x").symlink_to(tmp_path, target_is_directory=True)  # not looked into: behind a link
    out = tmp_path / "out"
    (out / "a" / "b").mkdir(parents=True)
    (out / "a" / "file").write_bytes(b"1")
    (out / "a" / "file-link").symlink_to(elsewhere / "deeper" / "missing-later")  # dangling
    with pytest.raises(OutputError, match=r"file-link: a symbolic link to nothing \(.*missing-later\) inside"):
        check_no_linked_directories(out)
    (out / "a" / "file-link").unlink()
    (elsewhere / "target").write_bytes(b"2")
    (out / "a" / "file-link").symlink_to(elsewhere / "target")  # a link to a file: replaced or removed as a link
    check_no_linked_directories(out)
    (out / "a" / "b" / "dir-link").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(OutputError) as info:
        check_no_linked_directories(out)
    assert str(info.value) == (f"{out / 'a' / 'b' / 'dir-link'}: a symbolic link to the directory {elsewhere} inside {out}: files written or "
                               "removed through it would land outside it; remove the link")  # fmt: skip


def test_the_directory_named_may_itself_be_a_link_or_missing(tmp_path: Path) -> None:
    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "named").symlink_to(tmp_path / "real", target_is_directory=True)
    check_no_linked_directories(tmp_path / "named")
    check_no_linked_directories(tmp_path / "missing")
