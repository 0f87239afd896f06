"""The guides' examples run as written: "At serving time" transforms one request with artifacts fitted on the real
Criteo sample, and its ids and values equal a plain-Python reference."""

from __future__ import annotations

import csv
import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from tests.conftest import REPO, run_etl
from tests.docs import section_blocks


def test_at_serving_time(criteo_8k: Path, tmp_path: Path, monkeypatch) -> None:
    files = sorted(criteo_8k.glob("*.csv"))
    run_etl("convert", *files, "--schema", REPO / "schemas/criteo.yaml", "--out", tmp_path / "raw")
    run_etl("fit", "--pipeline", REPO / "pipelines/criteo.yaml", "--input", tmp_path / "raw", "--artifacts",
            tmp_path / "data/processed/artifacts")  # fmt: skip
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(section_blocks("At serving time")[0], scope)
    row = scope["features"].to_pylist()
    assert len(row) == 1 and "label" not in row[0]

    counts: Counter = Counter()
    for f in files:
        with open(f, newline="") as fh:
            counts.update(int(r[14], 16) for r in csv.reader(fh, delimiter="\t") if r[14])
    kept = sorted((k for k, n in counts.items() if n >= 3), key=lambda k: (-counts[k], k))  # freq_threshold 3
    assert row[0]["C1"] == 3 + kept.index(0x68FD1E64)  # 0 pad, 1 missing, 2 the out-of-vocabulary bucket, then the vocabulary
    assert row[0]["I1"] == np.float32(math.log1p(5))
    assert all(row[0][f"I{i}"] == 0.0 for i in range(2, 14)) and all(row[0][f"C{i}"] == 1 for i in range(2, 27))


def test_following_with_online_vocabularies_runs_and_resumes(tmp_path: Path, monkeypatch) -> None:
    """The continuous-training example: its shell steps (``etl`` on the PATH), then its Python twice (a start and a
    restart from the checkpoint): the restart goes on from the saved position with the saved vocabularies."""
    heading = "Following new data"
    shell, code = section_blocks(heading, "bash")[0], section_blocks(heading)[-1]
    (tmp_path / "schemas").symlink_to(REPO / "schemas")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin/etl").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m etl "$@"\n')
    (tmp_path / "bin/etl").chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "PYTHONPATH": str(REPO)}
    subprocess.run(["bash", "-euc", shell], cwd=tmp_path, env=env, check=True, capture_output=True)
    monkeypatch.chdir(tmp_path)
    positions = []
    for _ in range(2):
        exec(code, {})
        saved = torch.load(tmp_path / "ckpt.pt")
        positions.append(saved["loader"]["follow"])
        assert set(saved["loader"]["streams"]) == {f"C{i}" for i in range(1, 27)}
    # 20 batches of 1024 rows, then 20 more: the buffer the position names moved on (4096 rows to a buffer)
    assert positions[0]["buffer_no"] == 20 * 1024 // 4096 and positions[1]["buffer_no"] == 40 * 1024 // 4096
