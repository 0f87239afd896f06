"""scripts/train_sequential.py on a small synthetic event log: etl generate (schemas/events.yaml), etl preprocess with
History (pipelines/events_sequence.yaml), then the script as a user runs it; its metrics are computed, finite, and the
model ranks far better than a random ranker."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from etl.schema import load_schema
from etl.tools.synth import generate
from tests.conftest import REPO, run_etl

_spec = importlib.util.spec_from_file_location("train_sequential", REPO / "scripts/train_sequential.py")
assert _spec is not None and _spec.loader is not None
script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(script)
expected_hits = script.expected_hits


def test_expected_hits_break_ties_at_random_in_expectation() -> None:
    scores = torch.tensor([[-math.inf, -math.inf, 5.0] + [1.0] * 20, [-math.inf, -math.inf, 9.0, 3.0] + [0.0] * 19])
    hr, ndcg = expected_hits(scores, torch.tensor([3, 3]))
    # row 0: the target ties with 19 others below the top item: places 1..20 equally likely, 9 of them in the top 10
    assert hr[0].item() == pytest.approx(9 / 20)
    assert ndcg[0].item() == pytest.approx(sum(1 / math.log2(p + 2) for p in range(1, 10)) / 20)
    assert hr[1].item() == 1.0 and ndcg[1].item() == pytest.approx(1 / math.log2(3))  # second place
    hr, ndcg = expected_hits(scores, torch.tensor([1, 1]))  # unknown items are misses
    assert hr.tolist() == ndcg.tolist() == [0.0, 0.0]


def test_train_sequential_on_synthetic_events(tmp_path: Path) -> None:
    raw, out, metrics = tmp_path / "raw", tmp_path / "sequences", tmp_path / "metrics.json"
    generate(load_schema(REPO / "schemas/events.yaml"), 6_000, 2, raw, seed=0)
    run_etl("preprocess", "--pipeline", REPO / "pipelines/events_sequence.yaml", "--input", raw, "--out", out)
    cmd = [sys.executable, str(REPO / "scripts/train_sequential.py"), "--data", str(out), "--item", "item_id",
           "--history", "hist_item_id", "--epochs", "2", "--dim", "32", "--metrics-json", str(metrics)]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("rows: 6,000; training window: ")
    result = json.loads(metrics.read_text())
    assert 600 <= result["rows"] < 1_000  # the latest tenth of the rows, and the rows at the same time as its first
    m = result["metrics"]
    for ranker in ("model", "most popular", "random"):
        hr, ndcg = m[ranker]["HR@10"], m[ranker]["NDCG@10"]
        assert math.isfinite(hr) and math.isfinite(ndcg) and 0 <= ndcg <= hr <= 1
    assert m["model"]["HR@10"] > 5 * m["random"]["HR@10"]
