"""etl.loader.pieces: each reader's chunk of a piece cut from the middle of a row group, its timing, and the
wrapper that names the piece of an unexpected failure."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from etl.errors import InputError, LoaderError
from etl.io.files import sha256_file
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
