"""TargetEncode on MovieLens through the command line, as the README says: the run that fits gives its rows
out-of-fold encodings, a run with its artifacts the full statistics (or out of fold again with --training), each
equal to the pandas reference computed from the raw ratings."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from tests.conftest import REPO, run_etl
from tests.docs import section_commands
from tests.unit.ops.target_reference import encode, position_folds


def output(out: Path) -> pd.DataFrame:
    manifest = json.loads((out / "manifest.json").read_text())
    return pd.concat([pq.read_table(out / e["output"]).to_pandas() for e in manifest["files"]], ignore_index=True)


def test_movielens_target_encoding(movielens: Path, tmp_path: Path) -> None:
    convert = section_commands("MovieLens")[0]
    (fit_run,) = section_commands("Target encoding")
    for command in (convert, fit_run):
        run_etl(*[a.replace("ml-latest-small/", f"{movielens}/").replace("data/ml/", f"{tmp_path}/ml/") for a in command[1:]])
    raw_dir, out = tmp_path / "ml" / "raw", tmp_path / "ml" / "target"
    shards = sorted(raw_dir.glob("*.parquet"))
    raw = pd.concat([pq.read_table(p, columns=["userId", "movieId", "rating"]).to_pandas() for p in shards], ignore_index=True)
    raw["fold"] = np.concatenate([position_folds(p.name, pq.read_metadata(p).num_rows, 5, 42) for p in shards])
    assert len(raw) == 100_836

    def check(got: pd.DataFrame, training: bool) -> None:
        for column in ("userId", "movieId"):
            np.testing.assert_array_equal(got[f"te_{column}"].to_numpy(), encode(raw, raw, [column], "rating", 20, training), err_msg=column)

    trained = output(out)
    assert trained["te_movieId"].dtype == np.float32 and json.loads((out / "manifest.json").read_text())["training"] is True
    check(trained, training=True)

    pipeline = REPO / "pipelines/movielens_target.yaml"
    run_etl("preprocess", "--pipeline", pipeline, "--artifacts", out / "artifacts", "--input", raw_dir, "--out", tmp_path / "full")
    full = output(tmp_path / "full")
    check(full, training=False)
    assert json.loads((tmp_path / "full" / "manifest.json").read_text())["training"] is False
    # the movie's value of a rating differs as the rating's own fold is left out, or not
    assert (full["te_movieId"] != trained["te_movieId"]).mean() > 0.9
    run_etl("preprocess", "--pipeline", pipeline, "--artifacts", out / "artifacts", "--input", raw_dir, "--out", tmp_path / "again", "--training")
    assert output(tmp_path / "again").equals(trained)
    proc = run_etl("preprocess", "--pipeline", pipeline, "--input", raw_dir, "--out", tmp_path / "f", "--follow", "--training", check=False)
    assert proc.returncode == 2 and "--follow transforms rows that arrive after the fit: it takes no --training" in proc.stderr
