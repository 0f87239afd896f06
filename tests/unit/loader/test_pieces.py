"""etl.loader.pieces: each reader's chunk of a piece cut from the middle of a row group, its timing, a processed
file in object storage downloaded once for its check and its reads (moto in server mode), and the wrapper that
names the piece of an unexpected failure."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from etl.errors import InputError, LoaderError
from etl.io.arrivals import CountedFiles
from etl.io.files import atomic_write_parquet, sha256_file
from etl.io.fs import Url
from etl.io.processed import Manifest, ManifestEntry, ProcessedOutput, part_path
from etl.loader.chunk import Chunk, Layout
from etl.loader.device_stage import ROW_BITS, DeviceStage
from etl.loader.order import Piece, row_groups
from etl.loader.pieces import (
    DeviceInputReader,
    HostReader,
    ProcessedReader,
    guarded,
    reader_for,
)
from etl.loader.stats import LoaderStats
from etl.pipeline import Pipeline
from tests.conftest import REPO, criteo_table

PIPELINE = Pipeline.from_file(REPO / "pipelines/criteo_hash.yaml")
LAYOUT = Layout.of(PIPELINE)


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("raw") / "part.parquet"
    pq.write_table(criteo_table(900, 4), path, row_group_size=300)
    return path


def middle(path: Path) -> Piece:
    """Rows 50..170 of row group 1 (file rows 350..470)."""
    return Piece(row_groups([path])[1], 50, 120)


def assert_same(a: Chunk, b: Chunk) -> None:
    assert a.n == b.n and a.fixed.keys() == b.fixed.keys() and a.lists.keys() == b.lists.keys()
    for k in a.fixed:
        np.testing.assert_array_equal(a.fixed[k], b.fixed[k])


def test_host_reader_transforms_the_piece_rows(raw: Path) -> None:
    stats = LoaderStats()
    chunk = HostReader(PIPELINE, LAYOUT, stats)(middle(raw))
    want = Chunk.from_table(PIPELINE.transform_table(pq.read_table(raw).slice(350, 120)), LAYOUT)
    assert_same(chunk, want)
    assert stats.read_seconds > 0 and stats.transform_seconds > 0


def test_processed_reader_reads_the_output_columns_as_they_are(raw: Path, tmp_path: Path) -> None:
    out = part_path(tmp_path, 0)
    pq.write_table(PIPELINE.transform_table(pq.read_table(raw)), out, row_group_size=300)
    entry = ManifestEntry(out.name, str(raw), raw.stat().st_size, 900, 900, 0, None, sha256_file(out))
    output = ProcessedOutput(tmp_path, tmp_path / "artifacts", [out], Manifest.of("criteo_hash", [entry], complete=True))
    chunk = ProcessedReader(LAYOUT, LoaderStats(), output)(middle(out))
    assert_same(chunk, HostReader(PIPELINE, LAYOUT, LoaderStats())(middle(raw)))


def test_a_following_processed_reader_checks_each_file_against_the_entry_it_was_counted_with(raw: Path, tmp_path: Path) -> None:
    """Following, the reader checks a file against its entry in the ``CountedFiles`` record, not the manifest the
    output was opened with; a file not counted is refused."""
    out = part_path(tmp_path, 0)
    pq.write_table(PIPELINE.transform_table(pq.read_table(raw)), out, row_group_size=300)
    entry = ManifestEntry(out.name, str(raw), raw.stat().st_size, 900, 900, 0, None, sha256_file(out))
    output = ProcessedOutput(tmp_path, tmp_path / "artifacts", [out], Manifest.of("criteo_hash", [entry], complete=True))
    counted = CountedFiles()
    with pytest.raises(InputError, match="part-00000.parquet: not a file of this output that was counted"):
        ProcessedReader(LAYOUT, LoaderStats(), output, counted)(middle(out))
    counted.add([replace(entry, sha256="0" * 64)])  # the file changed since its count
    with pytest.raises(InputError, match="file part-00000.parquet: sha256 .* differs from the manifest's 0000"):
        ProcessedReader(LAYOUT, LoaderStats(), output, counted)(middle(out))
    counted.add([entry])
    assert_same(ProcessedReader(LAYOUT, LoaderStats(), output, counted)(middle(out)), HostReader(PIPELINE, LAYOUT, LoaderStats())(middle(raw)))


def _one_part_output(raw: Path, tmp_path: Path) -> tuple[Path, pa.Table, ProcessedReader]:
    """A processed output in ``tmp_path`` of one part (``raw`` transformed), its table and a reader of it."""
    out = part_path(tmp_path, 0)
    table = PIPELINE.transform_table(pq.read_table(raw))
    pq.write_table(table, out, row_group_size=300)
    entry = ManifestEntry(out.name, str(raw), raw.stat().st_size, 900, 900, 0, None, sha256_file(out))
    output = ProcessedOutput(tmp_path, tmp_path / "artifacts", [out], Manifest.of("criteo_hash", [entry], complete=True))
    return out, table, ProcessedReader(LAYOUT, LoaderStats(), output)


def test_a_processed_file_changed_under_the_reader_is_checked_again(raw: Path, tmp_path: Path) -> None:
    """A reader checks a file once, then again whenever it changed (replaced, rewritten): bytes other than the
    manifest's are an error naming the file, never rows of the new file; a file touched but unchanged reads on."""
    out, table, reader = _one_part_output(raw, tmp_path)
    want = HostReader(PIPELINE, LAYOUT, LoaderStats())(middle(raw))
    assert_same(reader(middle(out)), want)
    os.utime(out, ns=(out.stat().st_atime_ns, out.stat().st_mtime_ns + 10**9))  # touched: the same bytes
    assert_same(reader(middle(out)), want)
    other = tmp_path / "other.parquet"
    pq.write_table(table.slice(1), other, row_group_size=300)  # another file renamed onto it, as a rerun does
    os.replace(other, out)
    with pytest.raises(InputError, match="part-00000.parquet changed while this loader reads it .*sha256 .* differs from the manifest's"):
        reader(middle(out))


