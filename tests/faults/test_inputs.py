"""Raw shards at the door of ``etl preprocess`` (run as a subprocess, as a user runs it): a dangling symlink among
the shards is refused by name instead of leaving a shard out, and string columns stored as dictionary, large_string,
binary or large_binary Arrow types are processed into outputs identical to those of plain string columns."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO, criteo_table

PIPELINES = ("criteo.yaml", "criteo_hash.yaml")


def preprocess(raw: Path, out: Path, pipeline: str = "criteo.yaml") -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "etl", "preprocess", "--pipeline", str(REPO / "pipelines" / pipeline)]
    command += ["--input", str(raw), "--out", str(out), "--workers", "1"]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)


def write_raw(directory: Path, convert: Callable[[pa.Array], pa.Array] | None = None) -> Path:
    """Two small Criteo shards; ``convert`` changes the type of the categorical columns."""
    directory.mkdir(parents=True)
    for i, n in enumerate((300, 170)):
        table = criteo_table(n, seed=i)
        if convert is not None:
            for name in [c for c in table.column_names if c.startswith("C")]:
                index = table.column_names.index(name)
                column = convert(table.column(name).combine_chunks())
                table = table.set_column(index, pa.field(name, column.type), column)
        pq.write_table(table, directory / f"part-{i:05d}.parquet", row_group_size=128)
    return directory


def outputs(directory: Path) -> dict[str, bytes]:
    """The processed files' bytes (the manifest holds source paths, so it is compared through its files)."""
    return {p.name: p.read_bytes() for p in sorted(directory.glob("part-*.parquet"))}


def test_dangling_symlink_among_the_shards_is_refused(tmp_path: Path) -> None:
    raw = write_raw(tmp_path / "raw")
    (raw / "part-00002.parquet").symlink_to(tmp_path / "moved-away.parquet")
    result = preprocess(raw, tmp_path / "out")
    assert result.returncode != 0
    assert "part-00002.parquet: dangling symlink" in result.stderr
    assert "Traceback" not in result.stderr


def test_symlinked_shard_is_read(tmp_path: Path) -> None:
    raw = write_raw(tmp_path / "raw")
    linked = tmp_path / "linked"
    linked.mkdir()
    for p in raw.iterdir():
        (linked / p.name).symlink_to(p)
    assert preprocess(raw, tmp_path / "plain").returncode == 0
    assert preprocess(linked, tmp_path / "out").returncode == 0
    assert outputs(tmp_path / "out") == outputs(tmp_path / "plain")


STRING_TYPES: dict[str, Callable[[pa.Array], pa.Array]] = {
    "dictionary": pc.dictionary_encode,
    "large_string": lambda a: a.cast(pa.large_string()),
    "binary": lambda a: a.cast(pa.binary()),
    "large_binary": lambda a: a.cast(pa.large_binary()),
    "dictionary of large_string": lambda a: pc.dictionary_encode(a.cast(pa.large_string())),
}


CASES = [(kind, "criteo.yaml") for kind in STRING_TYPES] + [("dictionary", "criteo_hash.yaml"), ("binary", "criteo_hash.yaml")]


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, bytes]]:
    """The outputs of each pipeline on the shards with plain string columns."""
    tmp = tmp_path_factory.mktemp("plain")
    raw = write_raw(tmp / "raw")
    done = {}
    for pipeline in PIPELINES:
        result = preprocess(raw, tmp / pipeline, pipeline)
        assert result.returncode == 0, result.stderr
        done[pipeline] = outputs(tmp / pipeline)
    return done


@pytest.mark.parametrize(("kind", "pipeline"), CASES)
def test_string_column_types_give_the_plain_outputs(
    tmp_path: Path, plain: dict[str, dict[str, bytes]], kind: str, pipeline: str
) -> None:
    raw = write_raw(tmp_path / "raw", STRING_TYPES[kind])
    assert pq.ParquetFile(raw / "part-00000.parquet").schema_arrow.field("C1").type != pa.string()
    result = preprocess(raw, tmp_path / "out", pipeline)
    assert result.returncode == 0, result.stderr
    assert outputs(tmp_path / "out") == plain[pipeline]
