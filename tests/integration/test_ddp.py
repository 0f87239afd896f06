"""Data-parallel training as users run it: ``torchrun --nproc_per_node=2`` (gloo, CPU), each process a Loader
on ``s3://`` shards that takes its rank from ``torch.distributed``. The ranks' rows are disjoint and together every
row once, and every rank yields the same number of batches (a collective per batch completes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO
from tests.integration.test_loader import HASH, build_raw

ROWS = 5_003


def test_torchrun_two_ranks_split_the_rows_of_s3_shards(s3: str, tmp_path: Path) -> None:
    s3fs = pytest.importorskip("s3fs")
    raw = build_raw(tmp_path, ROWS, 3, [900, 1_300], seed=5)  # I1 = the global row number
    for p in sorted(raw.glob("*.parquet")):
        s3fs.S3FileSystem().put_file(str(p), f"{s3}/raw/{p.name}")
    out = tmp_path / "ranks"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(REPO / "tests/integration/ddp_worker.py"), f"{s3}/raw", str(HASH), str(out), "600"]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[:4000] + "\n[...]\n" + proc.stderr[-2000:]  # a rank's traceback comes first
    docs = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [(d["rank"], d["world_size"]) for d in docs] == [(0, 2), (1, 2)]
    assert docs[0]["batches"] == docs[1]["batches"] == 5  # 2,501 and 2,502 rows, batches of 600
    ranks = [np.array(d["rows"]) for d in docs]
    assert not set(ranks[0].tolist()) & set(ranks[1].tolist())
    np.testing.assert_array_equal(np.sort(np.concatenate(ranks)), np.arange(ROWS))
    assert docs[0]["world_rows"] == docs[1]["world_rows"] == ROWS
