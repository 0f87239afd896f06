"""Faults around the output directory: planted symlinks at temporary names, concurrent runs, overlapping
input and output, write errors, long values in error messages."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

from etl.errors import EtlError, OutputError
from etl.io import files
from etl.io.files import ExclusiveParquetWriter, HashingFile, atomic_write_bytes, atomic_write_parquet, open_exclusive
from etl.io.lock import LOCK_NAME, locked
from etl.schema import load_schema
from tests.conftest import REPO, criteo_shards


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


# --- the output directory's lock ---------------------------------------------------------------------------------

def _run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "etl", *args], capture_output=True, text=True, cwd=REPO, timeout=120)


@pytest.fixture
def raw(tmp_path: Path) -> Path:
    from etl.tools.synth import generate

    generate(load_schema(REPO / "schemas" / "movielens.yaml"), rows=2000, files=2, out_dir=tmp_path / "raw")
    return tmp_path / "raw"


def _preprocess_args(raw: Path, out: Path) -> list[str]:
    return ["preprocess", "--pipeline", str(REPO / "pipelines" / "movielens.yaml"), "--input", str(raw), "--out", str(out)]


def test_second_run_into_a_held_directory_exits_2_naming_the_holder(raw: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (out / LOCK_NAME).write_text(f"{holder.pid} {socket.gethostname()}\n")
        r = _run_cli(*_preprocess_args(raw, out))
    finally:
        holder.kill()
        holder.wait()
    assert r.returncode == 2, r.stderr
    assert f"process {holder.pid}" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not list(out.glob("part-*"))


def test_stale_lock_is_taken_over_and_removed_at_the_end(raw: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (out / LOCK_NAME).write_text(f"{dead.pid} {socket.gethostname()}\n")
    r = _run_cli(*_preprocess_args(raw, out))
    assert r.returncode == 0, r.stderr
    assert "stale lock" in r.stderr
    assert not (out / LOCK_NAME).exists()
    assert (out / "part-00001.parquet").exists()


_CONTENDER = """
import sys, time
from pathlib import Path
from etl.errors import OutputError
from etl.io.lock import locked
directory, start, log = Path(sys.argv[1]), float(sys.argv[2]), Path(sys.argv[3])
while time.time() < start:
    pass
try:
    with locked(directory):
        t0 = time.monotonic()
        time.sleep(0.3)
        t1 = time.monotonic()
    with open(log, "a") as f:
        f.write(f"{t0} {t1}\\n")
except OutputError:
    pass
