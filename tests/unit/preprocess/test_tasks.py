"""etl.preprocess.tasks.fitted, as a cluster worker calls it: the artifacts the run saved, loaded once per run and
not again while their bytes stay the same; a worker that cannot read them, or reads others, says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from etl.errors import ConfigError
from etl.io.files import sha256_file
from etl.pipeline import Pipeline
from etl.preprocess import preprocess
from etl.preprocess.tasks import fitted
from tests.conftest import REPO, criteo_table
from tests.unit.preprocess.test_run import write

CRITEO = REPO / "pipelines/criteo.yaml"


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    shard = write(criteo_table(200, seed=1), tmp_path / "raw" / "a.parquet")
    preprocess(Pipeline.from_file(CRITEO), [shard], tmp_path / "out")
    return tmp_path / "out" / "artifacts"


def test_loaded_once_per_run_and_kept_while_the_bytes_stay(artifacts: Path, tmp_path: Path) -> None:
    sha = sha256_file(artifacts / "pipeline.json")
    first = fitted(artifacts, sha, "run-1")
    assert first.is_fitted and fitted(artifacts, sha, "run-1") is first
    assert fitted(artifacts, sha, "run-2") is first  # another run, the same bytes
    first.save(artifacts)  # rewritten with the same bytes
    assert fitted(artifacts, sha, "run-3") is first
    table = next(p for p in artifacts.rglob("*.parquet"))
    table.write_bytes(table.read_bytes())  # same bytes, new file: still the same
    assert fitted(artifacts, sha, "run-4") is first
    other = write(criteo_table(300, seed=9), tmp_path / "raw2" / "b.parquet")
    refit = Pipeline.from_file(CRITEO)
    refit.fit([other])
    refit.save(tmp_path / "refit")
    for p in (tmp_path / "refit").rglob("*.parquet"):  # other vocabularies under the same pipeline.json
        (artifacts / p.relative_to(tmp_path / "refit")).write_bytes(p.read_bytes())
    again = fitted(artifacts, sha, "run-5")
    assert again is not first and again.cardinalities() == refit.cardinalities()


def test_a_worker_that_sees_other_artifacts_says_so(artifacts: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="sees other artifacts.*shared storage"):
        fitted(artifacts, "0" * 64, "run-6")
    with pytest.raises(ConfigError, match="cannot read the artifacts.*shared storage"):
        fitted(tmp_path / "elsewhere", sha256_file(artifacts / "pipeline.json"), "run-7")
