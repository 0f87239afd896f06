"""Multi-process training as torchrun runs it: two ranks (gloo, CPU) each read their slice of an s3:// data set
with the Loader. Their rows are disjoint and together complete (the rows of a one-process epoch), and both yield
the same number of batches."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from etl.io.fs import location
from etl.loader import Loader
from etl.schema import load_schema
from etl.synth import generate
from tests.conftest import REPO

pytest.importorskip("s3fs")

PIPELINE = REPO / "pipelines/criteo_hash.yaml"


def _sorted_rows(rows: np.ndarray) -> np.ndarray:
    return rows[np.lexsort(rows.T[::-1])]


def test_torchrun_two_ranks_read_disjoint_complete_equal_slices(s3: str, tmp_path: Path) -> None:
    generate(load_schema(REPO / "schemas/criteo.yaml"), 1_000, 3, location(f"{s3}/raw"), seed=4)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(REPO / "tests/integration/ddp_rank.py"), f"{s3}/raw", str(PIPELINE), str(tmp_path)]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])), OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]

    ranks = [np.load(tmp_path / f"rank{r}.npz") for r in range(2)]
    assert ranks[0]["batches"] == ranks[1]["batches"] == 8  # 500 rows each, batches of 64
    assert list(ranks[0]["counts"]) == list(ranks[1]["counts"]) == [8, 8]
    loader = Loader(f"{s3}/raw", PIPELINE, batch_size=64, shuffle=True, seed=5, num_workers=1, rank=0, world_size=1)
    try:
        whole = np.concatenate([np.hstack([b.label.numpy()[:, None], b.dense.numpy(), b.sparse.numpy()]).astype(np.float64) for b in loader])
    finally:
        loader.close()
    both = np.concatenate([r["rows"] for r in ranks])
    assert len(ranks[0]["rows"]) == len(ranks[1]["rows"]) == 500
    assert np.array_equal(_sorted_rows(both), _sorted_rows(whole))  # together: every row once (as many times as in the data)