"""


def test_runs_taking_over_one_stale_lock_at_once_never_hold_it_together(tmp_path: Path) -> None:
    """Eight processes find the same stale lock at the same moment: the holders' times never overlap (one takes
    it over; the others are refused, or take it after the first is done)."""
    import time

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for attempt in range(3):
        (tmp_path / LOCK_NAME).write_text(f"{dead.pid} {socket.gethostname()}\n")
        log = tmp_path / f"held-{attempt}.txt"
        start = time.time() + 1.5
        procs = [subprocess.Popen([sys.executable, "-c", _CONTENDER, str(tmp_path), str(start), str(log)], cwd=REPO) for _ in range(8)]
        for p in procs:
            assert p.wait(timeout=60) == 0
        held = sorted(tuple(map(float, line.split())) for line in log.read_text().splitlines())
        assert held
        assert all(a[1] <= b[0] for a, b in zip(held, held[1:])), held
        assert not (tmp_path / LOCK_NAME).exists()


def test_lock_is_removed_on_error(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(EtlError):
        with locked(out.parent):
            assert (out.parent / LOCK_NAME).exists()
            raise EtlError("boom")
    assert not (out.parent / LOCK_NAME).exists()


def test_lock_held_by_this_process_refuses_a_second_holder(tmp_path: Path) -> None:
    with locked(tmp_path):
        with pytest.raises(OutputError, match=f"process {os.getpid()}"):
            with locked(tmp_path):
                pass
        assert (tmp_path / LOCK_NAME).exists()


# --- output overlapping an input ---------------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["equal", "inside", "contains"])
def test_out_overlapping_an_input_exits_2(raw: Path, where: str) -> None:
    out = {"equal": raw, "inside": raw / "out", "contains": raw.parent}[where]
    before = sorted(p.name for p in raw.iterdir())
    r = _run_cli(*_preprocess_args(raw, out))
    assert r.returncode == 2, r.stderr
    assert "overlaps the input" in r.stderr and "Traceback" not in r.stderr
    assert sorted(p.name for p in raw.iterdir()) == before


def test_check_apart_allows_an_output_next_to_input_files(tmp_path: Path) -> None:
    from etl.preprocess import check_apart

    (tmp_path / "a.parquet").touch()
    check_apart(tmp_path / "out", [tmp_path / "a.parquet"])
    with pytest.raises(OutputError):
        check_apart(tmp_path, [tmp_path / "a.parquet"])
    with pytest.raises(OutputError):
        check_apart(tmp_path / "sub" / "out", [tmp_path])


# --- one-line errors ---------------------------------------------------------------------------------------------

def test_row_error_cuts_a_long_value_and_says_its_length() -> None:
    from etl.errors import RowError

    value = "x" * 100_000
    e = RowError("f.parquet", 0, 3, "c", f"malformed hex: {value!r}")
    assert len(str(e)) < 300
    assert f"({len(repr(value)) + len('malformed hex: ')} chars)" in str(e)
    assert e.problem.endswith(repr(value))
    assert str(RowError("f.parquet", 0, 3, "c", "short: 'ab'")).endswith("column 'c': short: 'ab'")


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EACCES, errno.EROFS, errno.EDQUOT])
def test_environment_write_errors_are_one_line_exit_2(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, raw: Path,
                                                      code: int) -> None:
    from typer.testing import CliRunner

    import etl.preprocess
    from etl.cli import app

    def fail(*args: object, **kwargs: object) -> None:
        raise OSError(code, os.strerror(code), str(tmp_path / "out" / "part-00000.parquet"))

    monkeypatch.setattr(etl.preprocess, "preprocess", fail)
    r = CliRunner().invoke(app, _preprocess_args(raw, tmp_path / "out"))
    assert r.exit_code == 2, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    assert "part-00000.parquet" in r.output and os.strerror(code) in r.output


def test_other_os_errors_still_raise(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, raw: Path) -> None:
    from typer.testing import CliRunner

    import etl.preprocess
    from etl.cli import app

    def fail(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(etl.preprocess, "preprocess", fail)
    r = CliRunner().invoke(app, _preprocess_args(raw, tmp_path / "out"))
    assert isinstance(r.exception, OSError)


def test_write_error_names_the_path(tmp_path: Path) -> None:
    f = open_exclusive(tmp_path / "x")
    f.close()
    os.unlink(tmp_path / "x")
    w = files._NamedWriter(open("/dev/full", "wb", buffering=0), tmp_path / "x")  # type: ignore[arg-type]
    with pytest.raises(OSError) as e:
        w.write(b"a" * 10)
        w.flush()
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp_path / "x")


# --- disk full, for real -----------------------------------------------------------------------------------------

@pytest.fixture
def tiny_fs(tmp_path: Path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=False)


def test_disk_full_is_one_line_exit_2_and_leaves_no_lock_or_temporaries(tiny_fs: Path, tmp_path: Path) -> None:
    from etl.tools.synth import generate

    raw = tmp_path / "raw"
    generate(load_schema(REPO / "schemas" / "movielens.yaml"), rows=100_000, files=2, out_dir=raw)
    out = tiny_fs / "out"
    r = _run_cli(*_preprocess_args(raw, out))
    assert r.returncode == 2, r.stderr
    assert "No space left on device" in r.stderr and str(out) in r.stderr and "Traceback" not in r.stderr
    assert not (out / LOCK_NAME).exists()
    assert not [p for p in out.rglob("*") if files.is_temporary(p.name)]


def test_write_error_inside_a_part_file_leaves_no_final_name_and_the_rerun_is_identical(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, raw: Path
) -> None:
    """The disk fills up at the first write to the second part file (its bytes reach the file a megabyte at a
    time, see ``etl.io.files.buffered_stream``): the error names that file's temporary, no file
    appears under its final name, the manifest lists the first part only, and once there is room again the
    rerun ends with the bytes of an undisturbed run."""
    from etl.io.parquet import list_shards
    from etl.io.processed import read_manifest
    from etl.pipeline import Pipeline
    from etl.preprocess import preprocess

    spec = REPO / "pipelines" / "movielens.yaml"
    shards = list_shards(raw)
    undisturbed = tmp_path / "undisturbed"
    preprocess(Pipeline.from_file(spec), shards, undisturbed)
    real_write = files._NamedWriter.write
    writes = {"n": 0}

    def full_disk(self: files._NamedWriter, data: object) -> int:
        if self.path.name.startswith(".part-00001.parquet"):
            writes["n"] += 1
            if writes["n"] == 1:
                raise self._named(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))  # as a real write reports it
        return real_write(self, data)

    monkeypatch.setattr(files._NamedWriter, "write", full_disk)
    out = tmp_path / "out"
    with pytest.raises(OSError) as e:
        preprocess(Pipeline.from_file(spec), shards, out)
    assert e.value.errno == errno.ENOSPC and Path(e.value.filename).name.startswith(".part-00001.parquet")
    assert not (out / "part-00001.parquet").exists() and (out / "part-00000.parquet").exists()
    assert [f.output for f in read_manifest(out).files] == ["part-00000.parquet"]
    assert not (out / LOCK_NAME).exists()
    monkeypatch.setattr(files._NamedWriter, "write", real_write)
    assert preprocess(Pipeline.from_file(spec), shards, out).files_skipped == 1
    assert not [p for p in out.rglob("*") if files.is_temporary(p.name)]
    for part in sorted(undisturbed.rglob("*.parquet")):
        assert (out / part.relative_to(undisturbed)).read_bytes() == part.read_bytes(), part


# --- resume ------------------------------------------------------------------------------------------------------

def test_rerun_with_fewer_shards_removes_the_stale_outputs_the_old_manifest_lists(tmp_path: Path) -> None:
    from etl.pipeline import Pipeline
    from etl.preprocess import preprocess
    from etl.tools.synth import generate

    spec = REPO / "pipelines" / "movielens.yaml"
    shards = generate(load_schema(REPO / "schemas" / "movielens.yaml"), rows=3000, files=3, out_dir=tmp_path / "raw")
    out = tmp_path / "out"
    preprocess(Pipeline.from_file(spec), shards, out, on_error="quarantine")
    assert (out / "part-00002.parquet").exists()
    (out / "part-00002.parquet.keep").write_bytes(b"not ours")
    preprocess(Pipeline.from_file(spec), shards[:2], out, on_error="quarantine")
    assert sorted(p.name for p in out.glob("part-*")) == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet.keep"]


def test_stale_removal_ignores_names_it_does_not_make(tmp_path: Path) -> None:
    from etl.io.processed import ManifestEntry
    from etl.preprocess.output import remove_stale

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "out"
    out.mkdir()
    e = ManifestEntry("../victim.txt", "s", 1, 1, 1, 0, "../victim.txt", "0")
    remove_stale(out, {e.output: e}, set())
    assert victim.exists()


# --- convert into an existing directory --------------------------------------------------------------------------

def _text_schema(tmp_path: Path):
    import yaml

    spec = tmp_path / "schema.yaml"
    spec.write_text(yaml.safe_dump({"name": "t", "columns": [{"name": "x", "role": "dense", "dtype": "int64"}]}))
    return load_schema(spec)


@pytest.mark.parametrize("foreign", ["manifest.json", "notes.txt", "part-00007.parquet", "subdir"])
def test_convert_refuses_a_directory_holding_files_not_its_own(tmp_path: Path, foreign: str) -> None:
    from etl.io.text import convert

    schema = _text_schema(tmp_path)
    src = tmp_path / "in.txt"
    src.write_text("1\n2\n")
    out = tmp_path / "out"
    convert([src], schema, out, rows_per_file=1)  # two own shards
    if foreign == "subdir":
        (out / foreign).mkdir()
    elif foreign == "part-00007.parquet":
        atomic_write_parquet(pa.table({"y": ["other layout"]}), out / foreign)
    else:
        (out / foreign).write_text("precious")
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(OutputError, match="not a shard of this layout"):
        convert([src], schema, out)
    assert sorted(p.name for p in out.iterdir()) == before


def test_convert_into_its_input_directory_exits_2(tmp_path: Path) -> None:
    import yaml

    (tmp_path / "schema.yaml").write_text(yaml.safe_dump({"name": "t", "columns": [{"name": "x", "role": "dense", "dtype": "int64"}]}))
    src = tmp_path / "in.txt"
    src.write_text("1\n2\n")
    r = _run_cli("convert", str(src), "--schema", str(tmp_path / "schema.yaml"), "--out", str(tmp_path))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert src.read_text() == "1\n2\n"


def test_rerun_of_a_fixed_shard_removes_its_old_quarantine_file(tmp_path: Path) -> None:
    """A shard whose rows were quarantined, fixed and rerun, quarantines nothing now: its old quarantine file
    goes (it is listed by the old manifest and would otherwise sit beside an entry that names no quarantine)."""
    import pyarrow.parquet as pq

    from etl.io.processed import read_manifest
    from etl.pipeline import Pipeline
    from etl.preprocess import preprocess

    raw = tmp_path / "raw"
    shards, table = criteo_shards(raw)
    out = tmp_path / "out"
    preprocess(Pipeline.from_file(REPO / "pipelines/criteo_hash.yaml"), shards, out, on_error="quarantine")
    assert (out / "quarantine" / "part-00001.parquet").exists()
    pq.write_table(table.slice(0, 150), raw / "part-00001.parquet")  # fixed (and other bytes)
    preprocess(Pipeline.from_file(REPO / "pipelines/criteo_hash.yaml"), shards, out, on_error="quarantine")
    assert not (out / "quarantine" / "part-00001.parquet").exists()
    assert [e.quarantine for e in read_manifest(out).files] == [None, None]


def test_rerun_with_on_error_raise_over_a_quarantined_shard_raises(tmp_path: Path) -> None:
    """The manifest's entry of a shard with quarantined rows does not stand for a run that must raise on them:
    the shard is redone, and its bad row raises; a shard that quarantined nothing is reused."""
    from etl.errors import RowError
    from etl.pipeline import Pipeline
    from etl.preprocess import preprocess

    shards, _ = criteo_shards(tmp_path / "raw", bad_first_c1=True)
    out = tmp_path / "out"
    spec = REPO / "pipelines/criteo_hash.yaml"
    preprocess(Pipeline.from_file(spec), shards, out, on_error="quarantine")
    with pytest.raises(RowError, match="part-00001.parquet.*C1"):
        preprocess(Pipeline.from_file(spec), shards, out, on_error="raise")
    summary = preprocess(Pipeline.from_file(spec), shards[:1], out, on_error="raise")
    assert summary.files_skipped == 1


def test_rerun_with_on_error_raise_over_a_quarantined_shard_exits_2(tmp_path: Path) -> None:
    shards, _ = criteo_shards(tmp_path / "raw", bad_first_c1=True)
    out = tmp_path / "out"
    args = ("preprocess", "--pipeline", str(REPO / "pipelines/criteo_hash.yaml"), "--input", str(tmp_path / "raw"), "--out", str(out))
    assert _run_cli(*args, "--on-error", "quarantine").returncode == 0
    r = _run_cli(*args, "--on-error", "raise")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "row 0, column 'C1'" in r.stderr, r.stderr


@pytest.mark.parametrize("workers", [1, 2])
def test_a_rerun_with_on_error_raise_that_fails_leaves_the_quarantine_mode_output_as_it_was(tmp_path: Path, workers: int) -> None:
    """The rerun must redo the shard that quarantined rows, and fails on its first bad row: before it commits a file
    of its own, it removes nothing, so the earlier output stays whole, its manifest included, and readable."""
    from etl.errors import RowError
    from etl.io.processed import open_processed
    from etl.pipeline import Pipeline
    from etl.preprocess import preprocess
    from tests.conftest import tree_bytes

    shards, _ = criteo_shards(tmp_path / "raw", bad_first_c1=True)
    out = tmp_path / "out"
    spec = REPO / "pipelines/criteo_hash.yaml"
    preprocess(Pipeline.from_file(spec), shards, out, on_error="quarantine")
    before = tree_bytes(out)
    with pytest.raises(RowError, match="part-00001.parquet.*C1"):
        preprocess(Pipeline.from_file(spec), shards, out, on_error="raise", workers=workers)
    assert tree_bytes(out) == before
    assert open_processed(out).manifest.complete


def test_a_shard_done_after_another_failed_is_not_committed_over_the_earlier_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two shards redone in two threads: the one that fails first stops the run; the other, finished after it, is
    discarded rather than committed, since its commit would replace the earlier run's files."""
    import threading

    import pyarrow.parquet as pq

    from etl.errors import RowError
    from etl.pipeline import Pipeline
    from etl.preprocess import preprocess
    from etl.preprocess import run as run_module
    from tests.conftest import tree_bytes

    shards, table = criteo_shards(tmp_path / "raw", bad_first_c1=True)
    pq.write_table(table.slice(0, 100), shards[0].with_name("part-00002.parquet"))
    shards.append(shards[0].with_name("part-00002.parquet"))
    out = tmp_path / "out"
    spec = REPO / "pipelines/criteo_hash.yaml"
    preprocess(Pipeline.from_file(spec), shards, out, on_error="quarantine")
    before = tree_bytes(out)
    st = shards[2].stat()
    os.utime(shards[2], ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # redone too
    real = run_module.process_shard

    def late(pipeline, source, out_path, on_error, stop, *args, **kwargs):
        if source == shards[2]:  # finishes only once the other shard's error has stopped the run
            deadline = time.monotonic() + 30
            while not stop.is_set() and time.monotonic() < deadline:
                time.sleep(0.01)
            assert stop.is_set()
            return real(pipeline, source, out_path, on_error, threading.Event(), *args, **kwargs)
        return real(pipeline, source, out_path, on_error, stop, *args, **kwargs)

    monkeypatch.setattr(run_module, "process_shard", late)
    with pytest.raises(RowError, match="part-00001.parquet.*C1"):
        preprocess(Pipeline.from_file(spec), shards, out, on_error="raise", workers=2)
    assert tree_bytes(out) == before


def test_resume_redoes_a_shard_whose_modification_time_changed(tmp_path: Path) -> None:
    from etl.pipeline import Pipeline
    from etl.preprocess import preprocess

    shards, _ = criteo_shards(tmp_path / "raw", bad_first_c1=False)
    out = tmp_path / "out"
    spec = REPO / "pipelines/criteo_hash.yaml"
    preprocess(Pipeline.from_file(spec), shards, out)
    st = shards[1].stat()
    os.utime(shards[1], ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert preprocess(Pipeline.from_file(spec), shards, out).files_skipped == 1
    assert preprocess(Pipeline.from_file(spec), shards, out).files_skipped == 2


def test_resume_redoes_a_shard_edited_with_the_same_size_and_modification_time(tmp_path: Path) -> None:
    """An edit that keeps the size and the modification time (a copy with ``cp -p``, a clock step) but changes the
    content: the footer checksum differs, so the stale output is not kept."""
    import pyarrow.parquet as pq

    from etl.io.processed import read_manifest
    from etl.pipeline import Pipeline
    from etl.preprocess import preprocess

    shards, table = criteo_shards(tmp_path / "raw", bad_first_c1=False)
    plain = {"compression": "none", "use_dictionary": False}  # sizes that depend on the widths only
    pq.write_table(table, shards[1], **plain)
    out = tmp_path / "out"
    spec = REPO / "pipelines/criteo_hash.yaml"
    preprocess(Pipeline.from_file(spec), shards, out)
    before = read_manifest(out).files[1]
    st = shards[1].stat()
    dense = table.schema.get_field_index("I1")
    edited = table.set_column(dense, "I1", pa.array([v + 1 if v is not None else None for v in table["I1"].to_pylist()], pa.int64()))
    edited_path = tmp_path / "edited.parquet"
    pq.write_table(edited, edited_path, **plain)
    assert edited_path.stat().st_size == st.st_size  # same widths, other values (and statistics)
    os.replace(edited_path, shards[1])
    os.utime(shards[1], ns=(st.st_atime_ns, st.st_mtime_ns))
    assert preprocess(Pipeline.from_file(spec), shards, out).files_skipped == 1
    after = read_manifest(out).files[1]
    assert after.sha256 != before.sha256 and after.source_footer_sha256 != before.source_footer_sha256


def test_resume_redoes_a_shard_edited_in_place_with_the_same_size_footer_and_modification_time(tmp_path: Path) -> None:
    """One value of a data page overwritten in place by another between the column's minimum and maximum: the size,
    the footer (statistics, offsets) and, set back, the modification time are those the manifest records; the
    status change time, which cannot be set back, is later than the output's. The shard is redone."""
    import struct

    import pyarrow.parquet as pq

    from etl.io.parquet import footer_sha256
    from etl.io.processed import read_manifest
    from etl.pipeline import Pipeline
    from etl.preprocess import preprocess

    shards, table = criteo_shards(tmp_path / "raw", bad_first_c1=False)
    pq.write_table(table, shards[1], compression="none", use_dictionary=False)  # plain int64 values in the pages
    out = tmp_path / "out"
    spec = REPO / "pipelines/criteo_hash.yaml"
    preprocess(Pipeline.from_file(spec), shards, out)
    before = read_manifest(out).files[1]
    values = [v for v in table["I1"].to_pylist() if v is not None]
    old = next(v for v in values if min(values) < v < max(values) and values.count(v) == 1)
    new = next(v for v in range(min(values) + 1, max(values)) if v not in values)
    chunk = pq.ParquetFile(shards[1]).metadata.row_group(0).column(table.schema.get_field_index("I1"))
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    pages = shards[1].read_bytes()[start:start + chunk.total_compressed_size]  # I1's pages: header, levels, values
    assert pages.count(struct.pack("<q", old)) == 1
    st, footer = shards[1].stat(), footer_sha256(shards[1])
    time.sleep(0.01)  # a status change time later than the output's modification time, whatever the clock's step
    with open(shards[1], "r+b") as f:
        f.seek(start + pages.index(struct.pack("<q", old)))
        f.write(struct.pack("<q", new))
    os.utime(shards[1], ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (shards[1].stat().st_size, shards[1].stat().st_mtime_ns, footer_sha256(shards[1])) == (st.st_size, st.st_mtime_ns, footer)
    assert pq.read_table(shards[1])["I1"].to_pylist() != table["I1"].to_pylist()
    assert preprocess(Pipeline.from_file(spec), shards, out).files_skipped == 1
    assert read_manifest(out).files[1].sha256 != before.sha256
    assert preprocess(Pipeline.from_file(spec), shards, out).files_skipped == 2  # and then kept


def test_resume_redoes_shards_of_a_manifest_without_source_fingerprints(tmp_path: Path) -> None:
    """A manifest written before entries held the modification time and footer checksum proves nothing about the
    source's content: its shards are redone (and the output is the same bytes)."""
    import json

    from etl.io.processed import MANIFEST
    from etl.pipeline import Pipeline
    from etl.preprocess import preprocess

    shards, _ = criteo_shards(tmp_path / "raw", bad_first_c1=False)
    out = tmp_path / "out"
    spec = REPO / "pipelines/criteo_hash.yaml"
    preprocess(Pipeline.from_file(spec), shards, out)
    parts = {p.name: p.read_bytes() for p in out.glob("part-*")}
    doc = json.loads((out / MANIFEST).read_text())
    for e in doc["files"]:
        del e["source_mtime_ns"], e["source_footer_sha256"]
    (out / MANIFEST).write_text(json.dumps(doc))
    assert preprocess(Pipeline.from_file(spec), shards, out).files_skipped == 0
    assert {p.name: p.read_bytes() for p in out.glob("part-*")} == parts