@pytest.mark.parametrize("how", ["replaced", "removed"])
def test_a_processed_file_changed_while_a_piece_is_read_is_named(raw: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 how: str) -> None:  # fmt: skip
    """The file is replaced (or removed) between the reader's check and its read of the rows, as a rerun of etl
    preprocess may do at any moment: the check after the read names it, instead of rows of the new file (or a
    FileNotFoundError)."""
    out, table, reader = _one_part_output(raw, tmp_path)
    other = tmp_path / "other.parquet"
    pq.write_table(table.slice(1), other, row_group_size=300)
    read = ProcessedReader.read

    def changed_then_read(self: ProcessedReader, piece: Piece, path: Path) -> Chunk:
        if how == "replaced":
            os.replace(other, out)
        else:
            out.unlink()
        return read(self, piece, path)

    monkeypatch.setattr(ProcessedReader, "read", changed_then_read)
    problem = "sha256 .* differs from the manifest's" if how == "replaced" else "cannot read"
    with pytest.raises(InputError, match=f"part-00000.parquet changed while this loader reads it .*{problem}"):
        reader(middle(out))


def test_a_processed_file_in_object_storage_is_downloaded_once(raw: Path, s3: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every piece of the file read (twice), and its check: about the file's bytes fetched from the store, once; a
    copy whose bytes differ from the manifest's is refused, and leaves no copy behind."""
    s3fs = pytest.importorskip("s3fs")
    directory = Url(f"{s3}/out")
    out = part_path(directory, 0)
    atomic_write_parquet(PIPELINE.transform_table(pq.read_table(raw)), out, row_group_size=300)
    entry = ManifestEntry(out.name, str(raw), raw.stat().st_size, 900, 900, 0, None, sha256_file(out))
    output = ProcessedOutput(directory, directory / "artifacts", [out], Manifest.of("criteo_hash", [entry], complete=True))
    groups = row_groups([out])
    fetched: Counter[str] = Counter()
    fetch_range = s3fs.core.S3File._fetch_range

    def counted(self, start: int, end: int) -> bytes:
        data = fetch_range(self, start, end)
        fetched[self.path] += len(data)
        return data

    monkeypatch.setattr(s3fs.core.S3File, "_fetch_range", counted)
    reader = ProcessedReader(LAYOUT, LoaderStats(), output)
    for _ in range(2):  # two epochs
        chunks = [reader(Piece(g, 0, g.num_rows)) for g in groups]
    size, got = out.fs.size(out.key), fetched[out.key]
    assert size <= got < 1.2 * size, (got, size)  # read from the store for the check and again for the rows: 2 * size or more
    assert sum(c.n for c in chunks) == 900
    assert_same(chunks[1], ProcessedReader(LAYOUT, LoaderStats(), output).read(Piece(groups[1], 0, 300), out))  # as in the store

    wrong = replace(entry, sha256="0" * 64)
    bad = ProcessedOutput(directory, directory / "artifacts", [out], Manifest.of("criteo_hash", [wrong], complete=True))
    checking = ProcessedReader(LAYOUT, LoaderStats(), bad)
    with pytest.raises(InputError, match="sha256 .* differs from the manifest's"):
        checking(Piece(groups[0], 0, 10))
    assert checking._spool is not None and list(checking._spool.iterdir()) == []


def test_device_input_reader_lays_out_inputs_with_their_origin(raw: Path) -> None:
    groups = row_groups([raw])
    stage = DeviceStage(PIPELINE, LAYOUT, groups)
    chunk = DeviceInputReader(PIPELINE, stage, groups, LoaderStats())(middle(raw))
    assert chunk.n == 120 and "in_keys" in chunk.fixed
    np.testing.assert_array_equal(chunk.fixed["origin"], (1 << ROW_BITS) | np.arange(50, 170))


def test_reader_for_picks_the_reader_of_the_source(raw: Path, tmp_path: Path) -> None:
    groups, stats = row_groups([raw]), LoaderStats()
    stage = DeviceStage(PIPELINE, LAYOUT, groups)
    output = ProcessedOutput(tmp_path, tmp_path / "artifacts", [], Manifest.of("criteo_hash", [], complete=True))
    kinds = [(output, None, ProcessedReader), (None, None, HostReader), (None, stage, DeviceInputReader)]
    for processed, device_stage, want in kinds:
        reader = reader_for(PIPELINE, LAYOUT, processed=processed, stage=device_stage, groups=groups, stats=stats)
        assert type(reader) is want


def test_guarded_names_the_piece_of_an_unexpected_failure(raw: Path) -> None:
    piece = middle(raw)

    def broken(p: Piece) -> Chunk:
        raise KeyError("gone")

    with pytest.raises(LoaderError) as info:
        guarded(broken)(piece)
    assert str(info.value) == f"{raw}, row group 1, rows 50..170: KeyError: 'gone'"
    assert isinstance(info.value.__cause__, KeyError)


def test_guarded_passes_errors_that_already_name_their_place(raw: Path) -> None:
    error = InputError(str(raw), "truncated", row_group=1)

    def broken(p: Piece) -> Chunk:
        raise error

    with pytest.raises(InputError) as info:
        guarded(broken)(middle(raw))
    assert info.value is error
