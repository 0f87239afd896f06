"""The example of docs/custom-ops.md as a user runs it: examples/pipeline.yaml, whose ops come from
examples/my_ops.py beside it (on no Python path) and an Expr, through `etl fit` and `etl preprocess` with one and
two workers and a local Dask cluster of two worker processes (the same bytes), `etl fit` (the same artifacts), `Pipeline.load` and the Loader on
raw shards."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from etl.pipeline import Pipeline
from tests.conftest import REPO, run_etl, tree_bytes

PIPELINE = REPO / "examples" / "pipeline.yaml"


def test_user_ops_give_the_same_bytes_with_threads_and_a_cluster(tmp_path: Path) -> None:
    run_etl("generate", "--schema", REPO / "schemas/criteo.yaml", "--rows", 6000, "--files", 3, "--out", tmp_path / "raw")
    trees = []
    for how in (["--workers", "1"], ["--workers", "2"], ["--cluster", "local:2"]):
        out = tmp_path / how[1].replace(":", "")
        run_etl("preprocess", "--pipeline", PIPELINE, "--input", tmp_path / "raw", "--out", out, *how, cwd=tmp_path)
        trees.append(tree_bytes(out))
    assert trees[0] == trees[1] == trees[2]
    run_etl("fit", "--pipeline", PIPELINE, "--input", tmp_path / "raw", "--artifacts", tmp_path / "fitted", cwd=tmp_path)
    assert (tmp_path / "fitted/pipeline.json").read_bytes() == trees[0]["artifacts/pipeline.json"]
    out = pq.read_table(tmp_path / "1" / "part-00000.parquet")
    assert out.column_names[-1] == "clicks_per_view" and out.schema.field("I5").type.bit_width == 32
    assert "my_ops" not in sys.modules  # this process imports it below, from the artifacts' record

    fitted = Pipeline.load(tmp_path / "1" / "artifacts")
    assert [op.name for op in fitted.ops][3:5] == ["Winsorize", "QuantileBuckets"]
    bounds = fitted.ops[3].bounds["I1"]
    i1 = out.column("I1").to_numpy()
    assert np.float32(np.log1p(bounds[0])) == np.min(i1) and np.max(i1) == np.float32(np.log1p(bounds[1]))  # clipped, then Log1p


def test_the_loader_runs_user_ops_on_raw_shards(tmp_path: Path) -> None:
    import torch

    from etl.loader import Loader

    run_etl("generate", "--schema", REPO / "schemas/criteo.yaml", "--rows", 3000, "--out", tmp_path / "raw")
    run_etl("fit", "--pipeline", PIPELINE, "--input", tmp_path / "raw", "--artifacts", tmp_path / "fitted", cwd=tmp_path)
    rows = 0
    loader = Loader(str(tmp_path / "raw"), pipeline=PIPELINE, artifacts=str(tmp_path / "fitted"), batch_size=1024)
    try:
        for batch in loader:
            rows += len(batch.label)
            assert batch.dense.shape[1] == 13 and torch.isfinite(batch.dense).all()  # 12 dense columns and clicks_per_view
            assert "I5" in batch.sparse_names
    finally:
        loader.close()
    assert rows == 3000
